// Row-wise kernels of the research ops (CPU twins: kernels/cpu/rowwise.cpp): softmax,
// cross-entropy and layer norm. One block per row: its threads stride over the row's elements
// and combine their partial results with block reductions (in double for sums, as the CPU
// twin), whose result every thread then reads.

#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"
#include "nanoddp/kernels/pointwise_math.h"

namespace nanoddp::kernels::cuda {
namespace {

// The block-wide sum, returned to every thread. The leading __syncthreads() lets a kernel call
// it several times: the shared slots of the previous call have been read by then.
__device__ double block_all_sum(double value) {
  __shared__ double total;
  __syncthreads();
  value = detail::block_reduce_sum(value);
  if (threadIdx.x == 0) total = value;
  __syncthreads();
  return total;
}

__device__ float block_all_max(float value) {
  __shared__ float warp_max[detail::kWarpSize];
  __shared__ float total;
  __syncthreads();
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
  }
  const int lane = threadIdx.x % detail::kWarpSize, warp = threadIdx.x / detail::kWarpSize;
  if (lane == 0) warp_max[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0];
    for (int w = 1; w < static_cast<int>(blockDim.x) / detail::kWarpSize; ++w) {
      m = fmaxf(m, warp_max[w]);
    }
    total = m;
  }
  __syncthreads();
  return total;
}

// Block b handles row (o, i) = (b / inner, b % inner): elements base + j * inner.
__global__ void softmax_kernel(const float* __restrict__ x, std::int64_t d, std::int64_t inner,
                               bool log, float* __restrict__ out) {
  const std::int64_t row = blockIdx.x;
  const std::int64_t base = (row / inner) * d * inner + row % inner;
  float max = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) max = fmaxf(max, x[base + j * inner]);
  max = block_all_max(max);
  double total = 0.0;
  for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    total += exp(static_cast<double>(x[base + j * inner]) - max);
  }
  total = block_all_sum(total);
  const double log_total = ::log(total);
  for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const double shifted = static_cast<double>(x[base + j * inner]) - max;
    out[base + j * inner] = static_cast<float>(log ? shifted - log_total : exp(shifted) / total);
  }
}

__global__ void softmax_backward_kernel(const float* __restrict__ y, const float* __restrict__ g,
                                        std::int64_t d, std::int64_t inner, bool log, float beta,
                                        float* __restrict__ dx) {
  const std::int64_t row = blockIdx.x;
  const std::int64_t base = (row / inner) * d * inner + row % inner;
  double dot = 0.0;
  for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const std::int64_t k = base + j * inner;
    dot += log ? static_cast<double>(g[k]) : static_cast<double>(g[k]) * y[k];
  }
  dot = block_all_sum(dot);
  for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const std::int64_t k = base + j * inner;
    const double v = log ? g[k] - exp(static_cast<double>(y[k])) * dot
                         : y[k] * (static_cast<double>(g[k]) - dot);
    dx[k] = beta == 0.0f ? static_cast<float>(v) : beta * dx[k] + static_cast<float>(v);
  }
}

__global__ void cross_entropy_rows_kernel(const float* __restrict__ logits,
                                          const std::int64_t* __restrict__ targets,
                                          std::int64_t classes, std::int64_t ignore_index,
                                          float eps, float* __restrict__ row_loss,
                                          float* __restrict__ row_weight, float* __restrict__ lse) {
  const std::int64_t r = blockIdx.x;
  const float* x = logits + r * classes;
  float max = -INFINITY;
  double sum = 0.0;
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    max = fmaxf(max, x[c]);
    sum += x[c];
  }
  max = block_all_max(max);
  const double mean = block_all_sum(sum) / static_cast<double>(classes);
  double total = 0.0;
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    total += exp(static_cast<double>(x[c]) - max);
  }
  total = block_all_sum(total);
  if (threadIdx.x != 0) return;
  const double log_sum = max + ::log(total);
  lse[r] = static_cast<float>(log_sum);
  const std::int64_t t = targets[r];
  if (t == ignore_index) {
    row_loss[r] = 0.0f;
    row_weight[r] = 0.0f;
  } else if (t < 0 || t >= classes) {
    // A kernel cannot throw: a NaN loss is what the training loop's finite checks catch.
    row_loss[r] = NAN;
    row_weight[r] = 1.0f;
  } else {
    row_loss[r] = static_cast<float>(smoothed_nll(log_sum - x[t], log_sum - mean, eps));
    row_weight[r] = 1.0f;
  }
}

__global__ void cross_entropy_backward_kernel(const float* __restrict__ logits,
                                              const std::int64_t* __restrict__ targets,
                                              const float* __restrict__ lse, std::int64_t rows,
                                              std::int64_t classes, std::int64_t ignore_index,
                                              float eps, const float* __restrict__ grad_out,
                                              const float* __restrict__ count, float beta,
                                              float* __restrict__ dlogits) {
  const double scale = static_cast<double>(grad_out[0]) / count[0];
  NANODDP_GRID_STRIDE_LOOP(k, rows * classes) {
    const std::int64_t r = k / classes, c = k % classes;
    const std::int64_t t = targets[r];
    double v = 0.0;
    if (t != ignore_index) {
      const double p = exp(static_cast<double>(logits[k]) - lse[r]);
      v = scale * (p - (c == t ? 1.0 - eps : 0.0) - eps / static_cast<double>(classes));
    }
    dlogits[k] = beta == 0.0f ? static_cast<float>(v) : beta * dlogits[k] + static_cast<float>(v);
  }
}

