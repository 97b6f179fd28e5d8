#pragma once
// The formulas of the pointwise research ops, written once for the CPU kernels and the CUDA
// kernels (compiled by nvcc as __host__ __device__). Each is the value or the derivative at one
// element; the kernels are loops around them.

#include <cmath>
#include <cstdint>

#include "nanoddp/kernels/philox.h"
#include "nanoddp/kernels/types.h"

namespace nanoddp::kernels {

// One row's cross-entropy with label smoothing eps: (1 - eps) * nll + eps * smooth, where nll is
// -log p[target] and smooth is -mean_c log p[c]. A term whose weight is 0 is left out, not
// multiplied: a -inf logit (a masked class) makes smooth +inf, and 0 * inf would be a NaN loss
// where PyTorch gives a finite one.
NANODDP_HOST_DEVICE double smoothed_nll(double nll, double smooth, double eps) {
  double loss = 0.0;
  if (eps < 1.0) loss += (1.0 - eps) * nll;
  if (eps > 0.0) loss += eps * smooth;
  return loss;
}

NANODDP_HOST_DEVICE float unary_value(UnaryOp op, float x, float a, float b) {
  switch (op) {
    case UnaryOp::kAffine:
      return a * x + b;
    case UnaryOp::kDivScalar:
      return x / a;
    case UnaryOp::kExp:
      return expf(x);
    case UnaryOp::kLog:
      return logf(x);
    case UnaryOp::kSqrt:
      return sqrtf(x);
    case UnaryOp::kTanh:
      return tanhf(x);
    // 1 / (1 + e^-x) overflows harmlessly to 0 for very negative x (e^-x = inf).
    case UnaryOp::kSigmoid:
      return 1.0f / (1.0f + expf(-x));
    case UnaryOp::kPow:
      return powf(x, a);
    // NaN stays NaN (PyTorch): fmaxf/fminf would drop it.
    case UnaryOp::kClamp:
      return x != x ? x : (x < a ? a : (x > b ? b : x));
  }
  return x;
}

// grad_out times the derivative at x, using the output y where that is cheaper (exp, tanh,
// sigmoid, sqrt).
NANODDP_HOST_DEVICE float unary_grad(UnaryOp op, float x, float y, float a, float b, float g) {
  switch (op) {
    case UnaryOp::kAffine:
      return g * a;
    case UnaryOp::kDivScalar:
      return g / a;
    case UnaryOp::kExp:
      return g * y;
    case UnaryOp::kLog:
      return g / x;
    case UnaryOp::kSqrt:
      return g / (2.0f * y);
    case UnaryOp::kTanh:
      return g * (1.0f - y * y);
    case UnaryOp::kSigmoid:
      return g * y * (1.0f - y);
    // PyTorch: exponent 0 has gradient 0 everywhere (even at x = 0, where x^-1 is inf).
    case UnaryOp::kPow:
      return a == 0.0f ? 0.0f : g * a * powf(x, a - 1.0f);
    case UnaryOp::kClamp:
      return (x >= a && x <= b) ? g : 0.0f;
  }
  return g;
}

NANODDP_HOST_DEVICE float binary_value(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
    case BinaryOp::kDiv:
      return a / b;
  }
  return a;
}

// Dropout keeps element `counter` of Philox stream `stream` under `seed` when its uniform in
// [0, 1) is at least p: probability 1 - p, and a pure function of the counter, so the backward
// regenerates the mask instead of storing it, and any device draws the same mask.
NANODDP_HOST_DEVICE bool dropout_keep(float p, std::uint64_t seed, std::uint64_t stream,
                                      std::uint64_t counter) {
  return uniform_from_bits(philox4x32_10(counter, stream, seed).v[0]) >= p;
}

}  // namespace nanoddp::kernels
