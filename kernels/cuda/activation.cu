// The linear layer's epilogue, fused: y = act(y + bias) in one pass over y, instead of one kernel
// for the bias and another for the activation (each pass over a large activation costs a full
// read and write of global memory). Also the activation's backward.

#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

// GELU in its tanh form (as PyTorch's approximate='tanh' and GPT-2):
//   gelu(z) = 0.5 z (1 + tanh(s (z + c z^3))),  s = sqrt(2 / pi), c = 0.044715
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu(float z) {
  const float inner = kGeluScale * (z + kGeluCubic * z * z * z);
  return 0.5f * z * (1.0f + tanhf(inner));
}

// d/dz gelu(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) s (1 + 3 c z^2),  t = tanh(s (z + c z^3)).
__device__ __forceinline__ float gelu_grad(float z) {
  const float inner = kGeluScale * (z + kGeluCubic * z * z * z);
  const float t = tanhf(inner);
  const float dinner = kGeluScale * (1.0f + 3.0f * kGeluCubic * z * z);
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * dinner;
}

template <Activation kAct>
__device__ __forceinline__ float activate(float z) {
  if constexpr (kAct == Activation::kRelu) return z <= 0.0f ? 0.0f : z;  // NaN passes, as torch
  if constexpr (kAct == Activation::kGelu) return gelu(z);
  return z;
}

// y and pre_activation are not __restrict__: with kNone they may be the same buffer.
template <Activation kAct>
__global__ void bias_activation_kernel(float* y, const float* __restrict__ bias, std::int64_t rows,
                                       std::int64_t cols, float* pre_activation) {
  const std::int64_t n = rows * cols;
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    // Row-major: consecutive threads touch consecutive columns of a row, so both y and the
    // (cached, tiny) bias vector are read coalesced.
    float z = y[i];
    if (bias != nullptr) z += bias[i % cols];
    if (pre_activation != nullptr) pre_activation[i] = z;
    y[i] = activate<kAct>(z);
  }
}

// grad_in may alias grad_out: each element is read before it is written by the same thread.
template <Activation kAct>
__global__ void activation_backward_kernel(const float* __restrict__ pre_activation,
                                           const float* grad_out, float* grad_in, std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    const float g = grad_out[i];
    if constexpr (kAct == Activation::kRelu) {
      grad_in[i] = pre_activation[i] <= 0.0f ? 0.0f : g;  // PyTorch's threshold_backward
    } else if constexpr (kAct == Activation::kGelu) {
      grad_in[i] = g * gelu_grad(pre_activation[i]);
    } else {
      grad_in[i] = g;
    }
  }
}

}  // namespace

void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                     Activation act, float* pre_activation, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (rows <= 0 || cols <= 0) return;
  const unsigned grid = detail::grid_for(n);
  switch (act) {
    case Activation::kNone:
      if (bias == nullptr && (pre_activation == nullptr || pre_activation == y)) return;
      bias_activation_kernel<Activation::kNone>
          <<<grid, detail::kThreads, 0, stream>>>(y, bias, rows, cols, pre_activation);
      break;
    case Activation::kRelu:
      bias_activation_kernel<Activation::kRelu>
          <<<grid, detail::kThreads, 0, stream>>>(y, bias, rows, cols, pre_activation);
      break;
    case Activation::kGelu:
      bias_activation_kernel<Activation::kGelu>
          <<<grid, detail::kThreads, 0, stream>>>(y, bias, rows, cols, pre_activation);
      break;
  }
  NANODDP_CUDA_CHECK_LAUNCH();
}

void activation_backward(Activation act, const float* pre_activation, const float* grad_out,
                         float* grad_in, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned grid = detail::grid_for(n);
  switch (act) {
    case Activation::kNone:
      if (grad_in == grad_out) return;
      NANODDP_CUDA_CHECK(cudaMemcpyAsync(grad_in, grad_out,
                                         static_cast<std::size_t>(n) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream));
      return;
    case Activation::kRelu:
      activation_backward_kernel<Activation::kRelu>
          <<<grid, detail::kThreads, 0, stream>>>(pre_activation, grad_out, grad_in, n);
      break;
    case Activation::kGelu:
      activation_backward_kernel<Activation::kGelu>
          <<<grid, detail::kThreads, 0, stream>>>(pre_activation, grad_out, grad_in, n);
      break;
  }
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
