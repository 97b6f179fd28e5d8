// Counter-based random fills with Philox4x32-10 (kernels/philox.h). Element i is a pure
// function of (seed, stream, offset + i), so each GPU thread computes its elements independently,
// with no generator state to carry between threads or launches, and the bits equal the CPU
// twin's for the same (seed, stream, offset).

#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"
#include "nanoddp/kernels/philox.h"

namespace nanoddp::kernels::cuda {
namespace {

__global__ void fill_uniform_kernel(float* __restrict__ out, std::int64_t n, std::uint64_t seed,
                                    std::uint64_t stream_id, std::uint64_t offset, float lo,
                                    float hi) {
  const float range = hi - lo;
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    const Philox4 r = philox4x32_10(offset + static_cast<std::uint64_t>(i), stream_id, seed);
    const float u = uniform_from_bits(r.v[0]);
    // One explicit fused multiply-add, exactly like the CPU twin's std::fma: left alone, nvcc
    // would fuse lo + range * u while a CPU compiler may or may not, and the bits would differ.
    out[i] = fmaf(range, u, lo);
  }
}

__global__ void fill_normal_kernel(float* __restrict__ out, std::int64_t n, std::uint64_t seed,
                                   std::uint64_t stream_id, std::uint64_t offset, float mean,
                                   float stddev) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    const Philox4 r = philox4x32_10(offset + static_cast<std::uint64_t>(i), stream_id, seed);
    // Box-Muller with philox.h's polynomial log and cosine, not logf/cosf: those differ from the
    // C library's in the last bit, and the data must be the CPU's to the bit.
    out[i] = fmaf(stddev, normal_from_bits(r.v[0], r.v[1]), mean);  // as the CPU twin's std::fma
  }
}

}  // namespace

void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                  std::uint64_t offset, float lo, float hi, cudaStream_t stream) {
  if (n <= 0) return;
  fill_uniform_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(out, n, seed, stream_id,
                                                                            offset, lo, hi);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                 std::uint64_t offset, float mean, float stddev, cudaStream_t stream) {
  if (n <= 0) return;
  fill_normal_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(out, n, seed, stream_id,
                                                                           offset, mean, stddev);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
