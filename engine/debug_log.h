#pragma once
// NANODDP_DEBUG: what a job is doing, line by line, on stderr — for the day it hangs or fails
// and the error alone does not say why (what NCCL_DEBUG and TORCH_DISTRIBUTED_DEBUG are for
// NCCL and PyTorch).
//
//   NANODDP_DEBUG unset, 0, OFF   nothing (the default; a disabled check costs one load)
//   NANODDP_DEBUG=INFO (or 1)     set-up and rare events: rendezvous, the process group and its
//                                 transport, the bucket layout, checkpoints
//   NANODDP_DEBUG=DETAIL (or 2)   also every collective (issued, started, finished, with its
//                                 sequence number, size and duration) and every bucket launch
//
// Each line is written whole with one write(2), so ranks sharing a terminal never interleave
// inside a line:
//   [nanoddp rank 1 +0.412s] gloo allreduce #7 (avg, 262144 x float32) finished in 1.21 ms

#include <fmt/format.h>

#include <string>

namespace nanoddp {

enum class DebugLevel : int { kOff = 0, kInfo = 1, kDetail = 2 };

// The level from NANODDP_DEBUG, read once. A value it does not understand is reported once on
// stderr and taken as INFO (asking for debug output and getting none would be worse).
DebugLevel debug_level();
inline bool debug_enabled(DebugLevel level) {
  return static_cast<int>(debug_level()) >= static_cast<int>(level);
}

// The rank printed in each line: RANK from the environment until the process group sets it.
void set_debug_rank(int rank);

// Writes one line (the prefix is added) if `level` is enabled.
void debug_write(DebugLevel level, const std::string& message);

template <typename... Args>
void debug_log(DebugLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!debug_enabled(level)) return;  // no formatting when off
  debug_write(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nanoddp
