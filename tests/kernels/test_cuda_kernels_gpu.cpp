// The CUDA kernels against their CPU twins (kernels/cpu), on random inputs whose sizes
// are deliberately not multiples of any tile or block size, plus the CUDA runtime pieces of the
// engine (streams, events, device checks, raw memory, the backend). Runs only where a GPU is
// (tests/support/gpu_main.cpp skips with code 77 otherwise).
//
// Outputs that a kernel must overwrite without reading (beta == 0) are poisoned with NaN first:
// a kernel that reads them anyway turns the result into NaN and fails loudly.
//
// In a build without CUDA (NANODDP_CUDA=OFF) this file compiles to nothing: the CUDA headers
// are not there, and the test binary's main skips anyway.

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cuda/cuda_backend.h"
#include "nanoddp/engine/cuda/cuda_memory.h"
#include "nanoddp/engine/cuda/device_guard.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/cuda/check.h"
#include "nanoddp/kernels/cuda/kernels.h"
#include "support/subprocess.h"

namespace {

namespace cpu = nanoddp::kernels::cpu;
namespace gpu = nanoddp::kernels::cuda;
using nanoddp::Device;
using nanoddp::kernels::Activation;
using nanoddp::kernels::AdamWHyper;
using nanoddp::kernels::SgdHyper;
using nanoddp::kernels::Transpose;

// A device buffer of T with host round trips. The kernels run on the compute stream, which is
// a non-blocking stream: plain cudaMemcpy/cudaMemset (legacy default stream) are NOT ordered
// with it, and an upload from pageable memory or a memset may still be in flight when the call
// returns. So every transfer is fenced by a device-wide synchronization on both sides.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ > 0) NANODDP_CUDA_CHECK(cudaMalloc(&ptr_, count_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  std::size_t size() const { return count_; }

  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == count_);
    if (count_ == 0) return;
    NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
    NANODDP_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
    NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ == 0) return host;
    NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
    NANODDP_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bytes 0xff: for float that is a NaN, so reading it poisons any result.
  void poison() {
    if (count_ == 0) return;
    NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
    NANODDP_CUDA_CHECK(cudaMemset(ptr_, 0xff, count_ * sizeof(T)));
    NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

using DeviceFloats = DeviceBuffer<float>;

// The stream the kernels are enqueued on: the device's compute stream (a non-blocking stream, so
// every check goes through DeviceBuffer's device-wide synchronization).
cudaStream_t test_stream() {
  return static_cast<cudaStream_t>(nanoddp::Stream::compute(Device::cuda(0)).native());
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Element-wise |got - want| <= atol + rtol * |want|. Reports the count and the first mismatch,
// instead of one doctest failure per element.
void check_close(const std::vector<float>& got, const std::vector<float>& want, float rtol,
                 float atol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float g = got[i], w = want[i];
    const bool ok = (std::isnan(g) && std::isnan(w)) || (g == w) ||  // also equal infinities
                    std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ; first at " << first
            << ": gpu " << (bad ? got[first] : 0.0f) << " vs cpu " << (bad ? want[first] : 0.0f));
  CHECK(bad == 0);
}

void check_bits_equal(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) &&
        bad++ == 0) {
      first = i;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ in their bits; first at "
            << first);
  CHECK(bad == 0);
}

struct GemmShape {
  std::int64_t m, n, k;
};

// The shapes every GEMM test runs: 1x1x1, shapes smaller than one tile, shapes just past tile
// multiples in every dimension, a tall-skinny one and an empty inner dimension.
const GemmShape kGemmShapes[] = {{1, 1, 1},    {17, 33, 5},  {129, 257, 65}, {64, 64, 16},
                                 {65, 63, 17}, {1000, 3, 7}, {3, 1000, 300}, {2, 5, 0},
                                 {31, 1, 129}, {200, 130, 1}};

struct AlphaBeta {
  float alpha, beta;
};
const AlphaBeta kAlphaBetas[] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}, {2.0f, 0.0f}};

const char* layout_name(Transpose ta, Transpose tb) {
  if (ta == Transpose::kNo) return tb == Transpose::kNo ? "NN" : "NT";
  return tb == Transpose::kNo ? "TN" : "TT";
}

enum class GemmImpl { kHand, kCublas };

void run_gemm_case(GemmImpl impl, cublasHandle_t handle, Transpose ta, Transpose tb,
                   const GemmShape& s, const AlphaBeta& ab, std::uint32_t seed) {
  const auto a_host = random_floats(static_cast<std::size_t>(s.m * s.k), seed);
  const auto b_host = random_floats(static_cast<std::size_t>(s.k * s.n), seed + 1);
  auto c_host = random_floats(static_cast<std::size_t>(s.m * s.n), seed + 2);
  DeviceFloats a(a_host), b(b_host), c(c_host);
  if (ab.beta == 0.0f) {
    // beta == 0 promises that C is never read: poison both sides.
    c.poison();
    std::fill(c_host.begin(), c_host.end(), std::numeric_limits<float>::quiet_NaN());
  }
  cpu::gemm(ta, tb, s.m, s.n, s.k, ab.alpha, a_host.data(), b_host.data(), ab.beta, c_host.data());
  if (impl == GemmImpl::kHand) {
    gpu::gemm(ta, tb, s.m, s.n, s.k, ab.alpha, a.get(), b.get(), ab.beta, c.get(), test_stream());
  } else {
    gpu::gemm_cublas(handle, ta, tb, s.m, s.n, s.k, ab.alpha, a.get(), b.get(), ab.beta, c.get());
  }
  // Each output is a k-term dot product of values in [-1, 1]: float32 rounding grows ~ sqrt(k).
  const float atol = 1e-5f * static_cast<float>(s.k + 1);
  check_close(c.download(), c_host, 1e-4f, atol,
              std::string(impl == GemmImpl::kHand ? "hand " : "cublas ") + layout_name(ta, tb) +
                  " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                  " k=" + std::to_string(s.k) + " alpha=" + std::to_string(ab.alpha) +
                  " beta=" + std::to_string(ab.beta));
}

