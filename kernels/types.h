#pragma once
// Plain types shared by the CPU and CUDA kernels. Kernels are pure functions over raw buffers:
// they know nothing of Tensor, autograd or devices beyond the stream they are handed.

#include <cstdint>

namespace nanoddp::kernels {

enum class Activation : std::uint8_t { kNone, kRelu, kGelu };

// Whether a GEMM operand is read transposed. All matrices are dense and row-major.
enum class Transpose : std::uint8_t { kNo, kYes };

// SGD as PyTorch defines it (torch.optim.SGD):
//   g = grad + weight_decay * param
//   buf = first_step ? g : momentum * buf + (1 - dampening) * g     (only when momentum != 0)
//   g = nesterov ? g + momentum * buf : buf
//   param -= lr * g
struct SgdHyper {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// AdamW as PyTorch defines it (torch.optim.AdamW), decoupled weight decay:
//   param *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
// `step` counts from 1.
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  std::int64_t step = 1;
};

}  // namespace nanoddp::kernels
