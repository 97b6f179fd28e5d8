// The bias + activation epilogue of a linear layer and its backward.
//
// GELU uses the tanh approximation (PyTorch's approximate='tanh', GPT-2's form):
//   gelu(z) = 0.5 z (1 + tanh(u)),  u = sqrt(2/pi) (z + 0.044715 z^3)
// and its derivative by the product and chain rules:
//   gelu'(z) = 0.5 (1 + tanh(u)) + 0.5 z (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 z^2)

#include <cmath>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

inline float gelu(float z) {
  const float u = kSqrt2OverPi * (z + kGeluCubic * z * z * z);
  return 0.5f * z * (1.0f + std::tanh(u));
}

inline float gelu_grad(float z) {
  const float u = kSqrt2OverPi * (z + kGeluCubic * z * z * z);
  const float t = std::tanh(u);
  const float du_dz = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * z * z);
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * du_dz;
}

inline float apply(Activation act, float z) {
  switch (act) {
    case Activation::kRelu:
      return z <= 0.0f ? 0.0f : z;  // NaN passes through (NaN <= 0 is false), as torch.relu
    case Activation::kGelu:
      return gelu(z);
    case Activation::kNone:
      break;
  }
  return z;
}

// One row for a fixed activation: the switch is hoisted out of the inner loop so the compiler
// sees a plain elementwise loop it can vectorise.
template <Activation kAct>
void bias_activation_rows(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                          float* pre_activation) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float* row = y + i * cols;
    float* pre = pre_activation ? pre_activation + i * cols : nullptr;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float z = row[j] + (bias ? bias[j] : 0.0f);
      if (pre) pre[j] = z;
      row[j] = apply(kAct, z);
    }
  }
}

}  // namespace

void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                     Activation act, float* pre_activation) {
  switch (act) {
    case Activation::kNone:
      bias_activation_rows<Activation::kNone>(y, bias, rows, cols, pre_activation);
      break;
    case Activation::kRelu:
      bias_activation_rows<Activation::kRelu>(y, bias, rows, cols, pre_activation);
      break;
    case Activation::kGelu:
      bias_activation_rows<Activation::kGelu>(y, bias, rows, cols, pre_activation);
      break;
  }
}

void activation_backward(Activation act, const float* pre_activation, const float* grad_out,
                         float* grad_in, std::int64_t n) {
  switch (act) {
    case Activation::kNone:
      for (std::int64_t i = 0; i < n; ++i) grad_in[i] = grad_out[i];
      break;
    case Activation::kRelu:
      // A select, not a multiply: 0 * Inf or 0 * NaN upstream stays 0, as in PyTorch. Written as
      // (z <= 0 ? 0 : g), PyTorch's threshold_backward, so a NaN pre-activation passes the
      // gradient on instead of hiding the NaN.
      for (std::int64_t i = 0; i < n; ++i) {
        grad_in[i] = pre_activation[i] <= 0.0f ? 0.0f : grad_out[i];
      }
      break;
    case Activation::kGelu:
      for (std::int64_t i = 0; i < n; ++i) grad_in[i] = grad_out[i] * gelu_grad(pre_activation[i]);
      break;
  }
}

}  // namespace nanoddp::kernels::cpu
