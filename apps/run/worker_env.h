#pragma once
// The environment of one worker: the launcher's own, plus torchrun's variables, so nanoddp
// binaries (nanoddp::comm::world_from_env) and torchrun-style programs find their rank.

#include <string>
#include <vector>

namespace nanoddp::run {

struct WorkerIdentity {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // the node's rank
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;  // 0 on the first attempt
  int launcher_pid = 0;   // this nanoddp-run's pid
  std::string store_token;  // NANODDP_STORE_TOKEN when non-empty (replaces an inherited one)
  // Where the worker says why it failed (common/error_file.h): NANODDP_ERROR_FILE and
  // TORCHELASTIC_ERROR_FILE when non-empty (replacing inherited ones, which name another
  // launcher's file); both removed when empty.
  std::string error_file;
};

// `base` is a null-terminated "NAME=value" array (environ). RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, NANODDP_RESTART_COUNT,
// TORCHELASTIC_RESTART_COUNT and NANODDP_LAUNCHER_PID (which nanoddp::comm::init_distributed
// uses to end the worker when the launcher dies) replace any inherited value; OMP_NUM_THREADS is
// set to 1 only when unset (as torchrun does: N workers with one OpenMP pool of all cores each
// oversubscribe).
std::vector<std::string> worker_environment(const WorkerIdentity& worker, char** base);

}  // namespace nanoddp::run
