#include "signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace nanoddp::run {

namespace {

volatile sig_atomic_t g_write_fd = -1;
struct sigaction g_previous[NSIG];
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};

void on_signal(int signo) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  // Non-blocking: if the pipe is full, enough wake-ups are already queued.
  [[maybe_unused]] const ssize_t n = ::write(g_write_fd, &byte, 1);
  errno = saved_errno;
}

}  // namespace

SignalPipe::SignalPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe2 failed");
  read_end_.reset(fds[0]);
  write_end_.reset(fds[1]);
  g_write_fd = fds[1];
  for (const int signo : kHandled) {
    struct sigaction action {};
    action.sa_handler = signo == SIGPIPE ? SIG_IGN : on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = signo == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : SA_RESTART;
    sigaction(signo, &action, &g_previous[signo]);
  }
}

SignalPipe::~SignalPipe() {
  for (const int signo : kHandled) sigaction(signo, &g_previous[signo], nullptr);
  g_write_fd = -1;
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  for (;;) {
    const ssize_t n = ::read(read_end_.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) signals.push_back(buffer[i]);
  }
  return signals;
}

SignalsStayOnThisThread::SignalsStayOnThisThread() {
  sigset_t blocked;
  sigemptyset(&blocked);
  for (const int signo : kHandled) {
    if (signo != SIGPIPE) sigaddset(&blocked, signo);
  }
  pthread_sigmask(SIG_BLOCK, &blocked, &previous_);
}

SignalsStayOnThisThread::~SignalsStayOnThisThread() {
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

}  // namespace nanoddp::run
