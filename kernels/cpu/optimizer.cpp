// Optimizer updates over one flat buffer, written to match torch.optim.SGD and
// torch.optim.AdamW (the single-tensor, non-fused path) operation for operation, so a run can
// be compared with PyTorch's to float rounding. The formulas are in kernels/types.h.

#include <cmath>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
              const SgdHyper& h, bool first_step) {
  const bool use_momentum = h.momentum != 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (h.weight_decay != 0.0f) g += h.weight_decay * param[i];
    if (use_momentum) {
      // PyTorch starts the buffer as a copy of the first gradient (no dampening on step one).
      const float buf = first_step ? g : h.momentum * momentum_buffer[i] + (1.0f - h.dampening) * g;
      momentum_buffer[i] = buf;
      g = h.nesterov ? g + h.momentum * buf : buf;
    }
    param[i] -= h.lr * g;
  }
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWHyper& h) {
  // The bias corrections are per-step scalars; PyTorch computes them in Python (double) and
  // so do we. Early in training 1 - beta^step is small and float would lose digits.
  const double step = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step);
  const float step_size = static_cast<float>(h.lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  // Decoupled weight decay: shrink the parameter itself, independent of the gradient scale.
  const float decay = 1.0f - h.lr * h.weight_decay;
  // Vectorized, this loop runs ~4x faster (10.5 -> 2.4 ms for 4.2M parameters here): it needs
  // the four buffers declared non-overlapping (they are separate flat buffers) and the library
  // built with -fno-math-errno (else every sqrt keeps a scalar errno path). sqrt and division
  // are correctly rounded in vector form too, so the results are the same bits.
  float* __restrict p = param;
  const float* __restrict gr = grad;
  float* __restrict m1 = exp_avg;
  float* __restrict m2 = exp_avg_sq;
  const float beta1 = h.beta1, beta2 = h.beta2, eps = h.eps;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gr[i];
    const float m = beta1 * m1[i] + (1.0f - beta1) * g;
    const float v = beta2 * m2[i] + (1.0f - beta2) * g * g;
    m1[i] = m;
    m2[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    p[i] = p[i] * decay - step_size * m / denom;
  }
}

}  // namespace nanoddp::kernels::cpu
