#pragma once
// SIGINT/SIGTERM/SIGHUP (to forward to the workers), SIGCHLD (a worker ended) and the stop
// signals of job control (to pass on to the workers' own process groups) arrive as
// records on a signalfd, so the launcher's one poll() loop sees them next to the workers'
// output, and no code runs inside a signal handler.
//
// Why a signalfd and not a handler (the self-pipe trick this replaced): a handled signal goes to
// whichever thread does not block it, and ThreadSanitizer defers a handler until the receiving
// thread's next intercepted call. CI saw a SIGTERM sent to a launcher waiting for its round never
// reach the pipe (the launcher waited 60 s and more). Blocked in every thread, a signal stays
// pending on the process until the main loop reads it: there is no thread to lose it in.

#include <signal.h>

#include <functional>
#include <vector>

#include "nanoddp/comm/unique_fd.h"

namespace nanoddp::run {

using comm::UniqueFd;

class SignalInbox {
 public:
  // Blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD in the calling thread (threads started later inherit
  // the mask; start none before this) and opens a signalfd for them; ignores SIGPIPE (a closed
  // stdout must not kill the launcher while its workers run). One instance per process; the
  // destructor discards what is unread and restores the old mask and SIGPIPE's disposition.
  //
  // A signal ignored when the launcher started stays ignored, in it and in its workers, as
  // shells and Python do: `nohup nanoddp-run ...` survives the terminal's hang-up, a job started
  // with `&` from a script is not ended by the script's Ctrl-C. (A blocked signal is read from
  // the signalfd even when its disposition is SIG_IGN, so such a signal is left out of the set.)
  SignalInbox();
  ~SignalInbox();
  SignalInbox(const SignalInbox&) = delete;
  SignalInbox& operator=(const SignalInbox&) = delete;

  int fd() const { return fd_.get(); }
  // The signals received since the last call, in order (non-blocking). Like any signal, one
  // sent again before it is read arrives once.
  //
  // A stop signal (SIGTSTP from Ctrl-Z, or SIGTTIN/SIGTTOU sent to it) is not returned: drain()
  // stops the workers through the job-control callback (SIGSTOP), stops the launcher itself by
  // that signal's default action, and once continued (`fg`, `bg`, SIGCONT) continues them
  // (SIGCONT). The workers run in process groups of their own, which a terminal's Ctrl-Z does
  // not reach: stopping the launcher alone left them running until its pipes filled, and a long
  // stop ended the job by their timeouts.
  std::vector<int> drain();

  // Called with SIGSTOP before the launcher stops, with SIGCONT after it is continued; nullptr
  // (no workers running) stops the launcher alone.
  void set_job_control(std::function<void(int signo)> workers) {
    job_control_ = std::move(workers);
  }

  // The signals a worker must get back at their default disposition (posix_spawn's
  // POSIX_SPAWN_SETSIGDEF): those this launcher handles, and SIGPIPE unless it was ignored on
  // entry. Signals ignored on entry are not in it, so workers inherit them ignored.
  const sigset_t& worker_defaults() const { return worker_defaults_; }

 private:
  void stop_self(int signo);

  UniqueFd fd_;
  std::function<void(int)> job_control_;
  sigset_t previous_mask_;
  sigset_t worker_defaults_;
  struct sigaction previous_pipe_ {};
  struct sigaction previous_child_ {};
};

}  // namespace nanoddp::run
