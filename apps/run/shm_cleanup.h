#pragma once
// Removes the shared-memory segments that a job's workers left in /dev/shm.
//
// nanoddp's shared-memory all-reduce (comm/shm_allreduce.cpp) has rank 0 create
// /dev/shm/nanoddp-<its pid>-<16 hex digits> and unlink the name as soon as every rank has
// mapped it. When a rank dies in between, rank 0 waits for its report until the launcher stops
// it, and SIGTERM or SIGKILL skips the unlink: the segment (RAM, sized for the world) would stay
// until reboot. Only the launcher outlives its workers, so it removes what they left.

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace nanoddp::run {

// The pid of the process that created `name` (an entry of /dev/shm), if `name` is a segment
// of nanoddp's shared-memory all-reduce: exactly "nanoddp-<pid>-" and 16 lowercase hex digits.
std::optional<pid_t> shm_segment_creator(std::string_view name);

struct RemovedSegment {
  std::string name;  // as in /dev/shm
  pid_t creator = 0;
};

// Removes every such segment created by one of `pids`, processes that have all ended (a live
// one may still be handing its segment to its peers).
std::vector<RemovedSegment> remove_shm_segments_of(const std::set<pid_t>& pids);

}  // namespace nanoddp::run
