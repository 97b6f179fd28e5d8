#include "launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>

extern char** environ;

namespace nanoddp::bench_ddp {

namespace {

using Clock = std::chrono::steady_clock;

// Polls for the child's end until `deadline`; true (and `status` set) when it ended.
bool wait_until(pid_t pid, Clock::time_point deadline, int& status) {
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return true;
    if (done < 0 && errno != EINTR) {
      status = 0;
      return true;  // not our child any more: nothing to wait for
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       ::strsignal(WTERMSIG(status)));
  }
  return fmt::format("ended with status {:#x}", status);
}

}  // namespace

JobOutcome run_job(const std::vector<std::string>& argv, const std::string& log_path,
                   std::chrono::duration<double> timeout) {
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int err =
      ::posix_spawn(&pid, argv.front().c_str(), &actions, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return {.ok = false,
            .problem = fmt::format("could not start {}: {}", argv.front(), std::strerror(err))};
  }

  const auto start = Clock::now();
  int status = 0;
  if (wait_until(pid, start + std::chrono::duration_cast<Clock::duration>(timeout), status)) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {.ok = true, .problem = {}};
    return {.ok = false, .problem = fmt::format("nanoddp-run {}", describe_status(status))};
  }
  ::kill(pid, SIGTERM);
  if (!wait_until(pid, Clock::now() + std::chrono::seconds(30), status)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  return {.ok = false,
          .problem =
              fmt::format("timed out after {:.0f} s (--timeout) and was stopped", timeout.count())};
}

std::string tail_of_file(const std::string& path, std::size_t lines, const std::string& indent) {
  std::ifstream in(path);
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& l : last) out += indent + l + "\n";
  return out;
}

}  // namespace nanoddp::bench_ddp
