#include "launches.h"

#include <fmt/format.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "common/cli.h"
#include "common/provenance.h"
#include "common/results_file.h"
#include "common/stats.h"

namespace nanoddp::bench_allreduce {

namespace {

namespace fs = std::filesystem;

// The job's flags: this command line without the launcher's flags and --json (each launch
// writes its own file).
std::vector<std::string> job_flags(int argc, char** argv) {
  const std::vector<std::string> dropped = {"--nproc-per-node", "--repeats", "--json"};
  std::vector<std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool drop = false;
    for (const std::string& d : dropped) {
      if (arg == d) {
        drop = true;
        ++i;  // and its value
      } else if (arg.rfind(d + "=", 0) == 0) {
        drop = true;
      }
    }
    if (!drop) flags.push_back(arg);
  }
  return flags;
}

// Runs argv (argv[0] a path) with this process's stderr; its exit code, or 128 + the signal.
// Its stdout passes through line by line without nanoddp-run's "[rank 0] " label: the table is
// rank 0's alone, and scripts written for nccl-tests split its rows on white space.
int run_child(const std::vector<std::string>& argv) {
  std::fflush(stdout);
  std::fflush(stderr);
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return 127;
  const pid_t pid = ::fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::perror(argv[0].c_str());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  const std::string label = "[rank 0] ";
  std::string pending;
  const auto put = [&](std::string line) {
    if (line.rfind(label, 0) == 0) line.erase(0, label.size());
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  };
  char chunk[4096];
  for (;;) {
    const ssize_t got = ::read(pipe_fds[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    pending.append(chunk, static_cast<std::size_t>(got));
    for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      put(pending.substr(0, nl + 1));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) put(pending);
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int run_launches(int argc, char** argv, int nproc, int repeats, const std::string& json_path) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const std::string launcher = (self.parent_path() / "nanoddp-run").string();
  if (::access(launcher.c_str(), X_OK) != 0) {
    fmt::print(stderr,
               "nanoddp-bench-allreduce: error: --nproc-per-node starts its jobs with nanoddp-run, "
               "which is not next to this executable (looked for {})\n",
               launcher);
    return 2;
  }
  common::ResultsFile json("nanoddp-bench-allreduce", "--json");
  if (!json_path.empty()) {
    if (const std::string problem = json.open(json_path); !problem.empty()) {
      return cli::usage_error("nanoddp-bench-allreduce", problem);
    }
  }
  std::string scratch = (fs::temp_directory_path() / "nanoddp-bench-allreduce.XXXXXX").string();
  if (::mkdtemp(scratch.data()) == nullptr) {
    fmt::print(stderr, "nanoddp-bench-allreduce: error: cannot create a scratch directory\n");
    return 1;
  }
  const std::vector<std::string> flags = job_flags(argc, argv);
  // What the user ran and where the results really are (each launch's own command line names a
  // scratch file deleted at the end).
  const std::string command = common::redact(common::command_line(argc, argv));
  std::string json_absolute;
  if (!json_path.empty()) {
    std::error_code ec;
    json_absolute = fs::absolute(json_path, ec).string();
  }
  // (placement, mode, bytes) -> every launch's time per op, in microseconds.
  std::map<std::tuple<std::string, std::string, std::int64_t>, std::vector<double>> times;
  int code = 0;
  for (int launch = 1; launch <= repeats && code == 0; ++launch) {
    fmt::print("# launch {} of {}: nanoddp-run --nproc-per-node {}\n", launch, repeats, nproc);
    const std::string file = fmt::format("{}/launch-{}.jsonl", scratch, launch);
    std::vector<std::string> job = {launcher, "--nproc-per-node", std::to_string(nproc),
                                    self.string()};
    job.insert(job.end(), flags.begin(), flags.end());
    job.insert(job.end(), {"--json", file});
    if (const int rc = run_child(job); rc != 0) {
      fmt::print(stderr, "nanoddp-bench-allreduce: error: launch {} of {} exited with code {}\n",
                 launch, repeats, rc);
      code = 1;
      break;
    }
    std::ifstream in(file);
    for (std::string text; std::getline(in, text);) {
      nlohmann::ordered_json line = nlohmann::ordered_json::parse(text);
      line["launch"] = launch;
      line["launches"] = repeats;
      auto& provenance = line["provenance"];
      if (!provenance.contains("worker_command")) {
        provenance["worker_command"] = provenance.value("command", "");
      }
      provenance["command"] = command;
      if (json_absolute.empty()) {
        provenance.erase("json");
      } else {
        provenance["json"] = json_absolute;
      }
      common::redact_strings(line);
      times[{line["placement"], line["mode"], line["bytes"].get<std::int64_t>()}].push_back(
          line["time_us"].get<double>());
      json.write_line(line.dump());
    }
    if (!json.flush()) code = 1;
  }
  if (code == 0 && !json.close()) code = 1;
  std::error_code ec;
  fs::remove_all(scratch, ec);
  if (code != 0) return code;
  fmt::print("# over {} launches: time per op (us), median [min, max] of the launches' medians\n",
             repeats);
  fmt::print("# {:>12} {:>14} {:>8} {:>10} {:>10} {:>10}\n", "size", "placement", "mode", "median",
             "min", "max");
  for (const auto& [key, values] : times) {
    const auto& [placement, mode, bytes] = key;
    fmt::print("  {:>12} {:>14} {:>8} {:>10.1f} {:>10.1f} {:>10.1f}\n", bytes, placement, mode,
               common::median(values), *std::min_element(values.begin(), values.end()),
               *std::max_element(values.begin(), values.end()));
  }
  return 0;
}

}  // namespace nanoddp::bench_allreduce
