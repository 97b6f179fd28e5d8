#pragma once
// CPU kernels: pure functions over raw, dense, row-major float32 buffers. They run on the
// calling thread (GEMM may use OpenMP threads, see set_gemm_threads). Each has a CUDA
// twin with the same name and meaning in kernels/cuda/kernels.h; the tests hold the two
// against each other and both against float64 references.
//
// Conventions:
//  - sizes are element counts (int64_t); pointers may alias only where a comment says so;
//  - `beta` arguments say whether the output is overwritten (0) or accumulated into (1):
//    out = beta * out + result. With beta == 0 the old contents are never read, so they may be
//    garbage (even NaN);
//  - scalars that in a CUDA graph would live on the device (a loss, an upstream gradient of a
//    scalar) are passed as pointers to one element.

#include <cstdint>

#include "nanoddp/kernels/types.h"

namespace nanoddp::kernels::cpu {

// ---- GEMM ---------------------------------------------------------------------------------
// C[m,n] = alpha * op(A) * op(B) + beta * C, row-major.
// op(A) is m x k: A is stored m x k (kNo) or k x m (kYes). op(B) is k x n: B is stored k x n
// (kNo) or n x k (kYes). The three layouts a linear layer needs:
//   forward  Y = X W^T   gemm(kNo,  kYes, batch, out, in, ...)
//   input    dX = dY W   gemm(kNo,  kNo,  batch, in, out, ...)
//   weight   dW = dY^T X gemm(kYes, kNo,  out, in, batch, ...)
// gemm() runs nanoddp's own AVX-512 kernels for these three layouts (gemm.cpp) and Eigen for
// the fourth (both transposed) or where the build has no AVX-512 (gemm_has_own_kernels()).
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c);
// The same product through Eigen alone: the reference the own kernels are held against
// (tests, nanoddp-bench-gemm, --gemm eigen).
void gemm_eigen(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n,
                std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c);
bool gemm_has_own_kernels();

// Threads gemm and gemm_eigen may use (1 = the calling thread only). gemm's threads split the
// tiles of C, never a sum, so its results are the same bits for every thread count.
void set_gemm_threads(int threads);
int gemm_threads();

// ---- bias + activation epilogue -----------------------------------------------------------
// For a rows x cols matrix y (in place): z = y + bias (bias has cols elements, or is null),
// y = act(z). When pre_activation is not null it receives z (needed by GELU's backward).
// pre_activation may equal y only when act == kNone.
void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                     Activation act, float* pre_activation);

// grad_in[i] = grad_out[i] * act'(pre_activation[i]). grad_in may alias grad_out.
// For ReLU, act'(z) = (z > 0); for GELU the derivative of the tanh form.
void activation_backward(Activation act, const float* pre_activation, const float* grad_out,
                         float* grad_in, std::int64_t n);

// ---- reductions ---------------------------------------------------------------------------
// out[j] = beta * out[j] + sum_i x[i, j]  for a rows x cols matrix (the bias gradient).
void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out);

// out[0] = sum of x[0..n) (accumulated in double on the CPU).
void sum(const float* x, std::int64_t n, float* out);

// out[0] = how many of x[0..n) are NaN or +-Inf (exact up to 2^24, then rounded as a float).
// The health check of a gradient buffer before the optimizer step.
void count_nonfinite(const float* x, std::int64_t n, float* out);

// ---- loss ---------------------------------------------------------------------------------
// out[0] = mean((pred - target)^2) over n elements (PyTorch's MSELoss, reduction='mean').
void mse_forward(const float* pred, const float* target, std::int64_t n, float* out);

// grad_pred[i] = beta * grad_pred[i] + grad_out[0] * 2 * (pred[i] - target[i]) / n.
void mse_backward(const float* pred, const float* target, std::int64_t n, const float* grad_out,
                  float beta, float* grad_pred);

// ---- elementwise --------------------------------------------------------------------------
void fill(float* x, std::int64_t n, float value);
// x *= alpha
void scale(float* x, std::int64_t n, float alpha);
// y += alpha * x
void axpy(std::int64_t n, float alpha, const float* x, float* y);
// out = a + alpha * b   (out may alias a or b)
void add(const float* a, const float* b, float alpha, float* out, std::int64_t n);
// out = alpha * x   (out may alias x)
void scale_copy(const float* x, float alpha, float* out, std::int64_t n);
// out[i] = beta * out[i] + alpha * scalar[0]  (the backward of sum and mean)
void broadcast_scalar(const float* scalar, float alpha, float beta, float* out, std::int64_t n);

// ---- optimizers over one flat buffer ------------------------------------------------------
// momentum_buffer is read and written only when h.momentum != 0; first_step says the buffer
// has no history yet (PyTorch initialises it with the first gradient).
void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
              const SgdHyper& h, bool first_step);
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWHyper& h);

// ---- counter-based random fills (kernels/philox.h) --------------------------------
// Element i takes Philox4x32-10 at counter (offset + i, stream) under key seed, so any slice of
// the stream can be produced independently. Uniform: lo + (hi - lo) * u, u in [0, 1) from the
// first word. Normal: Box-Muller from the first two words, mean + std * z.
void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                  std::uint64_t offset, float lo, float hi);
void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t offset, float mean, float stddev);

// ---- casts (bf16 stored as the upper 16 bits of an IEEE float, round to nearest even) ----
void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n);
void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n);

}  // namespace nanoddp::kernels::cpu