void run_all_gemm_cases(GemmImpl impl, cublasHandle_t handle) {
  std::uint32_t seed = 100;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      for (const GemmShape& shape : kGemmShapes) {
        for (const AlphaBeta& ab : kAlphaBetas)
          run_gemm_case(impl, handle, ta, tb, shape, ab, ++seed);
      }
    }
  }
}

class CublasHandle {
 public:
  CublasHandle() {
    NANODDP_CUBLAS_CHECK(cublasCreate(&handle_));
    NANODDP_CUBLAS_CHECK(cublasSetStream(handle_, test_stream()));
  }
  ~CublasHandle() { (void)cublasDestroy(handle_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

const std::int64_t kElementwiseSizes[] = {1, 3, 255, 1000, 4097, 1 << 20};

}  // namespace

// ---- GEMM ---------------------------------------------------------------------------------

TEST_CASE("cuda gemm: hand kernel matches the CPU for all layouts, shapes, alpha and beta") {
  run_all_gemm_cases(GemmImpl::kHand, nullptr);
}

TEST_CASE("cuda gemm: cuBLAS matches the CPU for all layouts, shapes, alpha and beta") {
  CublasHandle handle;
  run_all_gemm_cases(GemmImpl::kCublas, handle.get());
}

TEST_CASE("cuda gemm: alpha == 0 never reads A and B (BLAS semantics), for both GEMMs") {
  const std::int64_t m = 5, n = 70, k = 9;
  const std::vector<float> poison(std::max(m, n) * k, std::numeric_limits<float>::infinity());
  const auto c_host = random_floats(m * n, 11);
  DeviceFloats a(poison), b(poison), c(m * n);
  CublasHandle handle;
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    for (bool use_cublas : {false, true}) {
      std::vector<float> want = c_host;
      c.upload(c_host);
      if (beta == 0.0f) {
        c.poison();
        std::fill(want.begin(), want.end(), std::numeric_limits<float>::quiet_NaN());
      }
      cpu::gemm(Transpose::kNo, Transpose::kNo, m, n, k, 0.0f, poison.data(), poison.data(), beta,
                want.data());
      if (use_cublas) {
        gpu::gemm_cublas(handle.get(), Transpose::kNo, Transpose::kNo, m, n, k, 0.0f, a.get(),
                         b.get(), beta, c.get());
      } else {
        gpu::gemm(Transpose::kNo, Transpose::kNo, m, n, k, 0.0f, a.get(), b.get(), beta, c.get(),
                  test_stream());
      }
      check_close(
          c.download(), want, 0.0f, 0.0f,
          std::string(use_cublas ? "cublas" : "hand") + " alpha 0 beta " + std::to_string(beta));
    }
  }
}

TEST_CASE("cuda gemm: an empty output is a no-op") {
  DeviceFloats c(4);
  c.upload({1, 2, 3, 4});
  gpu::gemm(Transpose::kNo, Transpose::kNo, 0, 4, 3, 1.0f, nullptr, nullptr, 0.0f, c.get(),
            test_stream());
  gpu::gemm(Transpose::kNo, Transpose::kNo, 4, 0, 3, 1.0f, nullptr, nullptr, 0.0f, c.get(),
            test_stream());
  CHECK(c.download() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("cuda backend: gemm dispatches to the hand kernel or cuBLAS, both correct") {
  nanoddp::Backend& backend = nanoddp::cuda_backend(0);
  CHECK(backend.device() == Device::cuda(0));
  CHECK(backend.gemm_backend() == nanoddp::GemmBackend::kHand);
  const std::int64_t m = 77, n = 45, k = 130;
  const auto a_host = random_floats(m * k, 1), b_host = random_floats(k * n, 2);
  std::vector<float> want(m * n);
  cpu::gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a_host.data(), b_host.data(), 0.0f,
            want.data());
  DeviceFloats a(a_host), b(b_host), c(m * n);
  for (auto which : {nanoddp::GemmBackend::kHand, nanoddp::GemmBackend::kCublas}) {
    backend.set_gemm_backend(which);
    CHECK(backend.gemm_backend() == which);
    c.poison();
    backend.gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.get(), b.get(), 0.0f, c.get());
    check_close(c.download(), want, 1e-4f, 1e-3f, "backend gemm");
  }
  backend.set_gemm_backend(nanoddp::GemmBackend::kHand);
}

// ---- bias + activation ----------------------------------------------------------------------

TEST_CASE("cuda bias_activation matches the CPU (with and without bias / pre-activation)") {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {1000, 3}, {17, 33}, {129, 257}};
  std::uint32_t seed = 7;
  for (auto [rows, cols] : shapes) {
    for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
      for (bool with_bias : {false, true}) {
        for (bool with_pre : {false, true}) {
          const auto y_host = random_floats(rows * cols, ++seed, -3.0f, 3.0f);
          const auto bias_host = random_floats(cols, ++seed);
          auto y_want = y_host;
          std::vector<float> pre_want(rows * cols, std::numeric_limits<float>::quiet_NaN());
          cpu::bias_activation(y_want.data(), with_bias ? bias_host.data() : nullptr, rows, cols,
                               act, with_pre ? pre_want.data() : nullptr);
          DeviceFloats y(y_host), bias(bias_host), pre(rows * cols);
          pre.poison();
          gpu::bias_activation(y.get(), with_bias ? bias.get() : nullptr, rows, cols, act,
                               with_pre ? pre.get() : nullptr, test_stream());
          const std::string what = "bias_activation rows=" + std::to_string(rows) +
                                   " cols=" + std::to_string(cols) +
                                   " act=" + std::to_string(static_cast<int>(act));
          check_close(y.download(), y_want, 1e-5f, 1e-6f, what);
          if (with_pre) check_close(pre.download(), pre_want, 1e-6f, 0.0f, what + " pre");
        }
      }
    }
  }
}

