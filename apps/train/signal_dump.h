#pragma once
// While one lives, SIGINT, SIGTERM and SIGHUP first run `dump`, then act as they would have (the
// process ends by that signal). `dump` runs on a thread of its own, woken through a pipe, so it
// may take locks, allocate and write files, which a signal handler may not. nanoddp-train holds
// one during its traced steps: a job stopped there (its launcher stopping the workers once
// another rank failed, a user's Ctrl-C on a hung job) leaves what each rank traced. A signal
// the process ignores (SIGHUP under nohup) is left ignored.

#include <signal.h>

#include <functional>
#include <thread>

namespace nanoddp::train {

class SignalDump {
 public:
  explicit SignalDump(std::function<void(int signal_number)> dump);
  ~SignalDump();  // the previous handlers back; a signal being dumped ends the process first
  SignalDump(const SignalDump&) = delete;
  SignalDump& operator=(const SignalDump&) = delete;

 private:
  void watch();
  void restore();  // the previous handlers
  std::function<void(int)> dump_;
  int pipe_[2] = {-1, -1};
  struct sigaction previous_[3] = {};
  bool caught_[3] = {};  // not ignored before: handled while this lives
  std::thread watcher_;
};

}  // namespace nanoddp::train
