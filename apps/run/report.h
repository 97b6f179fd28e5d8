#pragma once
// How a worker ended, in words, and the table the launcher prints after a failed attempt.

#include <sys/types.h>

#include <string>
#include <vector>

namespace nanoddp::run {

// What the launcher knows about one worker at the end of an attempt.
struct WorkerResult {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;                    // -1: it could not be started
  int wait_status = 0;               // from waitpid, when started
  int spawn_error = 0;               // errno from posix_spawn, when not started
  bool stopped_by_launcher = false;  // still running when the launcher began stopping the group
  bool failed_first = false;
  std::string message;  // why it failed, from its error file (common/error_file.h), if any
  std::string cause;    // "because rank 0 failed", when its error file says so
};

// "SIGKILL", "SIGSEGV", ...; "signal N" for one without a common name.
std::string signal_name(int signo);
// "exit code 3", "killed by SIGKILL", "could not start: No such file or directory".
std::string describe(const WorkerResult& result);
// 0 for success; the exit code; 128 + signal for a worker ended by a signal (as shells report
// it); 127 (ENOENT) or 126 (other errors) for a worker that could not be started.
int exit_code_of(const WorkerResult& result);
// Rows of rank, local rank, pid and result, one per worker, ordered by rank.
std::string result_table(const std::vector<WorkerResult>& results);

}  // namespace nanoddp::run