TEST_CASE("cuda activation_backward matches the CPU, also in place") {
  std::uint32_t seed = 70;
  for (std::int64_t n : kElementwiseSizes) {
    for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
      const auto pre_host = random_floats(n, ++seed, -4.0f, 4.0f);
      const auto grad_host = random_floats(n, ++seed);
      std::vector<float> want(n);
      cpu::activation_backward(act, pre_host.data(), grad_host.data(), want.data(), n);
      DeviceFloats pre(pre_host), grad(grad_host), out(n);
      out.poison();
      gpu::activation_backward(act, pre.get(), grad.get(), out.get(), n, test_stream());
      const std::string what = "activation_backward n=" + std::to_string(n) +
                               " act=" + std::to_string(static_cast<int>(act));
      // GELU's derivative near z = -4 is a small difference of terms near 1 (1 + tanh, and
      // 1 - tanh^2 times ~5): CUDA's tanhf (2 ulp) and glibc's differ there by ~1.2e-6 * |g|
      // while the result itself is ~1e-4 * g.
      const float atol = act == Activation::kGelu ? 1e-5f : 1e-6f;
      check_close(out.download(), want, 1e-5f, atol, what);
      // grad_in may alias grad_out.
      gpu::activation_backward(act, pre.get(), grad.get(), grad.get(), n, test_stream());
      check_close(grad.download(), want, 1e-5f, atol, what + " in place");
    }
  }
}

// ---- reductions -----------------------------------------------------------------------------

TEST_CASE("cuda column_sum matches the CPU, overwriting (beta 0) or accumulating") {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {
      {1, 1}, {1000, 3}, {17, 33}, {129, 257}, {4097, 5}, {3, 1000}, {0, 7}};
  std::uint32_t seed = 300;
  for (auto [rows, cols] : shapes) {
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      const auto x_host = random_floats(rows * cols, ++seed);
      auto out_host = random_floats(cols, ++seed);
      DeviceFloats x(x_host), out(out_host);
      if (beta == 0.0f) {
        out.poison();
        std::fill(out_host.begin(), out_host.end(), std::numeric_limits<float>::quiet_NaN());
      }
      cpu::column_sum(x_host.data(), rows, cols, beta, out_host.data());
      gpu::column_sum(x.get(), rows, cols, beta, out.get(), test_stream());
      check_close(out.download(), out_host, 1e-5f, 1e-5f,
                  "column_sum rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                      " beta=" + std::to_string(beta));
    }
  }
}

TEST_CASE("cuda sum and mse_forward match the CPU and are deterministic") {
  // Around the single-block limit (65536) and well past it (two-pass path).
  const std::int64_t sizes[] = {1, 3, 1000, 65535, 65536, 65537, (1 << 22) + 3};
  std::uint32_t seed = 500;
  for (std::int64_t n : sizes) {
    const auto x_host = random_floats(n, ++seed);
    const auto t_host = random_floats(n, ++seed);
    DeviceFloats x(x_host), t(t_host), out(2);
    float want_sum = 0.0f, want_mse = 0.0f;
    cpu::sum(x_host.data(), n, &want_sum);
    cpu::mse_forward(x_host.data(), t_host.data(), n, &want_mse);
    out.poison();
    gpu::sum(x.get(), n, out.get(), test_stream());
    gpu::mse_forward(x.get(), t.get(), n, out.get() + 1, test_stream());
    const auto first = out.download();
    const std::string what = "n=" + std::to_string(n);
    // The sum of n values in [-1, 1] may nearly cancel: compare against the scale sqrt(n).
    check_close({first[0]}, {want_sum}, 1e-5f, 1e-6f * std::sqrt(static_cast<float>(n)),
                "sum " + what);
    check_close({first[1]}, {want_mse}, 1e-5f, 0.0f, "mse_forward " + what);
    // No atomics: the same input gives the same bits.
    gpu::sum(x.get(), n, out.get(), test_stream());
    gpu::mse_forward(x.get(), t.get(), n, out.get() + 1, test_stream());
    check_bits_equal(out.download(), first, "determinism " + what);
  }
}

