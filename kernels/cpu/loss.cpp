// Mean squared error, PyTorch's MSELoss(reduction='mean'): loss = sum((p - t)^2) / n.
// The forward accumulates in double for the same reason as sum(): it is the reference value.

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {

void mse_forward(const float* pred, const float* target, std::int64_t n, float* out) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int lane = 0; lane < 4; ++lane) {
      const double d = static_cast<double>(pred[i + lane]) - target[i + lane];
      acc[lane] += d * d;
    }
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(pred[i]) - target[i];
    acc[0] += d * d;
  }
  // The mean of nothing is NaN in PyTorch too (0 / 0).
  out[0] = static_cast<float>(((acc[0] + acc[1]) + (acc[2] + acc[3])) / static_cast<double>(n));
}

// d loss / d pred[i] = 2 (pred[i] - target[i]) / n, times the upstream gradient of the scalar.
void mse_backward(const float* pred, const float* target, std::int64_t n, const float* grad_out,
                  float beta, float* grad_pred) {
  const float scale = grad_out[0] * 2.0f / static_cast<float>(n);
  if (beta == 0.0f) {
    for (std::int64_t i = 0; i < n; ++i) grad_pred[i] = scale * (pred[i] - target[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      grad_pred[i] = beta * grad_pred[i] + scale * (pred[i] - target[i]);
    }
  }
}

}  // namespace nanoddp::kernels::cpu
