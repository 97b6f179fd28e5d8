#pragma once
// nanoddp-run's command line: the flags (torchrun's names) and PROGRAM [ARGS...].

#include <optional>
#include <string>
#include <vector>

namespace nanoddp::run {

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;     // --nnodes N, or MAX of --nnodes MIN:MAX
  int min_nodes = 1;  // MIN of --nnodes MIN:MAX (= nnodes for --nnodes N)
  int node_rank = 0;
  std::string master_addr;  // empty: 127.0.0.1 on one node (required on several)
  int master_port = 0;      // 0: a free port on one node (required on several)
  int max_restarts = 0;
  std::string log_dir;  // empty: no per-rank log files
  double grace_period_s = 10.0;
  // Elastic rounds (elastic.h): set by --rdzv-endpoint. Empty: the static launch of --node-rank.
  std::string rdzv_endpoint;  // HOST:PORT of the launchers' store
  std::string rdzv_id = "nanoddp";
  double heartbeat_timeout_s = 10.0;
  double join_timeout_s = 600.0;
  double last_call_s = 3.0;
  std::vector<std::string> command;  // PROGRAM and its arguments, verbatim
};

// nullopt when the launcher should exit with `exit_code`: 0 after --help, 2 for a bad or
// missing flag, a flag combination that cannot work, or a missing PROGRAM. The message (on
// stderr) names the flag.
std::optional<RunOptions> parse_options(int argc, char** argv, int& exit_code);

}  // namespace nanoddp::run
