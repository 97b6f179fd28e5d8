// Embedding's gather and scatter-add (CPU twins: kernels/cpu/shape.cpp). The scatter-add is
// the one kernel of the research ops with atomics: rows of a repeated index are summed by
// atomicAdd, so their order, and the last bits of the sum, may differ between runs (as with
// PyTorch's embedding backward on CUDA unless deterministic algorithms are requested).

#include <cmath>
#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

// One thread per output element; neighbouring threads read neighbouring columns of a row.
__global__ void embedding_forward_kernel(const float* __restrict__ weight,
                                         const std::int64_t* __restrict__ indices, std::int64_t n,
                                         std::int64_t rows, std::int64_t dim,
                                         float* __restrict__ out) {
  NANODDP_GRID_STRIDE_LOOP(k, n * dim) {
    const std::int64_t i = k / dim, j = k % dim;
    const std::int64_t row = indices[i];
    out[k] = row >= 0 && row < rows ? weight[row * dim + j] : NAN;
  }
}

__global__ void scale_kernel(float* __restrict__ x, std::int64_t n, float beta) {
  NANODDP_GRID_STRIDE_LOOP(k, n) {
    x[k] = beta == 0.0f ? 0.0f : beta * x[k];
  }
}

__global__ void embedding_backward_kernel(const float* __restrict__ g,
                                          const std::int64_t* __restrict__ indices, std::int64_t n,
                                          std::int64_t rows, std::int64_t dim,
                                          float* __restrict__ grad_weight) {
  NANODDP_GRID_STRIDE_LOOP(k, n * dim) {
    const std::int64_t i = k / dim, j = k % dim;
    const std::int64_t row = indices[i];
    if (row >= 0 && row < rows) atomicAdd(grad_weight + row * dim + j, g[k]);
  }
}

}  // namespace

void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                       std::int64_t rows, std::int64_t dim, float* out, cudaStream_t stream) {
  if (n * dim <= 0) return;
  embedding_forward_kernel<<<detail::grid_for(n * dim), detail::kThreads, 0, stream>>>(
      weight, indices, n, rows, dim, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                        std::int64_t rows, std::int64_t dim, float beta, float* grad_weight,
                        cudaStream_t stream) {
  if (beta != 1.0f && rows * dim > 0) {
    scale_kernel<<<detail::grid_for(rows * dim), detail::kThreads, 0, stream>>>(grad_weight,
                                                                                rows * dim, beta);
    NANODDP_CUDA_CHECK_LAUNCH();
  }
  if (n * dim <= 0) return;
  embedding_backward_kernel<<<detail::grid_for(n * dim), detail::kThreads, 0, stream>>>(
      g, indices, n, rows, dim, grad_weight);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
