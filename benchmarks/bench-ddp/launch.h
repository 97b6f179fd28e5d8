#pragma once
// Runs one point's job (nanoddp-run and its workers) as a child process with a deadline, its
// output going to a log file that the driver shows only when the job fails.

#include <chrono>
#include <string>
#include <vector>

namespace nanoddp::bench_ddp {

struct JobOutcome {
  bool ok = false;
  std::string problem;  // when !ok: "exited with code 3", "killed by signal 9", "timed out ..."
};

// Starts argv[0] (a path) with argv, stdin from /dev/null, stdout and stderr into `log_path`,
// and waits. After `timeout` it sends SIGTERM (nanoddp-run passes it on to every worker and
// kills them after its grace period), then SIGKILL if the job is still there 30 s later.
JobOutcome run_job(const std::vector<std::string>& argv, const std::string& log_path,
                   std::chrono::duration<double> timeout);

// The last `lines` lines of a text file, each prefixed with `indent`.
std::string tail_of_file(const std::string& path, std::size_t lines, const std::string& indent);

}  // namespace nanoddp::bench_ddp
