// The CUDA Backend: forwards every op to kernels/cuda on the device's compute stream.
// Every call first makes the backend's device current (a no-op check in the usual one device per
// process setup), since kernels launch on the current device.

#include "nanoddp/engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "nanoddp/engine/cuda/device_guard.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/cuda/check.h"
#include "nanoddp/kernels/cuda/kernels.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {
namespace {

namespace kc = kernels::cuda;
using Guard = detail::CudaDeviceGuard;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Device device)
      : device_(device),
        stream_(Stream::compute(device)),
        native_(static_cast<cudaStream_t>(stream_.native())) {
    Guard guard(device_.index);
    NANODDP_CUBLAS_CHECK(cublasCreate(&cublas_));
    // Bound once: every cuBLAS call of this backend runs on the compute stream, ordered with our
    // own kernels. The default math mode keeps full float32 (no TF32 tensor cores), so cuBLAS
    // is a faithful reference for the hand kernel.
    NANODDP_CUBLAS_CHECK(cublasSetStream(cublas_, native_));
    NANODDP_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  }
  // Backends live until the process ends (see cuda_backend), so the handle is never destroyed:
  // doing it from a static destructor could run after the CUDA runtime has shut down.
  ~CudaBackend() override = default;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return device_; }
  // Every op: its device current, and its name noted for fault messages (note_device_op).
  Guard enter(const char* op) const {
    note_device_op(op);
    return Guard(device_.index);
  }
  Stream stream() const override { return stream_; }

  void set_gemm_backend(GemmBackend backend) override {
    if (backend == GemmBackend::kEigen) {
      fail("GEMM backend eigen runs on the CPU only; on {} use GemmBackend::kHand or kCublas",
           device_.str());
    }
    gemm_backend_ = backend;
  }
  GemmBackend gemm_backend() const override { return gemm_backend_; }

  void gemm(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    const Guard guard = enter("gemm");
    if (gemm_backend_ == GemmBackend::kCublas) {
      // A cuBLAS handle is not safe for concurrent calls (gemm_cublas sets its pointer mode),
      // and nothing stops two host threads from computing on one device.
      const std::lock_guard lock(cublas_mutex_);
      kc::gemm_cublas(cublas_, ta, tb, m, n, k, alpha, a, b, beta, c);
    } else {
      kc::gemm(ta, tb, m, n, k, alpha, a, b, beta, c, native_);
    }
  }
  void bias_activation(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                       Activation act, float* pre_activation) override {
    const Guard guard = enter("bias_activation");
    kc::bias_activation(y, bias, rows, cols, act, pre_activation, native_);
  }
  void activation_backward(Activation act, const float* pre_activation, const float* grad_out,
                           float* grad_in, std::int64_t n) override {
    const Guard guard = enter("activation_backward");
    kc::activation_backward(act, pre_activation, grad_out, grad_in, n, native_);
  }
  void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta,
                  float* out) override {
    const Guard guard = enter("column_sum");
    kc::column_sum(x, rows, cols, beta, out, native_);
  }
  void sum(const float* x, std::int64_t n, float* out) override {
    const Guard guard = enter("sum");
    kc::sum(x, n, out, native_);
  }
  void count_nonfinite(const float* x, std::int64_t n, float* out) override {
    const Guard guard = enter("count_nonfinite");
    kc::count_nonfinite(x, n, out, native_);
  }
  void mse_forward(const float* pred, const float* target, std::int64_t n, float* out) override {
    const Guard guard = enter("mse_forward");
    kc::mse_forward(pred, target, n, out, native_);
  }
  void mse_backward(const float* pred, const float* target, std::int64_t n, const float* grad_out,
                    float beta, float* grad_pred) override {
    const Guard guard = enter("mse_backward");
    kc::mse_backward(pred, target, n, grad_out, beta, grad_pred, native_);
  }
  void fill(float* x, std::int64_t n, float value) override {
    const Guard guard = enter("fill");
    kc::fill(x, n, value, native_);
  }
  void scale(float* x, std::int64_t n, float alpha) override {
    const Guard guard = enter("scale");
    kc::scale(x, n, alpha, native_);
  }
  void axpy(std::int64_t n, float alpha, const float* x, float* y) override {
    const Guard guard = enter("axpy");
    kc::axpy(n, alpha, x, y, native_);
  }
  void add(const float* a, const float* b, float alpha, float* out, std::int64_t n) override {
    const Guard guard = enter("add");
    kc::add(a, b, alpha, out, n, native_);
  }
  void scale_copy(const float* x, float alpha, float* out, std::int64_t n) override {
    const Guard guard = enter("scale_copy");
    kc::scale_copy(x, alpha, out, n, native_);
  }
  void broadcast_scalar(const float* scalar, float alpha, float beta, float* out,
                        std::int64_t n) override {
    const Guard guard = enter("broadcast_scalar");
    kc::broadcast_scalar(scalar, alpha, beta, out, n, native_);
  }
  void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n,
                const kernels::SgdHyper& h, bool first_step) override {
    const Guard guard = enter("sgd_step");
    kc::sgd_step(param, grad, momentum_buffer, n, h, first_step, native_);
  }
  void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, const kernels::AdamWHyper& h) override {
    const Guard guard = enter("adamw_step");
    kc::adamw_step(param, grad, exp_avg, exp_avg_sq, n, h, native_);
  }
  void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                    std::uint64_t offset, float lo, float hi) override {
    const Guard guard = enter("fill_uniform");
    kc::fill_uniform(out, n, seed, stream, offset, lo, hi, native_);
  }
  void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                   std::uint64_t offset, float mean, float stddev) override {
    const Guard guard = enter("fill_normal");
    kc::fill_normal(out, n, seed, stream, offset, mean, stddev, native_);
  }
  void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) override {
    const Guard guard = enter("f32_to_bf16");
    kc::f32_to_bf16(in, out, n, native_);
  }
  void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) override {
    const Guard guard = enter("bf16_to_f32");
    kc::bf16_to_f32(in, out, n, native_);
  }
  void unary(kernels::UnaryOp op, const float* x, float a, float b, float* out,
             std::int64_t n) override {
    const Guard guard = enter("unary");
    kc::unary(op, x, a, b, out, n, native_);
  }
  void unary_backward(kernels::UnaryOp op, const float* x, const float* y, float a, float b,
                      const float* grad_out, float* grad_in, std::int64_t n) override {
    const Guard guard = enter("unary_backward");
    kc::unary_backward(op, x, y, a, b, grad_out, grad_in, n, native_);
  }
  void binary(kernels::BinaryOp op, const float* a, kernels::Broadcast ba, const float* b,
              kernels::Broadcast bb, float* out, std::int64_t n) override {
    const Guard guard = enter("binary");
    kc::binary(op, a, ba, b, bb, out, n, native_);
  }
  void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner, float beta,
              float* out) override {
    const Guard guard = enter("sum_to");
    kc::sum_to(x, outer, mid, inner, beta, out, native_);
  }
  void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
               float* out) override {
    const Guard guard = enter("sum_dim");
    kc::sum_dim(x, outer, d, inner, alpha, out, native_);
  }
  void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                  float alpha, float beta, float* out) override {
    const Guard guard = enter("expand_dim");
    kc::expand_dim(x, outer, d, inner, alpha, beta, out, native_);
  }
  void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner,
               float* values, std::int64_t* indices) override {
    const Guard guard = enter("max_dim");
    kc::max_dim(x, outer, d, inner, values, indices, native_);
  }
  void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer,
                      std::int64_t d, std::int64_t inner, float beta, float* out) override {
    const Guard guard = enter("index_backward");
    kc::index_backward(g, indices, outer, d, inner, beta, out, native_);
  }
  void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                         std::int64_t rows, std::int64_t dim, float* out) override {
    const Guard guard = enter("embedding_forward");
    kc::embedding_forward(weight, indices, n, rows, dim, out, native_);
  }
  void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                          std::int64_t rows, std::int64_t dim, float beta,
                          float* grad_weight) override {
    const Guard guard = enter("embedding_backward");
    kc::embedding_backward(g, indices, n, rows, dim, beta, grad_weight, native_);
  }
  void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                  std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer, std::int64_t len,
                  std::int64_t inner, float beta) override {
    const Guard guard = enter("copy_block");
    kc::copy_block(src, src_d, src_start, dst, dst_d, dst_start, outer, len, inner, beta, native_);
  }
  void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta,
                 float* out) override {
    const Guard guard = enter("transpose");
    kc::transpose(x, rows, cols, beta, out, native_);
  }
  void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, bool log,
               float* out) override {
    const Guard guard = enter("softmax");
    kc::softmax(x, outer, d, inner, log, out, native_);
  }
  void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                        std::int64_t inner, bool log, float beta, float* dx) override {
    const Guard guard = enter("softmax_backward");
    kc::softmax_backward(y, g, outer, d, inner, log, beta, dx, native_);
  }
  void cross_entropy_rows(const float* logits, const std::int64_t* targets, std::int64_t rows,
                          std::int64_t classes, std::int64_t ignore_index, float eps,
                          float* row_loss, float* row_weight, float* lse) override {
    const Guard guard = enter("cross_entropy_rows");
    kc::cross_entropy_rows(logits, targets, rows, classes, ignore_index, eps, row_loss, row_weight,
                           lse, native_);
  }
  void cross_entropy_backward(const float* logits, const std::int64_t* targets, const float* lse,
                              std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                              float eps, const float* grad_out, const float* count, float beta,
                              float* dlogits) override {
    const Guard guard = enter("cross_entropy_backward");
    kc::cross_entropy_backward(logits, targets, lse, rows, classes, ignore_index, eps, grad_out,
                               count, beta, dlogits, native_);
  }
  void dropout(const float* x, std::int64_t n, float p, std::uint64_t seed, std::uint64_t stream_id,
               std::uint64_t offset, float* out) override {
    const Guard guard = enter("dropout");
    kc::dropout(x, n, p, seed, stream_id, offset, out, native_);
  }
  void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                  std::int64_t cols, float eps, float* y, float* mean, float* rstd) override {
    const Guard guard = enter("layer_norm");
    kc::layer_norm(x, weight, bias, rows, cols, eps, y, mean, rstd, native_);
  }
  void layer_norm_backward(const float* x, const float* weight, const float* mean,
                           const float* rstd, const float* g, std::int64_t rows, std::int64_t cols,
                           float beta, float* dx) override {
    const Guard guard = enter("layer_norm_backward");
    kc::layer_norm_backward(x, weight, mean, rstd, g, rows, cols, beta, dx, native_);
  }
  void layer_norm_param_backward(const float* x, const float* mean, const float* rstd,
                                 const float* g, std::int64_t rows, std::int64_t cols, float beta,
                                 float* dweight, float* dbias) override {
    const Guard guard = enter("layer_norm_param_backward");
    kc::layer_norm_param_backward(x, mean, rstd, g, rows, cols, beta, dweight, dbias, native_);
  }
  void copy(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes == 0 || dst == src) return;
    const Guard guard = enter("copy");
    NANODDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, native_));
  }

 private:
  Device device_;
  Stream stream_;
  cudaStream_t native_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::mutex cublas_mutex_;  // one call at a time on cublas_
  GemmBackend gemm_backend_ = GemmBackend::kHand;
};

}  // namespace

Backend& cuda_backend(int index) {
  const Device device = Device::cuda(index);
  require_device(device);
  static std::mutex mutex;
  // Intentionally leaked (see ~CudaBackend): one backend per device for the process lifetime.
  static auto* backends = new std::unordered_map<int, CudaBackend*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = backends->find(index);
  if (it == backends->end()) it = backends->emplace(index, new CudaBackend(device)).first;
  return *it->second;
}

}  // namespace nanoddp
