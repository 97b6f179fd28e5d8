// Shape and reduction kernels of the research ops (CPU twins: kernels/cpu/shape.cpp). Tensors
// are seen as [outer, d, inner]. No atomics: every output element is written by one thread (or
// reduced by one block in a fixed order), so results are the same bits on every run.

#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

// One block per output element j: the block's threads stride over the outer * inner terms.
__global__ void sum_to_kernel(const float* __restrict__ x, std::int64_t outer, std::int64_t mid,
                              std::int64_t inner, float beta, float* __restrict__ out) {
  const std::int64_t j = blockIdx.x;
  double acc = 0.0;
  for (std::int64_t k = threadIdx.x; k < outer * inner; k += blockDim.x) {
    const std::int64_t o = k / inner, i = k % inner;
    acc += x[(o * mid + j) * inner + i];
  }
  acc = detail::block_reduce_sum(acc);
  if (threadIdx.x == 0) {
    out[j] = beta == 0.0f ? static_cast<float>(acc) : beta * out[j] + static_cast<float>(acc);
  }
}

// One thread per (o, i); neighbouring threads read neighbouring i, so loads coalesce when
// inner is large, and d is short when inner is 1 (a row sum of a small matrix).
__global__ void sum_dim_kernel(const float* __restrict__ x, std::int64_t outer, std::int64_t d,
                               std::int64_t inner, float alpha, float* __restrict__ out) {
  NANODDP_GRID_STRIDE_LOOP(k, outer * inner) {
    const std::int64_t o = k / inner, i = k % inner;
    double acc = 0.0;
    for (std::int64_t j = 0; j < d; ++j) acc += x[(o * d + j) * inner + i];
    out[k] = static_cast<float>(alpha * acc);
  }
}

__global__ void expand_dim_kernel(const float* __restrict__ x, std::int64_t outer, std::int64_t d,
                                  std::int64_t inner, float alpha, float beta,
                                  float* __restrict__ out) {
  NANODDP_GRID_STRIDE_LOOP(k, outer * d * inner) {
    const std::int64_t i = k % inner, o = k / (d * inner);
    const float v = alpha * x[o * inner + i];
    out[k] = beta == 0.0f ? v : beta * out[k] + v;
  }
}

__global__ void max_dim_kernel(const float* __restrict__ x, std::int64_t outer, std::int64_t d,
                               std::int64_t inner, float* __restrict__ values,
                               std::int64_t* __restrict__ indices) {
  NANODDP_GRID_STRIDE_LOOP(k, outer * inner) {
    const std::int64_t o = k / inner, i = k % inner;
    float best = x[o * d * inner + i];
    std::int64_t arg = 0;
    for (std::int64_t j = 1; j < d && !isnan(best); ++j) {
      const float v = x[(o * d + j) * inner + i];
      if (v > best || isnan(v)) {
        best = v;
        arg = j;
      }
    }
    values[k] = best;
    indices[k] = arg;
  }
}

__global__ void index_backward_kernel(const float* __restrict__ g,
                                      const std::int64_t* __restrict__ indices, std::int64_t outer,
                                      std::int64_t d, std::int64_t inner, float beta,
                                      float* __restrict__ out) {
  NANODDP_GRID_STRIDE_LOOP(k, outer * d * inner) {
    const std::int64_t i = k % inner, j = (k / inner) % d, o = k / (d * inner);
    const float v = indices[o * inner + i] == j ? g[o * inner + i] : 0.0f;
    out[k] = beta == 0.0f ? v : beta * out[k] + v;
  }
}

__global__ void copy_block_kernel(const float* __restrict__ src, std::int64_t src_d,
                                  std::int64_t src_start, float* __restrict__ dst,
                                  std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer,
                                  std::int64_t run, std::int64_t inner, float beta) {
  NANODDP_GRID_STRIDE_LOOP(k, outer * run) {
    const std::int64_t o = k / run, r = k % run;
    const float v = src[(o * src_d + src_start) * inner + r];
    float& t = dst[(o * dst_d + dst_start) * inner + r];
    t = beta == 0.0f ? v : beta * t + v;
  }
}

// Writes are coalesced (consecutive k are consecutive output elements); reads stride by cols.
// A tiled shared-memory transpose would coalesce both; MLPs transpose rarely.
__global__ void transpose_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                 float beta, float* __restrict__ out) {
  NANODDP_GRID_STRIDE_LOOP(k, rows * cols) {
    const std::int64_t c = k / rows, r = k % rows;
    const float v = x[r * cols + c];
    out[k] = beta == 0.0f ? v : beta * out[k] + v;
  }
}

}  // namespace

void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner, float beta,
            float* out, cudaStream_t stream) {
  if (mid <= 0) return;
  sum_to_kernel<<<detail::grid_of_rows(mid, "sum_to"), detail::kThreads, 0, stream>>>(
      x, outer, mid, inner, beta, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
             float* out, cudaStream_t stream) {
  if (outer * inner <= 0) return;
  sum_dim_kernel<<<detail::grid_for(outer * inner), detail::kThreads, 0, stream>>>(
      x, outer, d, inner, alpha, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
                float beta, float* out, cudaStream_t stream) {
  const std::int64_t n = outer * d * inner;
  if (n <= 0) return;
  expand_dim_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, outer, d, inner, alpha,
                                                                          beta, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float* values,
             std::int64_t* indices, cudaStream_t stream) {
  if (outer * inner <= 0) return;
  max_dim_kernel<<<detail::grid_for(outer * inner), detail::kThreads, 0, stream>>>(
      x, outer, d, inner, values, indices);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer, std::int64_t d,
                    std::int64_t inner, float beta, float* out, cudaStream_t stream) {
  const std::int64_t n = outer * d * inner;
  if (n <= 0) return;
  index_backward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(g, indices, outer, d,
                                                                              inner, beta, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer, std::int64_t len,
                std::int64_t inner, float beta, cudaStream_t stream) {
  const std::int64_t n = outer * len * inner;
  if (n <= 0) return;
  copy_block_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      src, src_d, src_start, dst, dst_d, dst_start, outer, len * inner, inner, beta);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out,
               cudaStream_t stream) {
  if (rows * cols <= 0) return;
  transpose_kernel<<<detail::grid_for(rows * cols), detail::kThreads, 0, stream>>>(x, rows, cols,
                                                                                   beta, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
