#pragma once
// Starts one worker: no shell (argv reaches the program verbatim), its own process group (so
// the launcher can signal the worker together with everything it started), stdout and stderr
// on pipes that the launcher reads, stdin from /dev/null.

#include <sys/types.h>

#include <string>
#include <vector>

#include "nanoddp/comm/unique_fd.h"

namespace nanoddp::run {

using comm::UniqueFd;

struct SpawnedProcess {
  pid_t pid = -1;  // also its process group id
  UniqueFd out;    // read ends, non-blocking
  UniqueFd err;
  int error = 0;  // errno when it could not be started (pid is then -1)
};

// `env` holds "NAME=value" strings: the worker's whole environment.
SpawnedProcess spawn_process(const std::string& path, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env);

}  // namespace nanoddp::run
