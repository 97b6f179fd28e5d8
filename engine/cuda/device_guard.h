#pragma once
// Internal to the CUDA engine sources: makes a device current for a scope and, where that is
// safe, restores the previous one afterwards. CUDA's "current device" is per host thread;
// kernels, streams, events and allocations always belong to the current device, so every entry
// point that touches a specific device goes through this guard. Switching only when needed keeps
// the common case (one device per process) at one cheap cudaGetDevice call.
//
// A fresh thread's current device is 0 without a context behind it (cudaGetDevice creates
// none). Restoring it with cudaSetDevice would create one: every rank with LOCAL_RANK >= 1 would
// open a context on GPU 0 (0.3-0.5 GiB each) from its first guarded call on a new thread. So,
// like PyTorch's MaybeExchangeDevice, the guard restores the previous device only when that
// device's primary context is active; otherwise the thread stays on the guarded device.

#include <cuda_runtime.h>

#include "nanoddp/kernels/cuda/check.h"

namespace nanoddp::detail {

// True when CUDA device `index`'s primary context exists (cuDevicePrimaryCtxGetState, reached
// through the runtime so that nothing links libcuda directly). If the driver cannot be asked,
// true: the guard then restores as before.
bool cuda_primary_context_active(int index);

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index) {
    NANODDP_CUDA_CHECK(cudaGetDevice(&previous_));
    switched_ = previous_ != index;
    if (switched_) NANODDP_CUDA_CHECK(cudaSetDevice(index));
  }
  ~CudaDeviceGuard() {
    // A destructor must not throw; restoring the device the caller had cannot fail in practice.
    if (switched_ && cuda_primary_context_active(previous_)) (void)cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace nanoddp::detail