TEST_CASE("cuda count_nonfinite matches the CPU on both reduction paths") {
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t sizes[] = {1, 1000, 65536, 65537, (1 << 22) + 3};
  std::uint32_t seed = 550;
  for (std::int64_t n : sizes) {
    auto x_host = random_floats(static_cast<std::size_t>(n), ++seed, -1e30f, 1e30f);
    x_host[0] = std::numeric_limits<float>::max();  // finite, however large
    for (std::int64_t i = 1; i < n; i += 997) {
      x_host[static_cast<std::size_t>(i)] = (i % 3 == 0) ? kNaN : (i % 3 == 1 ? kInf : -kInf);
    }
    float want = -1.0f;
    cpu::count_nonfinite(x_host.data(), n, &want);
    DeviceFloats x(x_host), out(1);
    out.poison();
    gpu::count_nonfinite(x.get(), n, out.get(), test_stream());
    const std::string what = "n=" + std::to_string(n);
    check_bits_equal(out.download(), {want}, "count_nonfinite " + what);
    CHECK_MESSAGE(want == static_cast<float>((n - 1 + 996) / 997), what);
  }
}

TEST_CASE("cuda reductions keep their scratch in the default pool across synchronizations") {
  // A multi-block reduction takes its partials from the default memory pool. With the pool's
  // default release threshold (0) every synchronization hands that memory back to the driver;
  // the reduction raises the threshold once so the pool keeps it.
  const std::int64_t n = (1 << 20) + 5;
  DeviceFloats x(std::vector<float>(static_cast<std::size_t>(n), 1.0f)), out(1);
  gpu::sum(x.get(), n, out.get(), test_stream());
  NANODDP_CUDA_CHECK(cudaStreamSynchronize(test_stream()));
  CHECK(out.download() == std::vector<float>{static_cast<float>(n)});
  cudaMemPool_t pool = nullptr;
  NANODDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  std::uint64_t threshold = 0, reserved = 0;
  NANODDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  NANODDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  CHECK(threshold == std::numeric_limits<std::uint64_t>::max());
  CHECK(reserved > 0);  // still held after the synchronization
}

TEST_CASE("cuda mse_backward matches the CPU") {
  std::uint32_t seed = 600;
  for (std::int64_t n : kElementwiseSizes) {
    for (float beta : {0.0f, 1.0f}) {
      const auto p_host = random_floats(n, ++seed), t_host = random_floats(n, ++seed);
      auto g_host = random_floats(n, ++seed);
      const std::vector<float> grad_out_host = {0.75f};
      DeviceFloats p(p_host), t(t_host), g(g_host), grad_out(grad_out_host);
      if (beta == 0.0f) {
        g.poison();
        std::fill(g_host.begin(), g_host.end(), std::numeric_limits<float>::quiet_NaN());
      }
      cpu::mse_backward(p_host.data(), t_host.data(), n, grad_out_host.data(), beta, g_host.data());
      gpu::mse_backward(p.get(), t.get(), n, grad_out.get(), beta, g.get(), test_stream());
      check_close(g.download(), g_host, 1e-5f, 1e-7f,
                  "mse_backward n=" + std::to_string(n) + " beta=" + std::to_string(beta));
    }
  }
}

// ---- elementwise ----------------------------------------------------------------------------

TEST_CASE("cuda elementwise kernels match the CPU") {
  std::uint32_t seed = 800;
  for (std::int64_t n : kElementwiseSizes) {
    const auto x_host = random_floats(n, ++seed), y_host = random_floats(n, ++seed);
    const std::string size = " n=" + std::to_string(n);
    {
      DeviceFloats x(n);
      x.poison();
      gpu::fill(x.get(), n, 2.5f, test_stream());
      std::vector<float> want(n);
      cpu::fill(want.data(), n, 2.5f);
      check_bits_equal(x.download(), want, "fill" + size);
    }
    {
      DeviceFloats x(x_host);
      auto want = x_host;
      cpu::scale(want.data(), n, -0.3f);
      gpu::scale(x.get(), n, -0.3f, test_stream());
      check_close(x.download(), want, 1e-6f, 0.0f, "scale" + size);
    }
    {
      DeviceFloats x(x_host), y(y_host);
      auto want = y_host;
      cpu::axpy(n, 0.7f, x_host.data(), want.data());
      gpu::axpy(n, 0.7f, x.get(), y.get(), test_stream());
      check_close(y.download(), want, 1e-6f, 1e-7f, "axpy" + size);
    }
    {
      DeviceFloats a(x_host), b(y_host), out(n);
      out.poison();
      std::vector<float> want(n);
      cpu::add(x_host.data(), y_host.data(), -2.0f, want.data(), n);
      gpu::add(a.get(), b.get(), -2.0f, out.get(), n, test_stream());
      check_close(out.download(), want, 1e-6f, 1e-7f, "add" + size);
      // out may alias a (and b).
      gpu::add(a.get(), b.get(), -2.0f, a.get(), n, test_stream());
      check_close(a.download(), want, 1e-6f, 1e-7f, "add in place" + size);
    }
    {
      DeviceFloats x(x_host), out(n);
      out.poison();
      std::vector<float> want(n);
      cpu::scale_copy(x_host.data(), 1.25f, want.data(), n);
      gpu::scale_copy(x.get(), 1.25f, out.get(), n, test_stream());
      check_close(out.download(), want, 1e-6f, 0.0f, "scale_copy" + size);
      gpu::scale_copy(x.get(), 1.25f, x.get(), n, test_stream());
      check_close(x.download(), want, 1e-6f, 0.0f, "scale_copy in place" + size);
    }
    for (float beta : {0.0f, 1.0f}) {
      const std::vector<float> scalar_host = {3.0f};
      DeviceFloats scalar(scalar_host), out(y_host);
      auto want = y_host;
      if (beta == 0.0f) {
        out.poison();
        std::fill(want.begin(), want.end(), std::numeric_limits<float>::quiet_NaN());
      }
      cpu::broadcast_scalar(scalar_host.data(), 0.5f, beta, want.data(), n);
      gpu::broadcast_scalar(scalar.get(), 0.5f, beta, out.get(), n, test_stream());
      check_close(out.download(), want, 1e-6f, 0.0f,
                  "broadcast_scalar beta=" + std::to_string(beta) + size);
    }
  }
}

