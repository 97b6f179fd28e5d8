#pragma once
// Runs one program as a real multi-process job on this machine, the way a launcher would: each
// rank a separate process with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set (a free loopback port), all started together, each with a timeout.

#include <string>
#include <vector>

#include "support/subprocess.h"

namespace nanoddp::testing {

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

std::vector<ProcessResult> run_world(const std::vector<std::string>& argv, int world_size,
                                     const ProcessOptions& options = {});

// "rank 0: exit 0\n<output>\nrank 1: ..." for test failure messages.
std::string describe(const std::vector<ProcessResult>& results);

}  // namespace nanoddp::testing
