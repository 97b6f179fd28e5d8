#include "signal_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace nanoddp::train {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
// The handler's only work, async-signal-safe: which signal, and a byte that wakes the watcher.
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_wake_fd = -1;

void on_signal(int signal_number) {
  if (g_signal == 0) g_signal = signal_number;
  const int saved = errno;
  const char byte = 's';
  [[maybe_unused]] const ssize_t n = ::write(g_wake_fd, &byte, 1);
  errno = saved;
}

}  // namespace

SignalDump::SignalDump(std::function<void(int)> dump) : dump_(std::move(dump)) {
  if (::pipe2(pipe_, O_CLOEXEC) != 0) throw std::runtime_error("SignalDump: pipe2 failed");
  g_signal = 0;
  g_wake_fd = pipe_[1];
  watcher_ = std::thread([this] { watch(); });
  struct sigaction act {};
  act.sa_handler = on_signal;
  act.sa_flags = SA_RESTART;  // the other threads' blocking calls go on; poll() loops see EINTR
  sigemptyset(&act.sa_mask);
  for (int i = 0; i < 3; ++i) {
    ::sigaction(kSignals[i], nullptr, &previous_[i]);
    caught_[i] = previous_[i].sa_handler != SIG_IGN;
    if (caught_[i]) ::sigaction(kSignals[i], &act, nullptr);
  }
}

SignalDump::~SignalDump() {
  // Signals act as before from here on; one that came just before is dumped, and then ends the
  // process (the join waits for that).
  restore();
  const char quit = 'q';
  [[maybe_unused]] const ssize_t n = ::write(pipe_[1], &quit, 1);
  watcher_.join();
  g_wake_fd = -1;
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

void SignalDump::restore() {
  for (int i = 0; i < 3; ++i) {
    if (caught_[i]) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
}

void SignalDump::watch() {
  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(pipe_[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1 || byte == 'q') return;
    const int signal_number = g_signal;
    dump_(signal_number);
    // As it would have acted: the previous handler (the default: the process ends by it).
    restore();
    ::raise(signal_number);
    return;  // a previous handler that let the process live: nothing more to watch
  }
}

}  // namespace nanoddp::train