TEST_CASE("cuda kernels treat zero-size inputs as no-ops") {
  DeviceFloats x(4);
  x.upload({1, 2, 3, 4});
  gpu::fill(x.get(), 0, 9.0f, test_stream());
  gpu::scale(x.get(), 0, 9.0f, test_stream());
  gpu::axpy(0, 1.0f, x.get(), x.get(), test_stream());
  gpu::add(x.get(), x.get(), 1.0f, x.get(), 0, test_stream());
  gpu::bias_activation(x.get(), x.get(), 0, 4, Activation::kRelu, nullptr, test_stream());
  gpu::column_sum(x.get(), 3, 0, 0.0f, x.get(), test_stream());
  gpu::fill_uniform(x.get(), 0, 1, 2, 3, 0.0f, 1.0f, test_stream());
  gpu::sgd_step(x.get(), x.get(), nullptr, 0, SgdHyper{}, true, test_stream());
  CHECK(x.download() == std::vector<float>{1, 2, 3, 4});
}

// ---- optimizers -----------------------------------------------------------------------------

TEST_CASE("cuda sgd_step matches the CPU over several steps") {
  struct Case {
    SgdHyper h;
    const char* name;
  };
  const Case cases[] = {
      {{0.1f, 0.0f, 0.0f, 0.0f, false}, "plain"},
      {{0.05f, 0.0f, 0.0f, 0.01f, false}, "weight decay"},
      {{0.05f, 0.9f, 0.0f, 0.0f, false}, "momentum"},
      {{0.05f, 0.9f, 0.1f, 0.01f, false}, "momentum + dampening + decay"},
      {{0.05f, 0.9f, 0.0f, 0.01f, true}, "nesterov"},
  };
  std::uint32_t seed = 900;
  for (const Case& c : cases) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{65537}}) {
      auto p_host = random_floats(n, ++seed);
      std::vector<float> buf_host(n, 0.0f);
      DeviceFloats p(p_host), buf(n);
      buf.poison();  // first_step must not read the buffer
      std::fill(buf_host.begin(), buf_host.end(), std::numeric_limits<float>::quiet_NaN());
      for (int step = 0; step < 3; ++step) {
        const auto g_host = random_floats(n, ++seed);
        DeviceFloats g(g_host);
        cpu::sgd_step(p_host.data(), g_host.data(), buf_host.data(), n, c.h, step == 0);
        gpu::sgd_step(p.get(), g.get(), buf.get(), n, c.h, step == 0, test_stream());
      }
      const std::string what = std::string("sgd ") + c.name + " n=" + std::to_string(n);
      check_close(p.download(), p_host, 1e-5f, 1e-6f, what);
      if (c.h.momentum != 0.0f) check_close(buf.download(), buf_host, 1e-5f, 1e-6f, what + " buf");
    }
  }
}

TEST_CASE("cuda sgd_step without momentum never touches a null momentum buffer") {
  const auto p_host = random_floats(100, 1), g_host = random_floats(100, 2);
  auto want = p_host;
  SgdHyper h;
  h.lr = 0.1f;
  cpu::sgd_step(want.data(), g_host.data(), nullptr, 100, h, false);
  DeviceFloats p(p_host), g(g_host);
  gpu::sgd_step(p.get(), g.get(), nullptr, 100, h, false, test_stream());
  check_close(p.download(), want, 1e-6f, 1e-7f, "sgd null buffer");
}

