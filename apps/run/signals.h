#pragma once
// Signals become bytes on a pipe (the self-pipe trick), so the launcher's one poll() loop sees
// SIGINT/SIGTERM/SIGHUP (to forward to the workers) and SIGCHLD (a worker ended) next to the
// workers' output, with no work done inside a signal handler.

#include <signal.h>

#include <vector>

#include "nanoddp/comm/unique_fd.h"

namespace nanoddp::run {

using comm::UniqueFd;

class SignalPipe {
 public:
  // Installs the handlers, and ignores SIGPIPE (a closed stdout must not kill the launcher while
  // its workers run). One instance per process; the destructor restores the old dispositions.
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_end_.get(); }
  // The signals received since the last call, in order (non-blocking).
  std::vector<int> drain();

 private:
  UniqueFd read_end_;
  UniqueFd write_end_;
};

// While alive, the signals SignalPipe handles (but SIGPIPE) are blocked in this thread, so a
// thread started meanwhile (the rendezvous store's server, the heartbeat monitor) inherits them
// blocked and the kernel delivers them to the main thread only, which is where the launcher
// looks for them. (Delivered to a helper thread waiting in a system call, a SIGTERM reached the
// pipe late under ThreadSanitizer, which defers a handler to the receiving thread's next call.)
class SignalsStayOnThisThread {
 public:
  SignalsStayOnThisThread();
  ~SignalsStayOnThisThread();
  SignalsStayOnThisThread(const SignalsStayOnThisThread&) = delete;
  SignalsStayOnThisThread& operator=(const SignalsStayOnThisThread&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace nanoddp::run
