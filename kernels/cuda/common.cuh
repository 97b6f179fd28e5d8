#pragma once
// Helpers shared by the CUDA kernels: launch sizes for grid-stride loops and warp/block
// reductions. Included only from .cu files.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "nanoddp/kernels/cuda/check.h"

namespace nanoddp::kernels::cuda::detail {

// 256 threads = 8 warps per block: enough warps for the scheduler to hide memory latency,
// small enough that many blocks fit on one SM.
inline constexpr int kThreads = 256;
inline constexpr int kWarpSize = 32;

// Grid size for a grid-stride loop over n elements. A grid-stride loop lets a kernel handle any
// n with a bounded grid: each thread starts at its global index and advances by the total
// number of threads in the grid. We cap the grid at a few waves of blocks (an H200 has 132 SMs,
// each holding 8 such blocks), since more blocks would only add scheduling overhead.
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  constexpr std::int64_t kMaxBlocks = 132 * 8 * 4;
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxBlocks));
}

// A grid of one block per row (or column): gridDim.x holds at most 2^31 - 1. Beyond that the
// cast would wrap and leave rows uncomputed, silently: refused instead (32 GiB of rows of two
// floats would reach it).
inline unsigned grid_of_rows(std::int64_t rows, const char* kernel) {
  if (rows > 0x7fffffff) {
    throw ::nanoddp::CudaError(std::string(kernel) + ": " + std::to_string(rows) +
                               " rows exceed the 2^31 - 1 blocks of a CUDA grid; split the tensor");
  }
  return static_cast<unsigned>(rows);
}

// The loop itself: i visits blockIdx.x * blockDim.x + threadIdx.x, then jumps by the grid size.
// Indices are 64-bit so that buffers beyond 2^31 elements work.
#define NANODDP_GRID_STRIDE_LOOP(i, n)                                                             \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

// Sum over the 32 lanes of a warp with shuffles: at each step every lane adds the value held by
// the lane `offset` positions above it, halving the number of live partial sums (16, 8, 4, 2,
// 1). Registers are exchanged directly, with no shared memory and no __syncthreads(). After the
// loop lane 0 holds the warp's total (the other lanes hold partial sums). The order of additions
// is fixed, so the result is deterministic.
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sum over all threads of a block (blockDim.x a multiple of 32, at most 1024). Each warp reduces
// its own values with shuffles, lane 0 of each warp parks the warp's sum in shared memory, then
// the first warp reduces those (at most 32) partial sums. The total is valid in thread 0.
template <typename T>
__device__ __forceinline__ T block_reduce_sum(T value) {
  __shared__ T warp_sums[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  value = warp_reduce_sum(value);
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  value = threadIdx.x < num_warps ? warp_sums[threadIdx.x] : T(0);
  if (warp == 0) value = warp_reduce_sum(value);
  return value;
}

}  // namespace nanoddp::kernels::cuda::detail
