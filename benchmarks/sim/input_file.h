#pragma once
// nanoddp-sim's input files (traces, nanoddp-bench-allreduce's JSON lines), read whole. Only a
// regular file is read: a FIFO would block the simulator for ever and /dev/zero never end (an
// outside tester's /dev/zero grew to 7.5 GB in 10 s); and one larger than kMaxInputBytes is
// refused before it is read (parsed JSON takes several times its text).

#include <cstdint>
#include <string>

namespace nanoddp::sim {

// A trace of about a million steps; the simulator needs a few of them.
inline constexpr std::uint64_t kMaxInputBytes = std::uint64_t{1} << 30;

// The file's bytes. Throws SimError naming `flag` and the path: missing, not a regular file,
// larger than `max_bytes`, or a read that fails.
std::string read_input_file(const std::string& flag, const std::string& path,
                            std::uint64_t max_bytes = kMaxInputBytes);

}  // namespace nanoddp::sim
