#pragma once
// A program under test that runs in the background, so a test can wait for something it prints,
// send it a signal, and then wait for it to end (with a timeout: a test never hangs). Output is
// stdout and stderr together, as run_process() collects it.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/default_signals.h"
#include "support/process_snapshot.h"

namespace nanoddp::testing {

class BackgroundProcess {
 public:
  explicit BackgroundProcess(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      setpgid(0, 0);  // so that the destructor can kill it with everything it started
      default_signals_for_exec();
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~BackgroundProcess() {
    if (!status_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }
  void send(int signo) const { kill(pid_, signo); }

  // Reads output until `done(output)` holds (true) or the timeout passes (false).
  bool wait_for_output(const std::function<bool(const std::string&)>& done,
                       std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done(output_)) {
      if (!read_some(deadline)) return done(output_);
    }
    return true;
  }

  // Waits for the end, reading its output meanwhile: the wait status, or nullopt after the
  // timeout, when the output ends with a snapshot of where the program's threads were. The exit
  // is looked for while reading, so a descendant that keeps the output pipe open cannot hide it.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    return wait_for_exit(timeout, true);
  }

  // As wait(), but still running after the timeout is an expected answer, not a test giving up:
  // no snapshot (taking one stops the caller for seconds). For loops that poll, and for checks
  // that the program is still running.
  std::optional<int> poll_exit(std::chrono::milliseconds timeout) {
    return wait_for_exit(timeout, false);
  }

 private:
  std::optional<int> wait_for_exit(std::chrono::milliseconds timeout, bool snapshot_if_running) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        break;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        if (snapshot_if_running) output_.append("\n").append(snapshot_process_group(pid_));
        return std::nullopt;
      }
      if (!read_some(std::min(deadline, now + 50ms))) usleep(10000);
    }
    // What it wrote before it ended (a second at most: a descendant may hold the pipe).
    const auto drained = std::chrono::steady_clock::now() + 1s;
    while (read_some(drained)) {
    }
    return status_;
  }

  // One read (up to the deadline); false at end of file or when the deadline passed.
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    if (fd_ < 0) return false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{fd_, POLLIN, 0};
      const int ready = poll(&pfd, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      char buffer[4096];
      const ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fd_);
        fd_ = -1;
        return false;
      }
      output_.append(buffer, static_cast<std::size_t>(n));
      return true;
    }
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
  std::optional<int> status_;
};

}  // namespace nanoddp::testing
