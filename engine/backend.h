#pragma once
// Op dispatch: one Backend per device, the table of kernels an op may call on that device's
// buffers. The CPU backend forwards to kernels/cpu, the CUDA backend to
// kernels/cuda on the device's compute stream. Ops (engine/ops.cpp) only ever talk to
// this interface, so an op is written once for every device.

#include <cstddef>
#include <cstdint>

#include "nanoddp/engine/device.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/kernels/types.h"

namespace nanoddp {

using kernels::Activation;
using kernels::Transpose;

// Which GEMM a backend uses: nanoddp's own kernels (the default on every device), or the
// library each is held against: Eigen on the CPU, cuBLAS on CUDA.
enum class GemmBackend { kHand, kEigen, kCublas };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Stream stream() const = 0;

  virtual void set_gemm_backend(GemmBackend backend) = 0;
  virtual GemmBackend gemm_backend() const = 0;

  virtual void gemm(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k,
                    float alpha, const float* a, const float* b, float beta, float* c) = 0;
  virtual void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                               Activation act, float* pre_activation) = 0;
  virtual void activation_backward(Activation act, const float* pre_activation,
                                   const float* grad_out, float* grad_in, std::int64_t n) = 0;
  virtual void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta,
                          float* out) = 0;
  virtual void sum(const float* x, std::int64_t n, float* out) = 0;
  virtual void count_nonfinite(const float* x, std::int64_t n, float* out) = 0;
  virtual void mse_forward(const float* pred, const float* target, std::int64_t n, float* out) = 0;
  virtual void mse_backward(const float* pred, const float* target, std::int64_t n,
                            const float* grad_out, float beta, float* grad_pred) = 0;
  virtual void fill(float* x, std::int64_t n, float value) = 0;
  virtual void scale(float* x, std::int64_t n, float alpha) = 0;
  virtual void axpy(std::int64_t n, float alpha, const float* x, float* y) = 0;
  virtual void add(const float* a, const float* b, float alpha, float* out, std::int64_t n) = 0;
  virtual void scale_copy(const float* x, float alpha, float* out, std::int64_t n) = 0;
  virtual void broadcast_scalar(const float* scalar, float alpha, float beta, float* out,
                                std::int64_t n) = 0;
  virtual void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
                        const kernels::SgdHyper& h, bool first_step) = 0;
  virtual void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                          std::int64_t n, const kernels::AdamWHyper& h) = 0;
  virtual void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                            std::uint64_t offset, float lo, float hi) = 0;
  virtual void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                           std::uint64_t offset, float mean, float stddev) = 0;
  virtual void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) = 0;
  virtual void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) = 0;
  // The research ops (engine/functional.h); see kernels/cpu/kernels.h for each contract.
  virtual void unary(kernels::UnaryOp op, const float* x, float a, float b, float* out,
                     std::int64_t n) = 0;
  virtual void unary_backward(kernels::UnaryOp op, const float* x, const float* y, float a, float b,
                              const float* grad_out, float* grad_in, std::int64_t n) = 0;
  virtual void binary(kernels::BinaryOp op, const float* a, kernels::Broadcast ba, const float* b,
                      kernels::Broadcast bb, float* out, std::int64_t n) = 0;
  virtual void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner,
                      float beta, float* out) = 0;
  virtual void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                       float alpha, float* out) = 0;
  virtual void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                          float alpha, float beta, float* out) = 0;
  virtual void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                       float* values, std::int64_t* indices) = 0;
  virtual void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer,
                              std::int64_t d, std::int64_t inner, float beta, float* out) = 0;
  virtual void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                          std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer,
                          std::int64_t len, std::int64_t inner, float beta) = 0;
  virtual void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta,
                         float* out) = 0;
  virtual void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                                 std::int64_t rows, std::int64_t dim, float* out) = 0;
  virtual void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                                  std::int64_t rows, std::int64_t dim, float beta,
                                  float* grad_weight) = 0;
  virtual void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                       bool log, float* out) = 0;
  virtual void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                                std::int64_t inner, bool log, float beta, float* dx) = 0;
  virtual void cross_entropy_rows(const float* logits, const std::int64_t* targets,
                                  std::int64_t rows, std::int64_t classes,
                                  std::int64_t ignore_index, float eps, float* row_loss,
                                  float* row_weight, float* lse) = 0;
  virtual void cross_entropy_backward(const float* logits, const std::int64_t* targets,
                                      const float* lse, std::int64_t rows, std::int64_t classes,
                                      std::int64_t ignore_index, float eps, const float* grad_out,
                                      const float* count, float beta, float* dlogits) = 0;
  virtual void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed,
                       std::uint64_t stream_id, std::uint64_t offset, float* out) = 0;
  virtual void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                          std::int64_t cols, float eps, float* y, float* mean, float* rstd) = 0;
  virtual void layer_norm_backward(const float* x, const float* weight, const float* mean,
                                   const float* rstd, const float* g, std::int64_t rows,
                                   std::int64_t cols, float beta, float* dx) = 0;
  virtual void layer_norm_param_backward(const float* x, const float* mean, const float* rstd,
                                         const float* g, std::int64_t rows, std::int64_t cols,
                                         float beta, float* dweight, float* dbias) = 0;
  // Same-device copy of raw bytes, in stream order.
  virtual void copy(void* dst, const void* src, std::size_t nbytes) = 0;
};

// The backend of a device. CUDA devices fail with a clear Error when CUDA is unavailable.
Backend& backend_for(Device device);

}  // namespace nanoddp
