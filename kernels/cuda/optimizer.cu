// Optimizer steps over one flat buffer. The engine keeps all parameters (and their gradients
// and optimizer state) in a few persistent flat buffers, so one launch updates a whole model:
// no per-parameter kernel launches, and every thread streams through contiguous memory.
// The formulas are PyTorch's (see kernels/types.h).

#include <cmath>
#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

// momentum_buffer is touched only when momentum != 0 (then it may be null).
__global__ void sgd_kernel(float* __restrict__ param, const float* __restrict__ grad,
                           float* __restrict__ momentum_buffer, std::int64_t n, SgdHyper h,
                           bool first_step) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    const float p = param[i];
    float g = grad[i];
    if (h.weight_decay != 0.0f) g += h.weight_decay * p;
    if (h.momentum != 0.0f) {
      // PyTorch starts the buffer at the first gradient (no dampening on the first step).
      const float buf = first_step ? g : h.momentum * momentum_buffer[i] + (1.0f - h.dampening) * g;
      momentum_buffer[i] = buf;
      g = h.nesterov ? g + h.momentum * buf : buf;
    }
    param[i] = p - h.lr * g;
  }
}

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad,
                             float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                             std::int64_t n, AdamWHyper h, float step_size,
                             float bias_correction2_sqrt, float decay) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    const float g = grad[i];
    const float m = h.beta1 * exp_avg[i] + (1.0f - h.beta1) * g;
    const float v = h.beta2 * exp_avg_sq[i] + (1.0f - h.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    // PyTorch's arrangement: lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
    const float denom = sqrtf(v) / bias_correction2_sqrt + h.eps;
    // Decoupled weight decay: shrink the parameter itself, not the gradient (that is what
    // distinguishes AdamW from Adam with L2 regularisation).
    param[i] = param[i] * decay - step_size * m / denom;
  }
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
              const SgdHyper& h, bool first_step, cudaStream_t stream) {
  if (n <= 0) return;
  sgd_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(param, grad, momentum_buffer, n,
                                                                   h, first_step);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWHyper& h, cudaStream_t stream) {
  if (n <= 0) return;
  // The bias corrections depend only on the step: compute them once on the host, in double
  // (early in training 1 - beta^step is small and float would lose digits), the same way as the
  // CPU twin so that both round identically.
  const auto step = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step);
  const auto step_size = static_cast<float>(h.lr / bias_correction1);
  const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = 1.0f - h.lr * h.weight_decay;
  adamw_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      param, grad, exp_avg, exp_avg_sq, n, h, step_size, bias_correction2_sqrt, decay);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
