#pragma once
// Plain types shared by the CPU and CUDA kernels. Kernels are pure functions over raw buffers:
// they know nothing of Tensor, autograd or devices beyond the stream they are handed.

#include <cstdint>

namespace nanoddp::kernels {

enum class Activation : std::uint8_t { kNone, kRelu, kGelu };

// Elementwise functions of one tensor with up to two scalar parameters (a, b):
//   kAffine  y = a * x + b       (neg, scalar add/sub/mul)   kDivScalar  y = x / a
//   kExp, kLog, kSqrt, kTanh, kSigmoid                        kPow        y = x^a
//   kClamp   y = min(max(x, a), b)  (a = -inf or b = +inf for a one-sided clamp)
enum class UnaryOp : std::uint8_t {
  kAffine,
  kDivScalar,
  kExp,
  kLog,
  kSqrt,
  kTanh,
  kSigmoid,
  kPow,
  kClamp
};

// Elementwise functions of two tensors: out = a op b.
enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul, kDiv };

// Where an operand of a broadcast binary op is read: element i of the output reads the
// operand's element (i / div) % mod. Same shape: {1, n}; a row vector [cols] over [rows, cols]:
// {1, cols}; a column [rows, 1]: {cols, rows}; a scalar: {1, 1}.
struct Broadcast {
  std::int64_t div = 1;
  std::int64_t mod = 1;
};

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
