// Pointwise kernels of the research ops: one function of one tensor (exp, tanh, pow, ...), and
// one function of two tensors where either may be broadcast. The formulas live in
// pointwise_math.h, shared with the CUDA twin, so both devices compute the same expressions.

#include <cmath>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/pointwise_math.h"

namespace nanoddp::kernels::cpu {

void unary(UnaryOp op, const float* x, float a, float b, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = unary_value(op, x[i], a, b);
}

void unary_backward(UnaryOp op, const float* x, const float* y, float a, float b,
                    const float* grad_out, float* grad_in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    grad_in[i] =
        unary_grad(op, x == nullptr ? 0.0f : x[i], y == nullptr ? 0.0f : y[i], a, b, grad_out[i]);
  }
}

void binary(BinaryOp op, const float* a, Broadcast ba, const float* b, Broadcast bb, float* out,
            std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = binary_value(op, a[(i / ba.div) % ba.mod], b[(i / bb.div) % bb.mod]);
  }
}

void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed, std::uint64_t stream,
             std::uint64_t offset, float* out) {
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] =
        dropout_keep(p, seed, stream, offset + static_cast<std::uint64_t>(i)) ? x[i] * scale : 0.0f;
  }
}

}  // namespace nanoddp::kernels::cpu
