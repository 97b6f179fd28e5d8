// The CPU backend: a thin forwarder to kernels/cpu. CPU kernels run synchronously on
// the calling thread, so "enqueue on the stream" is simply "call it now".

#include "nanoddp/engine/cpu_backend.h"

#include <atomic>
#include <cstring>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {
namespace {

namespace kc = kernels::cpu;

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  Stream stream() const override { return Stream::compute(Device::cpu()); }

  // kHand: nanoddp's own kernels (kernels/cpu/gemm.cpp); kEigen: Eigen alone, the reference.
  void set_gemm_backend(GemmBackend backend) override {
    if (backend == GemmBackend::kCublas) {
      fail(
          "GEMM backend cublas is only available on CUDA devices; on the CPU use "
          "GemmBackend::kHand or kEigen");
    }
    gemm_backend_.store(backend, std::memory_order_relaxed);
  }
  GemmBackend gemm_backend() const override {
    return gemm_backend_.load(std::memory_order_relaxed);
  }

  void gemm(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    if (gemm_backend() == GemmBackend::kEigen) {
      kc::gemm_eigen(ta, tb, m, n, k, alpha, a, b, beta, c);
    } else {
      kc::gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
    }
  }
  void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                       Activation act, float* pre_activation) override {
    kc::bias_activation(y, bias, rows, cols, act, pre_activation);
  }
  void activation_backward(Activation act, const float* pre_activation, const float* grad_out,
                           float* grad_in, std::int64_t n) override {
    kc::activation_backward(act, pre_activation, grad_out, grad_in, n);
  }
  void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta,
                  float* out) override {
    kc::column_sum(x, rows, cols, beta, out);
  }
  void sum(const float* x, std::int64_t n, float* out) override { kc::sum(x, n, out); }
  void count_nonfinite(const float* x, std::int64_t n, float* out) override {
    kc::count_nonfinite(x, n, out);
  }
  void mse_forward(const float* pred, const float* target, std::int64_t n, float* out) override {
    kc::mse_forward(pred, target, n, out);
  }
  void mse_backward(const float* pred, const float* target, std::int64_t n, const float* grad_out,
                    float beta, float* grad_pred) override {
    kc::mse_backward(pred, target, n, grad_out, beta, grad_pred);
  }
  void fill(float* x, std::int64_t n, float value) override { kc::fill(x, n, value); }
  void scale(float* x, std::int64_t n, float alpha) override { kc::scale(x, n, alpha); }
  void axpy(std::int64_t n, float alpha, const float* x, float* y) override {
    kc::axpy(n, alpha, x, y);
  }
  void add(const float* a, const float* b, float alpha, float* out, std::int64_t n) override {
    kc::add(a, b, alpha, out, n);
  }
  void scale_copy(const float* x, float alpha, float* out, std::int64_t n) override {
    kc::scale_copy(x, alpha, out, n);
  }
  void broadcast_scalar(const float* scalar, float alpha, float beta, float* out,
                        std::int64_t n) override {
    kc::broadcast_scalar(scalar, alpha, beta, out, n);
  }
  void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
                const kernels::SgdHyper& h, bool first_step) override {
    kc::sgd_step(param, grad, momentum_buffer, n, h, first_step);
  }
  void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, const kernels::AdamWHyper& h) override {
    kc::adamw_step(param, grad, exp_avg, exp_avg_sq, n, h);
  }
  void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                    std::uint64_t offset, float lo, float hi) override {
    kc::fill_uniform(out, n, seed, stream_id, offset, lo, hi);
  }
  void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream_id,
                   std::uint64_t offset, float mean, float stddev) override {
    kc::fill_normal(out, n, seed, stream_id, offset, mean, stddev);
  }
  void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) override {
    kc::f32_to_bf16(in, out, n);
  }
  void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) override {
    kc::bf16_to_f32(in, out, n);
  }
  void unary(kernels::UnaryOp op, const float* x, float a, float b, float* out,
             std::int64_t n) override {
    kc::unary(op, x, a, b, out, n);
  }
  void unary_backward(kernels::UnaryOp op, const float* x, const float* y, float a, float b,
                      const float* grad_out, float* grad_in, std::int64_t n) override {
    kc::unary_backward(op, x, y, a, b, grad_out, grad_in, n);
  }
  void binary(kernels::BinaryOp op, const float* a, kernels::Broadcast ba, const float* b,
              kernels::Broadcast bb, float* out, std::int64_t n) override {
    kc::binary(op, a, ba, b, bb, out, n);
  }
  void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner, float beta,
              float* out) override {
    kc::sum_to(x, outer, mid, inner, beta, out);
  }
  void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
               float* out) override {
    kc::sum_dim(x, outer, d, inner, alpha, out);
  }
  void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                  float alpha, float beta, float* out) override {
    kc::expand_dim(x, outer, d, inner, alpha, beta, out);
  }
  void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
               float* values, std::int64_t* indices) override {
    kc::max_dim(x, outer, d, inner, values, indices);
  }
  void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer,
                      std::int64_t d, std::int64_t inner, float beta, float* out) override {
    kc::index_backward(g, indices, outer, d, inner, beta, out);
  }
  void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                         std::int64_t /*rows*/, std::int64_t dim, float* out) override {
    kc::embedding_forward(weight, indices, n, dim, out);
  }
  void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                          std::int64_t rows, std::int64_t dim, float beta,
                          float* grad_weight) override {
    kc::embedding_backward(g, indices, n, rows, dim, beta, grad_weight);
  }
  void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                  std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer, std::int64_t len,
                  std::int64_t inner, float beta) override {
    kc::copy_block(src, src_d, src_start, dst, dst_d, dst_start, outer, len, inner, beta);
  }
  void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta,
                 float* out) override {
    kc::transpose(x, rows, cols, beta, out);
  }
  void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, bool log,
               float* out) override {
    kc::softmax(x, outer, d, inner, log, out);
  }
  void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                        std::int64_t inner, bool log, float beta, float* dx) override {
    kc::softmax_backward(y, g, outer, d, inner, log, beta, dx);
  }
  void cross_entropy_rows(const float* logits, const std::int64_t* targets, std::int64_t rows,
                          std::int64_t classes, std::int64_t ignore_index, float eps,
                          float* row_loss, float* row_weight, float* lse) override {
    kc::cross_entropy_rows(logits, targets, rows, classes, ignore_index, eps, row_loss, row_weight,
                           lse);
  }
  void cross_entropy_backward(const float* logits, const std::int64_t* targets, const float* lse,
                              std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                              float eps, const float* grad_out, const float* count, float beta,
                              float* dlogits) override {
    kc::cross_entropy_backward(logits, targets, lse, rows, classes, ignore_index, eps, grad_out,
                               count, beta, dlogits);
  }
  void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed, std::uint64_t stream_id,
               std::uint64_t offset, float* out) override {
    kc::dropout(x, n, p, seed, stream_id, offset, out);
  }
  void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                  std::int64_t cols, float eps, float* y, float* mean, float* rstd) override {
    kc::layer_norm(x, weight, bias, rows, cols, eps, y, mean, rstd);
  }
  void layer_norm_backward(const float* x, const float* weight, const float* mean,
                           const float* rstd, const float* g, std::int64_t rows, std::int64_t cols,
                           float beta, float* dx) override {
    kc::layer_norm_backward(x, weight, mean, rstd, g, rows, cols, beta, dx);
  }
  void layer_norm_param_backward(const float* x, const float* mean, const float* rstd,
                                 const float* g, std::int64_t rows, std::int64_t cols, float beta,
                                 float* dweight, float* dbias) override {
    kc::layer_norm_param_backward(x, mean, rstd, g, rows, cols, beta, dweight, dbias);
  }
  void copy(void* dst, const void* src, std::size_t nbytes) override {
    // memcpy with nbytes == 0 is fine, but null pointers are undefined behaviour even then.
    if (nbytes != 0) std::memcpy(dst, src, nbytes);
  }

 private:
  std::atomic<GemmBackend> gemm_backend_{GemmBackend::kHand};
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace nanoddp