__global__ void layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                  const float* __restrict__ bias, std::int64_t cols, float eps,
                                  float* __restrict__ y, float* __restrict__ mean,
                                  float* __restrict__ rstd) {
  const std::int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  double m = 0.0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) m += row[c];
  m = block_all_sum(m) / static_cast<double>(cols);
  double var = 0.0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) var += (row[c] - m) * (row[c] - m);
  var = block_all_sum(var) / static_cast<double>(cols);
  const double s = 1.0 / sqrt(var + eps);
  if (threadIdx.x == 0) {
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(s);
  }
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    double v = (row[c] - m) * s;
    if (weight != nullptr) v *= weight[c];
    if (bias != nullptr) v += bias[c];
    y[r * cols + c] = static_cast<float>(v);
  }
}

__global__ void layer_norm_backward_kernel(const float* __restrict__ x,
                                           const float* __restrict__ weight,
                                           const float* __restrict__ mean,
                                           const float* __restrict__ rstd,
                                           const float* __restrict__ g, std::int64_t cols,
                                           float beta, float* __restrict__ dx) {
  const std::int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  const float* gr = g + r * cols;
  const double m = mean[r], s = rstd[r];
  double sum_gw = 0.0, sum_gw_xhat = 0.0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const double gw = weight != nullptr ? static_cast<double>(gr[c]) * weight[c] : gr[c];
    sum_gw += gw;
    sum_gw_xhat += gw * (row[c] - m) * s;
  }
  const double mean_gw = block_all_sum(sum_gw) / static_cast<double>(cols);
  const double mean_gw_xhat = block_all_sum(sum_gw_xhat) / static_cast<double>(cols);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const double gw = weight != nullptr ? static_cast<double>(gr[c]) * weight[c] : gr[c];
    const double xhat = (row[c] - m) * s;
    const auto v = static_cast<float>(s * (gw - mean_gw - xhat * mean_gw_xhat));
    dx[r * cols + c] = beta == 0.0f ? v : beta * dx[r * cols + c] + v;
  }
}

// One thread per column, looping over the rows: neighbouring threads read neighbouring columns.
__global__ void layer_norm_param_backward_kernel(
    const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd,
    const float* __restrict__ g, std::int64_t rows, std::int64_t cols, float beta,
    float* __restrict__ dweight, float* __restrict__ dbias) {
  NANODDP_GRID_STRIDE_LOOP(c, cols) {
    double gw = 0.0, gb = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double xhat = (x[r * cols + c] - static_cast<double>(mean[r])) * rstd[r];
      gw += g[r * cols + c] * xhat;
      gb += g[r * cols + c];
    }
    if (dweight != nullptr) {
      dweight[c] =
          beta == 0.0f ? static_cast<float>(gw) : beta * dweight[c] + static_cast<float>(gw);
    }
    if (dbias != nullptr) {
      dbias[c] = beta == 0.0f ? static_cast<float>(gb) : beta * dbias[c] + static_cast<float>(gb);
    }
  }
}

unsigned rows_grid(std::int64_t rows) {
  return detail::grid_of_rows(rows, "row-wise kernel");
}

}  // namespace

void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, bool log,
             float* out, cudaStream_t stream) {
  if (outer * inner <= 0 || d <= 0) return;
  softmax_kernel<<<rows_grid(outer * inner), detail::kThreads, 0, stream>>>(x, d, inner, log, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                      std::int64_t inner, bool log, float beta, float* dx, cudaStream_t stream) {
  if (outer * inner <= 0 || d <= 0) return;
  softmax_backward_kernel<<<rows_grid(outer * inner), detail::kThreads, 0, stream>>>(y, g, d, inner,
                                                                                     log, beta, dx);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_rows(const float* logits, const std::int64_t* targets, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, float eps, float* row_loss,
                        float* row_weight, float* lse, cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_rows_kernel<<<rows_grid(rows), detail::kThreads, 0, stream>>>(
      logits, targets, classes, ignore_index, eps, row_loss, row_weight, lse);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const float* logits, const std::int64_t* targets, const float* lse,
                            std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                            float eps, const float* grad_out, const float* count, float beta,
                            float* dlogits, cudaStream_t stream) {
  if (rows * classes <= 0) return;
  cross_entropy_backward_kernel<<<detail::grid_for(rows * classes), detail::kThreads, 0, stream>>>(
      logits, targets, lse, rows, classes, ignore_index, eps, grad_out, count, beta, dlogits);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                std::int64_t cols, float eps, float* y, float* mean, float* rstd,
                cudaStream_t stream) {
  if (rows <= 0) return;
  layer_norm_kernel<<<rows_grid(rows), detail::kThreads, 0, stream>>>(x, weight, bias, cols, eps, y,
                                                                      mean, rstd);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* g, std::int64_t rows, std::int64_t cols, float beta,
                         float* dx, cudaStream_t stream) {
  if (rows <= 0) return;
  layer_norm_backward_kernel<<<rows_grid(rows), detail::kThreads, 0, stream>>>(
      x, weight, mean, rstd, g, cols, beta, dx);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void layer_norm_param_backward(const float* x, const float* mean, const float* rstd, const float* g,
                               std::int64_t rows, std::int64_t cols, float beta, float* dweight,
                               float* dbias, cudaStream_t stream) {
  if (cols <= 0) return;
  layer_norm_param_backward_kernel<<<detail::grid_for(cols), detail::kThreads, 0, stream>>>(
      x, mean, rstd, g, rows, cols, beta, dweight, dbias);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
