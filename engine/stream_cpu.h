#pragma once
// Internal to the Stream/Event sources (stream_cuda.cpp and stream_nocuda.cpp): the CPU side of
// streams and events, shared by both builds. On the CPU a stream is the calling thread, so an
// event is a timestamp taken when it is recorded; waiting on it has nothing to wait for.

#include <chrono>

#include "nanoddp/engine/device.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::detail {

inline std::chrono::steady_clock::time_point cpu_event_now() {
  return std::chrono::steady_clock::now();
}

inline double cpu_elapsed_ms(std::chrono::steady_clock::time_point earlier,
                             std::chrono::steady_clock::time_point later) {
  return std::chrono::duration<double, std::milli>(later - earlier).count();
}

inline std::string device_name(Device device) {
  return device.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(device.index);
}

}  // namespace nanoddp::detail
