#pragma once
// Runs the local workers of a job: start them, relay their output, watch them end, stop the
// whole group when one fails or when the launcher is signalled, remove the shared-memory
// segments that workers killed mid-set-up left (shm_cleanup.h), and restart the group while
// restarts remain.

#include <string>

#include "options.h"

namespace nanoddp::run {

struct LaunchPlan {
  RunOptions options;
  std::string program_path;  // PROGRAM, resolved in PATH
  std::string master_addr;
  int master_port = 0;  // 0: pick a free port on master_addr for every attempt
  // The store's shared secret for this job's workers (NANODDP_STORE_TOKEN): on one node a random
  // one (after the user's token, if set), so a second job started on the same --master-port
  // cannot join this job's store (its workers are refused at the handshake) and kill it. Empty
  // on several nodes: every node's launcher would draw another; set NANODDP_STORE_TOKEN there.
  std::string store_token;
};

// Returns the launcher's exit code:
//   0        every worker of an attempt exited 0;
//   128 + S  the launcher got signal S (SIGINT, SIGTERM, SIGHUP) and stopped the workers;
//   else     the last attempt failed: the exit code of the worker that failed first (128 + S
//            when a signal ended it; 127/126 when it could not be started).
int run_launcher(const LaunchPlan& plan);

}  // namespace nanoddp::run
