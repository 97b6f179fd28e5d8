#pragma once
// CUDA kernels: the twins of kernels/cpu/kernels.h, with the same names, arguments and
// meaning, plus the stream they are enqueued on (they never synchronize). All pointers are
// device pointers, including the one-element scalars (loss, upstream gradient). This header does
// not need the CUDA headers, so host code that only dispatches can include it.

#include <cstdint>

#include "nanoddp/kernels/types.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct cublasContext* cublasHandle_t;

namespace nanoddp::kernels::cuda {

// Hand-written tiled shared-memory GEMM, correct for any m, n, k (not only tile multiples).
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c, cudaStream_t stream);

// The same contract through cuBLAS (the reference for the hand kernel). The handle must already
// be bound to `stream` (cublasSetStream).
void gemm_cublas(cublasHandle_t handle, Transpose trans_a, Transpose trans_b, std::int64_t m,
                 std::int64_t n, std::int64_t k, float alpha, const float* a, const float* b,
                 float beta, float* c);

void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                     Activation act, float* pre_activation, cudaStream_t stream);
void activation_backward(Activation act, const float* pre_activation, const float* grad_out,
                         float* grad_in, std::int64_t n, cudaStream_t stream);

void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out,
                cudaStream_t stream);
void sum(const float* x, std::int64_t n, float* out, cudaStream_t stream);
void count_nonfinite(const float* x, std::int64_t n, float* out, cudaStream_t stream);

void mse_forward(const float* pred, const float* target, std::int64_t n, float* out,
                 cudaStream_t stream);
void mse_backward(const float* pred, const float* target, std::int64_t n, const float* grad_out,
                  float beta, float* grad_pred, cudaStream_t stream);

void fill(float* x, std::int64_t n, float value, cudaStream_t stream);
void scale(float* x, std::int64_t n, float alpha, cudaStream_t stream);
void axpy(std::int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
void add(const float* a, const float* b, float alpha, float* out, std::int64_t n,
         cudaStream_t stream);
void scale_copy(const float* x, float alpha, float* out, std::int64_t n, cudaStream_t stream);
void broadcast_scalar(const float* scalar, float alpha, float beta, float* out, std::int64_t n,
                      cudaStream_t stream);

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
              const SgdHyper& h, bool first_step, cudaStream_t stream);
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWHyper& h, cudaStream_t stream);

void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                  std::uint64_t offset, float lo, float hi, cudaStream_t stream);
void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                 std::uint64_t offset, float mean, float stddev, cudaStream_t stream);

void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n, cudaStream_t stream);
void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n, cudaStream_t stream);

// ---- the research ops (pointwise.cu, shape.cu, rowwise.cu) ---------------------------
// Tensors of any rank are seen as [outer, d, inner] around the dimension an op works along:
// element (o, j, i) is at (o * d + j) * inner + i.

// out = op(x; a, b), see UnaryOp. out may alias x.
void unary(UnaryOp op, const float* x, float a, float b, float* out, std::int64_t n,
           cudaStream_t stream);
// grad_in = grad_out * op'(x), from x or from the forward's output y (both given; either may be
// unused). grad_in may alias grad_out. Clamp passes the gradient where a <= x <= b (PyTorch).
void unary_backward(UnaryOp op, const float* x, const float* y, float a, float b,
                    const float* grad_out, float* grad_in, std::int64_t n, cudaStream_t stream);
// out[i] = a[(i / ba.div) % ba.mod] op b[(i / bb.div) % bb.mod], i < n. out may alias an
// operand that is not broadcast.
void binary(BinaryOp op, const float* a, Broadcast ba, const float* b, Broadcast bb, float* out,
            std::int64_t n, cudaStream_t stream);
// out[j] = beta * out[j] + sum over o, i of x[o, j, i]: the gradient of a broadcast operand.
void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner, float beta,
            float* out, cudaStream_t stream);
// out[o, i] = alpha * sum over j of x[o, j, i]: sum (alpha 1) and mean (1 / d) over a dim.
void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
             float* out, cudaStream_t stream);
// out[o, j, i] = beta * out[o, j, i] + alpha * x[o, i]: the backward of sum_dim.
void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
                float beta, float* out, cudaStream_t stream);
