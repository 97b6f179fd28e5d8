#pragma once
// Starts one worker: no shell (argv reaches the program verbatim), its own process group (so
// the launcher can signal the worker together with everything it started), stdout and stderr
// on pipes that the launcher reads, stdin from /dev/null.

#include <signal.h>
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

// `env` holds "NAME=value" strings: the worker's whole environment. The worker starts with an
// empty signal mask and `defaults` at their default disposition (SignalInbox::worker_defaults:
// what the launcher changed for itself); other signals keep the disposition the launcher
// inherited.
SpawnedProcess spawn_process(const std::string& path, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const sigset_t& defaults);

}  // namespace nanoddp::run
