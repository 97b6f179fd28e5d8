#pragma once
// Internal to the CUDA engine sources: makes a device current for a scope and restores the
// previous one afterwards. CUDA's "current device" is per host thread; kernels, streams, events
// and allocations always belong to the current device, so every entry point that touches a
// specific device goes through this guard. Switching only when needed keeps the common case (one
// device per process) at one cheap cudaGetDevice call.

#include <cuda_runtime.h>

#include "nanoddp/kernels/cuda/check.h"

namespace nanoddp::detail {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index) {
    NANODDP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) NANODDP_CUDA_CHECK(cudaSetDevice(index));
    switched_ = previous_ != index;
  }
  ~CudaDeviceGuard() {
    // A destructor must not throw; restoring the device the caller had cannot fail in practice.
    if (switched_) (void)cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace nanoddp::detail
