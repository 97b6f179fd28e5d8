// Pointwise kernels of the research ops (the CPU twins are in kernels/cpu/pointwise.cpp; both
// evaluate the formulas of kernels/pointwise_math.h). Memory-bound grid-stride loops; where the
// operand and the output are 16-byte aligned and n is a multiple of 4, unary and dropout move
// four floats per load (float4), the widest load a thread issues.

#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"
#include "nanoddp/kernels/pointwise_math.h"

namespace nanoddp::kernels::cuda {
namespace {

bool aligned4(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

__global__ void unary_kernel(UnaryOp op, const float* x, float a, float b, float* out,
                             std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = unary_value(op, x[i], a, b);
  }
}

__global__ void unary4_kernel(UnaryOp op, const float4* x, float a, float b, float4* out,
                              std::int64_t n4) {
  NANODDP_GRID_STRIDE_LOOP(i, n4) {
    const float4 v = x[i];
    out[i] = make_float4(unary_value(op, v.x, a, b), unary_value(op, v.y, a, b),
                         unary_value(op, v.z, a, b), unary_value(op, v.w, a, b));
  }
}

__global__ void unary_backward_kernel(UnaryOp op, const float* x, const float* y, float a, float b,
                                      const float* grad_out, float* grad_in, std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    grad_in[i] =
        unary_grad(op, x == nullptr ? 0.0f : x[i], y == nullptr ? 0.0f : y[i], a, b, grad_out[i]);
  }
}

__global__ void binary_kernel(BinaryOp op, const float* a, Broadcast ba, const float* b,
                              Broadcast bb, float* out, std::int64_t n) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = binary_value(op, a[(i / ba.div) % ba.mod], b[(i / bb.div) % bb.mod]);
  }
}

__global__ void dropout_kernel(const float* x, std::int64_t n, float p, float scale,
                               std::uint64_t seed, std::uint64_t stream_id, std::uint64_t offset,
                               float* out) {
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    out[i] = dropout_keep(p, seed, stream_id, offset + static_cast<std::uint64_t>(i)) ? x[i] * scale
                                                                                      : 0.0f;
  }
}

}  // namespace

void unary(UnaryOp op, const float* x, float a, float b, float* out, std::int64_t n,
           cudaStream_t stream) {
  if (n <= 0) return;
  if (n % 4 == 0 && aligned4(x) && aligned4(out)) {
    unary4_kernel<<<detail::grid_for(n / 4), detail::kThreads, 0, stream>>>(
        op, reinterpret_cast<const float4*>(x), a, b, reinterpret_cast<float4*>(out), n / 4);
  } else {
    unary_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(op, x, a, b, out, n);
  }
  NANODDP_CUDA_CHECK_LAUNCH();
}

void unary_backward(UnaryOp op, const float* x, const float* y, float a, float b,
                    const float* grad_out, float* grad_in, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  unary_backward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(op, x, y, a, b,
                                                                              grad_out, grad_in, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void binary(BinaryOp op, const float* a, Broadcast ba, const float* b, Broadcast bb, float* out,
            std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  binary_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(op, a, ba, b, bb, out, n);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed, std::uint64_t stream_id,
             std::uint64_t offset, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  dropout_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, n, p, scale, seed,
                                                                       stream_id, offset, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
