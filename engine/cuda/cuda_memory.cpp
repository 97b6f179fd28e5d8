// Raw device memory for the CUDA caching allocator. cudaMalloc is slow and synchronizes the
// device, which is why the caching allocator calls it only on a cache miss.

#include "nanoddp/engine/cuda/cuda_memory.h"

#include <cuda_runtime.h>

#include <string>

#include "nanoddp/kernels/error.h"
#include "nanoddp/kernels/cuda/check.h"

namespace nanoddp {

void* cuda_raw_allocate(std::size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, nbytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    // Say how much was asked for and how much there is: that is what one needs to act on an
    // out-of-memory error (smaller batch, fewer buckets, empty_cache()).
    int device = -1;
    std::size_t free_bytes = 0, total_bytes = 0;
    (void)cudaGetDevice(&device);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    constexpr double kMiB = 1024.0 * 1024.0;
    const std::string call = fmt::format(
        "cudaMalloc of {} bytes ({:.1f} MiB) on cuda:{} ({:.1f} MiB free of {:.1f} MiB)", nbytes,
        static_cast<double>(nbytes) / kMiB, device, static_cast<double>(free_bytes) / kMiB,
        static_cast<double>(total_bytes) / kMiB);
    kernels::cuda::throw_cuda_error(call.c_str(), err, __FILE__, __LINE__);
  }
  return ptr;
}

void cuda_raw_free(void* ptr) {
  if (ptr == nullptr) return;
  NANODDP_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace nanoddp
