#pragma once
// Small helpers that several of the trainer's files share (trainer*.cpp).

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "common/output_files.h"
#include "nanoddp/engine/tensor.h"

namespace nanoddp::train {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

inline double ms_since(Clock::time_point start) {
  return ms_between(start, Clock::now());
}

// How many elements of `t` are NaN or Inf: one pass over the buffer on its device, at memory
// speed (a scalar std::isfinite loop over a 16 MiB gradient cost more than the optimizer step).
std::int64_t count_nonfinite(const Tensor& t);

// "" when `recorded` (the model a file was saved from) computes what `current` does; otherwise
// every setting that differs, with the flag that sets it.
std::string model_difference(const std::string& recorded, const std::string& current);

// What a rank loaded from `path`, for comparing with the other ranks: its size and a checksum of
// its bytes, or why it could not be read (so that the rank takes part in the comparison and
// every rank fails together instead of one failing alone and the others waiting).
std::string file_fingerprint(const std::string& path);

// --trace T: where rank R writes what it traced when the run stops inside its traced steps
// (T.rankR.partial.json), and the removal of such writes' leftovers from killed writers.
std::string partial_trace_path(const std::string& trace_path, int rank);
void remove_stale_partial_traces(const std::string& trace_path);

}  // namespace nanoddp::train
