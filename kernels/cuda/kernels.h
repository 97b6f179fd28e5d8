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
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                std::int64_t n, const AdamWHyper& h, cudaStream_t stream);

void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                  std::uint64_t offset, float lo, float hi, cudaStream_t stream);
void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                 std::uint64_t offset, float mean, float stddev, cudaStream_t stream);

void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n, cudaStream_t stream);
void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n, cudaStream_t stream);

}  // namespace nanoddp::kernels::cuda
