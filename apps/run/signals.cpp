#include "signals.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace nanoddp::run {

namespace {

bool ignored(int signo) {
  struct sigaction current {};
  return sigaction(signo, nullptr, &current) == 0 && current.sa_handler == SIG_IGN;
}

}  // namespace

SignalInbox::SignalInbox() {
  sigset_t set;
  sigemptyset(&set);
  sigemptyset(&worker_defaults_);
  for (const int signo : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGTSTP, SIGTTIN, SIGTTOU}) {
    if (signo != SIGCHLD && ignored(signo)) continue;  // ignored on entry: stays so
    sigaddset(&set, signo);
    sigaddset(&worker_defaults_, signo);
  }
  if (!ignored(SIGPIPE)) sigaddset(&worker_defaults_, SIGPIPE);
  // Blocked first: a signal from now on waits for the fd instead of acting by its default.
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, &previous_mask_); rc != 0) {
    throw std::runtime_error(std::string("pthread_sigmask failed: ") + std::strerror(rc));
  }
  fd_.reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd_) {
    const int error = errno;
    pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
    throw std::runtime_error(std::string("signalfd failed: ") + std::strerror(error));
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &previous_pipe_);
  // A worker stopped (SIGSTOP, a debugger) is not a worker that ended: no record for it.
  struct sigaction child {};
  child.sa_handler = SIG_DFL;
  child.sa_flags = SA_NOCLDSTOP;
  sigemptyset(&child.sa_mask);
  sigaction(SIGCHLD, &child, &previous_child_);
}

SignalInbox::~SignalInbox() {
  // What arrived after the last drain() is dropped, as a handler's late byte was: restoring
  // the mask with a SIGTERM pending would end the launcher by it, not by its own exit code.
  drain();
  sigaction(SIGCHLD, &previous_child_, nullptr);
  sigaction(SIGPIPE, &previous_pipe_, nullptr);
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

std::vector<int> SignalInbox::drain() {
  std::vector<int> signals;
  signalfd_siginfo records[16];
  for (;;) {
    const ssize_t n = ::read(fd_.get(), records, sizeof(records));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(signalfd_siginfo)); ++i) {
      const int signo = static_cast<int>(records[i].ssi_signo);
      if (signo == SIGTSTP || signo == SIGTTIN || signo == SIGTTOU) {
        stop_self(signo);
      } else {
        signals.push_back(signo);
      }
    }
  }
  return signals;
}

void SignalInbox::stop_self(int signo) {
  if (job_control_) job_control_(SIGSTOP);
  // The signal was read from the signalfd: raise it again, and unblock it for a moment so that
  // its default action stops the process here. The kernel discards it in an orphaned process
  // group (no shell to continue it), and then this returns at once: the workers go on too.
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signo);
  ::raise(signo);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  pthread_sigmask(SIG_BLOCK, &one, nullptr);
  if (job_control_) job_control_(SIGCONT);
}

}  // namespace nanoddp::run