// values[o, i] = max over j of x[o, j, i], indices[o, i] = its j (the first on ties; a NaN wins,
// as in PyTorch).
void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float* values,
             std::int64_t* indices, cudaStream_t stream);
// out[o, j, i] = beta * out[o, j, i] + (j == indices[o, i] ? g[o, i] : 0): max's backward.
void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer, std::int64_t d,
                    std::int64_t inner, float beta, float* out, cudaStream_t stream);
// For every o: dst[o, dst_start .. + len, :] = beta * dst + src[o, src_start .. + len, :], with
// src seen as [outer, src_d, inner] and dst as [outer, dst_d, inner]. narrow, cat and split,
// forward and backward.
void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer, std::int64_t len,
                std::int64_t inner, float beta, cudaStream_t stream);
// out[i, :] = weight[indices[i], :] for i < n, rows of `dim` (embedding.cu). An index outside
// [0, rows) gives a row of NaN (the host does not wait to check them).
void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                       std::int64_t rows, std::int64_t dim, float* out, cudaStream_t stream);
// grad_weight = beta * grad_weight, then grad_weight[indices[i], :] += g[i, :] with atomicAdd
// (a repeated index sums its rows in no fixed order: last-bit differences between runs); an
// index outside [0, rows) adds nothing.
void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                        std::int64_t rows, std::int64_t dim, float beta, float* grad_weight,
                        cudaStream_t stream);
// out[c, r] = beta * out[c, r] + x[r, c] for a rows x cols matrix x.
void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out,
               cudaStream_t stream);
// Softmax (or log-softmax) along d, with the maximum subtracted first (no overflow).
void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, bool log,
             float* out, cudaStream_t stream);
// From the forward's output y: softmax dx = y (g - sum_j g y); log-softmax dx = g - exp(y) sum_j g.
// dx = beta * dx + that.
void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                      std::int64_t inner, bool log, float beta, float* dx, cudaStream_t stream);
// Cross-entropy of rows x classes logits against class indices, per row: row_loss[r] =
// (1 - eps) (lse - x[t]) + eps (lse - mean_c x[c]) and row_weight[r] = 1, or both 0 where
// t == ignore_index; lse[r] = log sum_c exp(x[r, c]) is kept for the backward. A target outside
// [0, classes) gives a NaN row loss.
void cross_entropy_rows(const float* logits, const std::int64_t* targets, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, float eps, float* row_loss,
                        float* row_weight, float* lse, cudaStream_t stream);
// dlogits[r, c] = beta * dlogits + g[0] / count[0] * (softmax[r, c] - (1 - eps) [c == t] -
// eps / classes), zero on ignored rows: the backward of the mean over the counted rows.
void cross_entropy_backward(const float* logits, const std::int64_t* targets, const float* lse,
                            std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                            float eps, const float* grad_out, const float* count, float beta,
                            float* dlogits, cudaStream_t stream);
// Inverted dropout: out[i] = keep ? x[i] / (1 - p) : 0, keep when the uniform of Philox at
// counter (offset + i, stream_id) under seed is >= p. The same call on the upstream gradient is
// the backward (the mask is regenerated, never stored). out may alias x.
void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed, std::uint64_t stream_id,
             std::uint64_t offset, float* out, cudaStream_t stream);
// Layer norm over the last dimension of a rows x cols matrix (biased variance, as PyTorch):
// y = (x - mean) * rstd * weight + bias, weight and bias of cols elements or null.
void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                std::int64_t cols, float eps, float* y, float* mean, float* rstd,
                cudaStream_t stream);
// dx = beta * dx + rstd (gw - mean_c(gw) - xhat mean_c(gw xhat)), gw = g * weight.
void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* g, std::int64_t rows, std::int64_t cols, float beta,
                         float* dx, cudaStream_t stream);
// dweight[c] = beta * dweight + sum_r g xhat, dbias[c] = beta * dbias + sum_r g (either null).
void layer_norm_param_backward(const float* x, const float* mean, const float* rstd, const float* g,
                               std::int64_t rows, std::int64_t cols, float beta, float* dweight,
                               float* dbias, cudaStream_t stream);

}  // namespace nanoddp::kernels::cuda
