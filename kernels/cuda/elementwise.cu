// Elementwise kernels: one grid-stride loop each. They are memory-bound (one or two flops per
// element loaded), so the only thing that matters is that consecutive threads touch consecutive
// addresses, which a grid-stride loop over a flat index gives for free.
//
// Pointers that the contract allows to alias (out with a or b, out with x) are not marked
// __restrict__: the promise would be false and the compiler could reorder loads and stores.

#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

__global__ void fill_kernel(float* x, std::int64_t n, float value) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    x[i] = value;
  }
}

__global__ void scale_kernel(float* x, std::int64_t n, float alpha) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    x[i] *= alpha;
  }
}

__global__ void axpy_kernel(std::int64_t n, float alpha, const float* __restrict__ x,
                            float* __restrict__ y) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    y[i] += alpha * x[i];
  }
}

__global__ void add_kernel(const float* a, const float* b, float alpha, float* out,
                           std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = a[i] + alpha * b[i];
  }
}

__global__ void scale_copy_kernel(const float* x, float alpha, float* out, std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = alpha * x[i];
  }
}

__global__ void broadcast_scalar_kernel(const float* __restrict__ scalar, float alpha, float beta,
                                        float* __restrict__ out, std::int64_t n) {
  // The scalar lives on the device (it is the upstream gradient of a loss), so every thread
  // reads it; it is one cached word.
  const float value = alpha * scalar[0];
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = beta == 0.0f ? value : beta * out[i] + value;
  }
}

// ---- bf16 ----------------------------------------------------------------------------------
// bf16 is the upper half of an IEEE float32 (same sign and 8-bit exponent, 7 mantissa bits), so
// widening is a shift and narrowing is a rounding of the lower 16 bits. Done with integer
// arithmetic (not cuda_bf16.h) so that the bits match the CPU twin exactly.

__device__ __forceinline__ std::uint16_t f32_to_bf16_bits(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncation could clear every mantissa bit and turn it into infinity; keep the sign and
    // the top payload bits and force the quiet bit so it stays a NaN.
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. A lower
  // half above 0x8000 carries into the kept bits, below stays, and exactly 0x8000 carries only
  // when the kept value is odd. Overflow past the largest bf16 correctly becomes infinity.
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ in, std::uint16_t* __restrict__ out,
                                   std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = f32_to_bf16_bits(in[i]);
  }
}

__global__ void bf16_to_f32_kernel(const std::uint16_t* __restrict__ in, float* __restrict__ out,
                                   std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16);
  }
}

}  // namespace

void fill(float* x, std::int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, n, value);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void scale(float* x, std::int64_t n, float alpha, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, n, alpha);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void axpy(std::int64_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  axpy_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(n, alpha, x, y);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void add(const float* a, const float* b, float alpha, float* out, std::int64_t n,
         cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(a, b, alpha, out, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void scale_copy(const float* x, float alpha, float* out, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scale_copy_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, alpha, out, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void broadcast_scalar(const float* scalar, float alpha, float beta, float* out, std::int64_t n,
                      cudaStream_t stream) {
  if (n <= 0) return;
  broadcast_scalar_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(scalar, alpha, beta,
                                                                                out, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(in, out, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(in, out, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
