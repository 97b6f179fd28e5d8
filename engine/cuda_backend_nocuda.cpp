// The CUDA backend and raw device memory for a build without CUDA: every entry point explains
// that this build has no CUDA path (via require_device's message).

#include "nanoddp/engine/cuda/cuda_backend.h"
#include "nanoddp/engine/cuda/cuda_memory.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {

Backend& cuda_backend(int index) {
  require_device(Device::cuda(index));  // always throws here
  fail("unreachable: cuda_backend({}) without CUDA", index);
}

void* cuda_raw_allocate(std::size_t nbytes) {
  fail("cannot allocate {} bytes of CUDA memory: {}", nbytes, cuda_status());
}

void cuda_raw_free(void* /*ptr*/) {
  fail("cannot free CUDA memory: {}", cuda_status());
}

}  // namespace nanoddp
