// Elementwise kernels: plain loops over contiguous floats, which -O3 turns into vector code.
// Where the header allows aliasing (out == a, out == x) each element is read before it is
// written at the same index, so the loops are correct in place.

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {

void fill(float* x, std::int64_t n, float value) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = value;
}

void scale(float* x, std::int64_t n, float alpha) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

void axpy(std::int64_t n, float alpha, const float* x, float* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void add(const float* a, const float* b, float alpha, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + alpha * b[i];
}

void scale_copy(const float* x, float alpha, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = alpha * x[i];
}

void broadcast_scalar(const float* scalar, float alpha, float beta, float* out, std::int64_t n) {
  // Read the scalar once: it may live inside `out`'s range in a caller's flat buffer.
  const float value = alpha * scalar[0];
  if (beta == 0.0f) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = value;
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = beta * out[i] + value;
  }
}

}  // namespace nanoddp::kernels::cpu