TEST_CASE("cuda adamw_step matches the CPU over several steps") {
  std::uint32_t seed = 1000;
  for (float wd : {0.0f, 0.01f}) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{65537}}) {
      auto p_host = random_floats(n, ++seed);
      std::vector<float> m_host(n, 0.0f), v_host(n, 0.0f);
      DeviceFloats p(p_host), m(m_host), v(v_host);
      AdamWHyper h;
      h.lr = 1e-2f;
      h.weight_decay = wd;
      for (std::int64_t step = 1; step <= 5; ++step) {
        h.step = step;
        const auto g_host = random_floats(n, ++seed);
        DeviceFloats g(g_host);
        cpu::adamw_step(p_host.data(), g_host.data(), m_host.data(), v_host.data(), n, h);
        gpu::adamw_step(p.get(), g.get(), m.get(), v.get(), n, h, test_stream());
      }
      const std::string what = "adamw wd=" + std::to_string(wd) + " n=" + std::to_string(n);
      check_close(p.download(), p_host, 1e-5f, 1e-6f, what);
      check_close(m.download(), m_host, 1e-5f, 1e-7f, what + " exp_avg");
      check_close(v.download(), v_host, 1e-5f, 1e-9f, what + " exp_avg_sq");
    }
  }
}

// ---- random fills ---------------------------------------------------------------------------

TEST_CASE("cuda fill_uniform is bit-identical to the CPU, and any slice can be regenerated") {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{(1 << 20) + 5}}) {
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{12345}, std::uint64_t{1} << 40}) {
      std::vector<float> want(n);
      cpu::fill_uniform(want.data(), n, 42, 7, offset, 0.0f, 1.0f);
      DeviceFloats out(n);
      out.poison();
      gpu::fill_uniform(out.get(), n, 42, 7, offset, 0.0f, 1.0f, test_stream());
      const auto got = out.download();
      check_bits_equal(got, want,
                       "fill_uniform n=" + std::to_string(n) + " offset=" + std::to_string(offset));
      for (float u : got) {
        if (!(u >= 0.0f && u < 1.0f)) {
          FAIL("uniform value outside [0, 1): " << u);
          break;
        }
      }
      // Scaled to [lo, hi): both sides use one explicit fused multiply-add, so bits agree too.
      cpu::fill_uniform(want.data(), n, 42, 7, offset, -2.0f, 3.0f);
      gpu::fill_uniform(out.get(), n, 42, 7, offset, -2.0f, 3.0f, test_stream());
      check_bits_equal(out.download(), want, "fill_uniform [-2, 3)");
    }
  }
  // Elements [10, 110) of a stream equal a fill of 100 elements at offset 10.
  DeviceFloats whole(110), slice(100);
  gpu::fill_uniform(whole.get(), 110, 9, 1, 0, 0.0f, 1.0f, test_stream());
  gpu::fill_uniform(slice.get(), 100, 9, 1, 10, 0.0f, 1.0f, test_stream());
  const auto w = whole.download();
  check_bits_equal(slice.download(), std::vector<float>(w.begin() + 10, w.end()), "slice");
}

TEST_CASE("cuda fill_normal gives the CPU's bits") {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{(1 << 20) + 5}}) {
    std::vector<float> want(n);
    cpu::fill_normal(want.data(), n, 1234, 3, 99, 0.0f, 1.0f);
    DeviceFloats out(n);
    out.poison();
    gpu::fill_normal(out.get(), n, 1234, 3, 99, 0.0f, 1.0f, test_stream());
    const auto got = out.download();
    // Both sides use philox.h's polynomial log and cosine with explicit fmaf: the same bits,
    // so data drawn on a GPU is the data drawn on the CPU.
    check_bits_equal(got, want, "fill_normal n=" + std::to_string(n));
    if (n > 1000) {
      double mean = 0.0, sq = 0.0;
      for (float z : got) {
        mean += z;
        sq += static_cast<double>(z) * z;
      }
      mean /= static_cast<double>(n);
      CHECK(std::fabs(mean) < 0.01);
      CHECK(std::fabs(sq / static_cast<double>(n) - 1.0) < 0.01);
    }
    cpu::fill_normal(want.data(), n, 1234, 3, 99, 2.0f, 0.5f);
    gpu::fill_normal(out.get(), n, 1234, 3, 99, 2.0f, 0.5f, test_stream());
    check_bits_equal(out.download(), want, "fill_normal mean 2 std 0.5");
  }
}

// ---- bf16 -----------------------------------------------------------------------------------

TEST_CASE("cuda bf16 casts are bit-identical to the CPU (round to nearest even, NaN stays NaN)") {
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::lowest(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           std::bit_cast<float>(0x3f808000u),   // tie, even below: rounds down
                           std::bit_cast<float>(0x3f818000u),   // tie, odd below: rounds up
                           std::bit_cast<float>(0x3f808001u),   // just above a tie: up
                           std::bit_cast<float>(0x7f7fffffu),   // rounds up to infinity
                           std::bit_cast<float>(0x7f800001u),   // signalling NaN, payload low
                           std::bit_cast<float>(0xff800001u)};  // the same, negative
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i)
    in.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  const std::int64_t n = static_cast<std::int64_t>(in.size());
  std::vector<std::uint16_t> want(n);
  cpu::f32_to_bf16(in.data(), want.data(), n);
  DeviceFloats d_in(in);
  DeviceBuffer<std::uint16_t> d_out(n);
  gpu::f32_to_bf16(d_in.get(), d_out.get(), n, test_stream());
  // Both sides use the same integer rounding (and the same NaN rule: keep the sign and top
  // payload bits, set the quiet bit), so every output bit must agree.
  const auto got = d_out.download();
  std::size_t bad = 0, first = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (got[i] != want[i] && bad++ == 0) first = static_cast<std::size_t>(i);
  }
  INFO("first mismatch at " << first << ": input bits " << std::bit_cast<std::uint32_t>(in[first])
                            << " gpu " << got[first] << " cpu " << want[first]);
  CHECK(bad == 0);
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isnan(in[i]) && (got[i] & 0x7fffu) <= 0x7f80u) {
      FAIL("NaN input " << std::bit_cast<std::uint32_t>(in[i]) << " became " << got[i]);
      break;
    }
  }

  // Widening: every one of the 65536 bf16 patterns.
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> wide_want(65536);
  cpu::bf16_to_f32(all.data(), wide_want.data(), 65536);
  DeviceBuffer<std::uint16_t> d_all(all);
  DeviceFloats d_wide(65536);
  gpu::bf16_to_f32(d_all.get(), d_wide.get(), 65536, test_stream());
  check_bits_equal(d_wide.download(), wide_want, "bf16_to_f32");
}

