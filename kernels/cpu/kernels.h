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

// Threads gemm and gemm_eigen may use (1 = the calling thread only). Both split C (gemm its
// tiles, gemm_eigen fixed slices of it), never a sum, so the results are the same bits for
// every thread count.
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

// ---- the research ops (pointwise.cpp, shape.cpp, rowwise.cpp) ---------------------------
// Tensors of any rank are seen as [outer, d, inner] around the dimension an op works along:
// element (o, j, i) is at (o * d + j) * inner + i.

// out = op(x; a, b), see UnaryOp. out may alias x.
void unary(UnaryOp op, const float* x, float a, float b, float* out, std::int64_t n);
// grad_in = grad_out * op'(x), from x or from the forward's output y (both given; either may be
// unused). grad_in may alias grad_out. Clamp passes the gradient where a <= x <= b (PyTorch).
void unary_backward(UnaryOp op, const float* x, const float* y, float a, float b,
                    const float* grad_out, float* grad_in, std::int64_t n);
// out[i] = a[(i / ba.div) % ba.mod] op b[(i / bb.div) % bb.mod], i < n. out may alias an
// operand that is not broadcast.
void binary(BinaryOp op, const float* a, Broadcast ba, const float* b, Broadcast bb, float* out,
            std::int64_t n);
// out[j] = beta * out[j] + sum over o, i of x[o, j, i]: the gradient of a broadcast operand.
void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner, float beta,
            float* out);
// out[o, i] = alpha * sum over j of x[o, j, i]: sum (alpha 1) and mean (1 / d) over a dim.
void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
             float* out);
// out[o, j, i] = beta * out[o, j, i] + alpha * x[o, i]: the backward of sum_dim.
void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
                float beta, float* out);
// values[o, i] = max over j of x[o, j, i], indices[o, i] = its j (the first on ties; a NaN wins,
// as in PyTorch).
void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float* values,
             std::int64_t* indices);
// out[o, j, i] = beta * out[o, j, i] + (j == indices[o, i] ? g[o, i] : 0): max's backward.
void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer, std::int64_t d,
                    std::int64_t inner, float beta, float* out);
// For every o: dst[o, dst_start .. + len, :] = beta * dst + src[o, src_start .. + len, :], with
// src seen as [outer, src_d, inner] and dst as [outer, dst_d, inner]. narrow, cat and split,
// forward and backward.
void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer, std::int64_t len,
                std::int64_t inner, float beta);
// out[i, :] = weight[indices[i], :] for i < n, rows of `dim`: embedding's gather. Every index
// must lie in [0, rows) (the op checks them first).
void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                       std::int64_t dim, float* out);
// grad_weight = beta * grad_weight, then grad_weight[indices[i], :] += g[i, :] for i in order
// (a repeated index sums its rows): embedding's scatter-add, for a [rows, dim] weight.
void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                        std::int64_t rows, std::int64_t dim, float beta, float* grad_weight);
// out[c, r] = beta * out[c, r] + x[r, c] for a rows x cols matrix x.
void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out);
// Softmax (or log-softmax) along d, with the maximum subtracted first (no overflow).
void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, bool log,
             float* out);
// From the forward's output y: softmax dx = y (g - sum_j g y); log-softmax dx = g - exp(y) sum_j g.
// dx = beta * dx + that.
void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                      std::int64_t inner, bool log, float beta, float* dx);
// Cross-entropy of rows x classes logits against class indices, per row: row_loss[r] =
// (1 - eps) (lse - x[t]) + eps (lse - mean_c x[c]) and row_weight[r] = 1, or both 0 where
// t == ignore_index; lse[r] = log sum_c exp(x[r, c]) is kept for the backward. A target outside
// [0, classes) gives a NaN row loss (the CPU twin throws instead, naming the row).
void cross_entropy_rows(const float* logits, const std::int64_t* targets, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, float eps, float* row_loss,
                        float* row_weight, float* lse);
// dlogits[r, c] = beta * dlogits + g[0] / count[0] * (softmax[r, c] - (1 - eps) [c == t] -
// eps / classes), zero on ignored rows: the backward of the mean over the counted rows.
void cross_entropy_backward(const float* logits, const std::int64_t* targets, const float* lse,
                            std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                            float eps, const float* grad_out, const float* count, float beta,
                            float* dlogits);
// Inverted dropout: out[i] = keep ? x[i] / (1 - p) : 0, keep when the uniform of Philox at
// counter (offset + i, stream) under seed is >= p. The same call on the upstream gradient is
// the backward (the mask is regenerated, never stored). out may alias x.
void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed, std::uint64_t stream,
             std::uint64_t offset, float* out);
// Layer norm over the last dimension of a rows x cols matrix (biased variance, as PyTorch):
// y = (x - mean) * rstd * weight + bias, weight and bias of cols elements or null.
void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                std::int64_t cols, float eps, float* y, float* mean, float* rstd);
// dx = beta * dx + rstd (gw - mean_c(gw) - xhat mean_c(gw xhat)), gw = g * weight.
void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* g, std::int64_t rows, std::int64_t cols, float beta,
                         float* dx);
// dweight[c] = beta * dweight + sum_r g xhat, dbias[c] = beta * dbias + sum_r g (either null).
void layer_norm_param_backward(const float* x, const float* mean, const float* rstd, const float* g,
                               std::int64_t rows, std::int64_t cols, float beta, float* dweight,
                               float* dbias);

}  // namespace nanoddp::kernels::cpu
