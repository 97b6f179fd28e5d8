#pragma once
// A program under test starts as from a login shell: every signal at its default disposition
// and none blocked, whatever the test runner inherited (nohup ignores SIGHUP, a script's `&`
// ignores SIGINT, a runner may block signals in its threads). Otherwise the launcher's signal
// tests would test the CI's set-up: nanoddp-run keeps a signal ignored on entry ignored.
// Called between fork() and exec(): async-signal-safe calls only.

#include <signal.h>

namespace nanoddp::testing {

inline void default_signals_for_exec() {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int signo = 1; signo < 32; ++signo) {
    if (signo != SIGKILL && signo != SIGSTOP) sigaction(signo, &action, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace nanoddp::testing