// ---- engine runtime: devices, streams, events, memory ----------------------------------------

TEST_CASE("cuda device queries and require_device") {
  CHECK(nanoddp::built_with_cuda());
  const int count = nanoddp::cuda_device_count();
  REQUIRE(count > 0);
  CHECK(nanoddp::cuda_status().find("cuda:0") != std::string::npos);
  CHECK_NOTHROW(nanoddp::require_device(Device::cpu()));
  CHECK_NOTHROW(nanoddp::require_device(Device::cuda(0)));
  try {
    nanoddp::require_device(Device::cuda(count));
    FAIL("require_device accepted a device index past the last GPU");
  } catch (const nanoddp::Error& e) {
    const std::string message = e.what();
    CHECK(message.find("cuda:" + std::to_string(count)) != std::string::npos);
    CHECK(message.find("does not exist") != std::string::npos);
  }
  CHECK_THROWS_AS(nanoddp::cuda_backend(count), nanoddp::Error);
  // Nothing above may leave a sticky error for later launches to trip over.
  CHECK(cudaGetLastError() == cudaSuccess);
}

// The child of the guard test below (gpu_main.cpp runs it when NANODDP_GPU_TEST_CHILD is
// "fresh-thread-device"): a fresh thread works on the last device through the engine, as a rank
// with LOCAL_RANK >= 1 does; device 0 must then still have no context. Exit 0 when it has none.
int fresh_thread_device_child() {
  const int last = nanoddp::cuda_device_count() - 1;
  if (last < 1) return 3;
  std::thread worker([&] {
    nanoddp::Tensor t = nanoddp::Tensor::zeros({16}, Device::cuda(last));
    t.fill(1.0f);
    nanoddp::Stream::compute(Device::cuda(last)).synchronize();
  });
  worker.join();
  const bool on_last = nanoddp::detail::cuda_primary_context_active(last);
  const bool on_0 = nanoddp::detail::cuda_primary_context_active(0);
  std::printf("context on cuda:%d %d, on cuda:0 %d\n", last, on_last ? 1 : 0, on_0 ? 1 : 0);
  return on_last && !on_0 ? 0 : 1;
}

TEST_CASE("cuda device guard: a fresh thread working on cuda:N opens no context on cuda:0") {
  nanoddp::Stream::compute(Device::cuda(0)).synchronize();  // this process works on cuda:0
  CHECK(nanoddp::detail::cuda_primary_context_active(0));
  if (nanoddp::cuda_device_count() < 2) {
    MESSAGE("one GPU: the fresh-thread case needs two (it runs in a child process)");
    return;
  }
  char self[4096] = {};
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(len > 0);
  const auto result =
      nanoddp::testing::run_process({std::string(self, static_cast<std::size_t>(len))},
                                    {.env = {{"NANODDP_GPU_TEST_CHILD", "fresh-thread-device"}},
                                     .timeout = std::chrono::seconds(60)});
  INFO(result.output);
  CHECK(result.exit_code == 0);
}

TEST_CASE("cuda copy_bytes between host and device, both directions and device to device") {
  const auto host = random_floats(1000, 3);
  DeviceFloats a(1000), b(1000);
  const std::size_t bytes = 1000 * sizeof(float);
  nanoddp::copy_bytes(a.get(), Device::cuda(0), host.data(), Device::cpu(), bytes);
  nanoddp::copy_bytes(b.get(), Device::cuda(0), a.get(), Device::cuda(0), bytes);
  std::vector<float> back(1000, 0.0f);
  nanoddp::copy_bytes(back.data(), Device::cpu(), b.get(), Device::cuda(0), bytes);
  check_bits_equal(back, host, "copy_bytes round trip");
  std::vector<float> cpu_copy(1000);
  nanoddp::copy_bytes(cpu_copy.data(), Device::cpu(), host.data(), Device::cpu(), bytes);
  check_bits_equal(cpu_copy, host, "copy_bytes cpu");
}

TEST_CASE("cuda copy_bytes is ordered after kernels on the compute stream") {
  // A big fill on the (non-blocking) compute stream, then at once a copy to the host: the copy
  // must see the fill.
  const std::int64_t n = 1 << 24;
  DeviceFloats x(n);
  NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
  gpu::fill(x.get(), n, 1.0f, test_stream());
  gpu::scale(x.get(), n, 3.0f, test_stream());
  std::vector<float> host(n);
  nanoddp::copy_bytes(host.data(), Device::cpu(), x.get(), Device::cuda(0), n * sizeof(float));
  CHECK(host.front() == 3.0f);
  CHECK(host.back() == 3.0f);
}

