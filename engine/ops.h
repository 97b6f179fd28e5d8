#pragma once
// Differentiable ops. Each is a forward on the device's Backend plus a small backward lambda
// recorded with autograd's `record` (see ops.cpp). Shapes must match exactly, except for add and
// sub, which broadcast like the binary ops of functional.h (where more ops live); a mismatch is
// an Error that names the op and both shapes.

#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/types.h"

namespace nanoddp {

using kernels::Activation;

// [m, k] x [k, n] -> [m, n]
Tensor matmul(const Tensor& a, const Tensor& b);
// act(x W^T + b): x [batch, in] (or [*, in], any leading dimensions, or [in], as PyTorch),
// weight [out, in], bias [out] or undefined. The activation is fused into the GEMM's epilogue;
// kNone gives PyTorch's F.linear.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              Activation act = Activation::kNone);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, float scalar);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation (PyTorch's approximate='tanh')
Tensor sum(const Tensor& x);   // -> one-element tensor of shape []
Tensor mean(const Tensor& x);  // -> shape []
// mean((pred - target)^2), PyTorch's MSELoss(reduction='mean').
Tensor mse_loss(const Tensor& pred, const Tensor& target);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, float s) { return mul(a, s); }
inline Tensor operator*(float s, const Tensor& a) { return mul(a, s); }

}  // namespace nanoddp
