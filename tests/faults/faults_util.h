#pragma once
// Helpers of the fault tests: real nanoddp-train ranks in the background (so a test can kill,
// stop or starve one while the others train), the worker pids of a launcher, wait statuses.

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/background_process.h"
#include "support/subprocess.h"
#include "support/world.h"

namespace nanoddp::testing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// nanoddp-train with a small model (fast steps) and `extra` flags, which replace the defaults
// of the same name (CLI11 refuses a flag given twice).
inline std::vector<std::string> train_argv(const std::vector<std::string>& extra) {
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"--in", "8"},     {"--out", "4"},   {"--hidden", "16"},
      {"--layers", "2"}, {"--batch", "8"}, {"--dataset-size", "4096"}};
  std::vector<std::string> argv = {bin_path("nanoddp-train")};
  for (const auto& [flag, value] : defaults) {
    if (std::find(extra.begin(), extra.end(), flag) != extra.end()) continue;
    argv.push_back(flag);
    argv.push_back(value);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// `argv` run so that it exits a second later than it would on rank `rank` (RANK): the other ranks
// then always exit first, which is what the launcher's naming of the rank that failed first must
// see through.
inline std::vector<std::string> exits_last(int rank, const std::vector<std::string>& argv) {
  std::vector<std::string> out = {
      "/bin/sh", "-c",
      "\"$0\" \"$@\"; rc=$?; [ \"$RANK\" = " + std::to_string(rank) + " ] && sleep 1; exit $rc"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// `argv` under /usr/bin/env with `env` added: BackgroundProcess inherits the test's environment.
inline std::vector<std::string> with_env(const std::map<std::string, std::string>& env,
                                         const std::vector<std::string>& argv) {
  std::vector<std::string> out = {"/usr/bin/env"};
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// W ranks of one job, each a background process with torchrun's variables, started together.
inline std::vector<std::unique_ptr<BackgroundProcess>> start_ranks(
    const std::vector<std::string>& argv, int world, std::map<std::string, std::string> env = {}) {
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<BackgroundProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> e = env;
    e["RANK"] = std::to_string(r);
    e["WORLD_SIZE"] = std::to_string(world);
    e["LOCAL_RANK"] = std::to_string(r);
    e["LOCAL_WORLD_SIZE"] = std::to_string(world);
    e["MASTER_ADDR"] = "127.0.0.1";
    e["MASTER_PORT"] = port;
    ranks.push_back(std::make_unique<BackgroundProcess>(with_env(e, argv)));
  }
  return ranks;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string status_text(const std::optional<int>& status) {
  if (!status) return "still running";
  if (WIFSIGNALED(*status)) return "killed by signal " + std::to_string(WTERMSIG(*status));
  return "exit " + std::to_string(WEXITSTATUS(*status));
}

inline bool exited_with(const std::optional<int>& status, int code) {
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == code;
}

// Direct children of `parent` (from /proc/<pid>/stat), e.g. a launcher's workers.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may contain spaces, so parse after the last ')'.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  closedir(dir);
  return out;
}

// The command line of a process (NUL-separated in /proc, joined by spaces here).
inline std::string cmdline_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : text) {
    if (c == '\0') c = ' ';
  }
  return text;
}

// The value of one variable in a process's environment ("" if absent).
inline std::string environ_of(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (entry.starts_with(key + "=")) return entry.substr(key.size() + 1);
  }
  return "";
}

}  // namespace nanoddp::testing