TEST_CASE("cuda streams: compute stream per device, created streams, priorities") {
  const nanoddp::Stream compute = nanoddp::Stream::compute(Device::cuda(0));
  CHECK(compute.device() == Device::cuda(0));
  CHECK(compute.native() != nullptr);
  CHECK(nanoddp::Stream::compute(Device::cuda(0)).native() == compute.native());
  CHECK(nanoddp::Stream::compute(Device::cpu()).native() == nullptr);

  const nanoddp::Stream high =
      nanoddp::Stream::create(Device::cuda(0), nanoddp::StreamPriority::kHigh);
  const nanoddp::Stream normal = nanoddp::Stream::create(Device::cuda(0));
  CHECK(high.native() != nullptr);
  CHECK(high.native() != normal.native());
  int least = 0, greatest = 0, got = 1;
  NANODDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  NANODDP_CUDA_CHECK(cudaStreamGetPriority(static_cast<cudaStream_t>(high.native()), &got));
  CHECK(got == greatest);
  NANODDP_CUDA_CHECK(cudaStreamGetPriority(static_cast<cudaStream_t>(normal.native()), &got));
  CHECK(got == least);
  high.synchronize();
  compute.synchronize();
  CHECK_THROWS_AS(nanoddp::Stream::compute(Device::cuda(nanoddp::cuda_device_count())),
                  nanoddp::Error);
}

TEST_CASE("cuda events order two streams without blocking the host, and time them") {
  const Device dev = Device::cuda(0);
  const nanoddp::Stream producer = nanoddp::Stream::create(dev);
  const nanoddp::Stream consumer = nanoddp::Stream::create(dev, nanoddp::StreamPriority::kHigh);
  auto* p = static_cast<cudaStream_t>(producer.native());
  auto* c = static_cast<cudaStream_t>(consumer.native());
  const std::int64_t n = 1 << 24;
  DeviceFloats x(n), y(n);
  NANODDP_CUDA_CHECK(cudaDeviceSynchronize());

  nanoddp::Event start(dev), produced(dev);
  start.record(producer);
  // Several passes so that the producer is still busy when the consumer is enqueued.
  gpu::fill(x.get(), n, 1.0f, p);
  for (int i = 0; i < 20; ++i) gpu::scale(x.get(), n, 1.0f, p);
  gpu::scale(x.get(), n, 2.0f, p);
  produced.record(producer);
  produced.block(consumer);  // the consumer waits for the producer, the host does not
  gpu::scale_copy(x.get(), 1.0f, y.get(), n, c);
  nanoddp::Event consumed(dev);
  consumed.record(consumer);
  consumed.synchronize();
  CHECK(consumed.query());
  CHECK(produced.query());
  const double ms = start.elapsed_ms(produced);
  CHECK(ms > 0.0);
  CHECK(ms < 10000.0);
  std::vector<float> host(n);
  NANODDP_CUDA_CHECK(cudaMemcpy(host.data(), y.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(host.front() == 2.0f);
  CHECK(host.back() == 2.0f);

  // Moving an event moves its CUDA handle.
  nanoddp::Event moved(std::move(produced));
  CHECK(moved.query());
  nanoddp::Event assigned;
  assigned = std::move(moved);
  CHECK(assigned.query());
}

TEST_CASE("cpu events: timestamps, no-op waits") {
  nanoddp::Event a, b;
  const nanoddp::Stream cpu_stream = nanoddp::Stream::compute(Device::cpu());
  a.record(cpu_stream);
  b.record(cpu_stream);
  a.block(cpu_stream);
  a.synchronize();
  CHECK(a.query());
  CHECK(a.elapsed_ms(b) >= 0.0);
}

TEST_CASE("cuda raw memory: allocate, free, and a clear out-of-memory error") {
  NANODDP_CUDA_CHECK(cudaSetDevice(0));
  void* p = nanoddp::cuda_raw_allocate(1 << 20);
  CHECK(p != nullptr);
  NANODDP_CUDA_CHECK(cudaMemset(p, 0, 1 << 20));
  NANODDP_CUDA_CHECK(cudaDeviceSynchronize());
  nanoddp::cuda_raw_free(p);
  CHECK(nanoddp::cuda_raw_allocate(0) == nullptr);
  nanoddp::cuda_raw_free(nullptr);
  const std::size_t huge = std::size_t{1} << 50;  // 1 PiB
  try {
    (void)nanoddp::cuda_raw_allocate(huge);
    FAIL("a 1 PiB cudaMalloc succeeded");
  } catch (const std::exception& e) {
    const std::string message = e.what();
    CHECK(message.find(std::to_string(huge)) != std::string::npos);
    CHECK(message.find("cudaErrorMemoryAllocation") != std::string::npos);
  }
  // The failed allocation must not poison later work.
  CHECK(cudaGetLastError() == cudaSuccess);
  DeviceFloats x(10);
  gpu::fill(x.get(), 10, 1.0f, test_stream());
  CHECK(x.download() == std::vector<float>(10, 1.0f));
}

#endif  // NANODDP_WITH_CUDA
