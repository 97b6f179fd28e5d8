// The CPU Backend forwards to the kernels (nanoddp's GEMM or Eigen's, as selected) and refuses
// cuBLAS with a message that says why.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/engine/cpu_backend.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/kernels/cpu/kernels.h"

TEST_CASE("cpu backend: device, GEMM backend selection") {
  nanoddp::Backend& backend = nanoddp::cpu_backend();
  CHECK(&backend == &nanoddp::cpu_backend());  // one instance per process
  CHECK(backend.device() == nanoddp::Device::cpu());
  CHECK(backend.gemm_backend() == nanoddp::GemmBackend::kHand);
  CHECK_NOTHROW(backend.set_gemm_backend(nanoddp::GemmBackend::kEigen));
  CHECK(backend.gemm_backend() == nanoddp::GemmBackend::kEigen);
  try {
    backend.set_gemm_backend(nanoddp::GemmBackend::kCublas);
    FAIL("expected nanoddp::Error");
  } catch (const nanoddp::Error& e) {
    // The library names its API, not a program flag.
    CHECK(std::string(e.what()).find("only available on CUDA devices") != std::string::npos);
    CHECK(std::string(e.what()).find("--") == std::string::npos);
  }
  CHECK(backend.gemm_backend() ==
        nanoddp::GemmBackend::kEigen);  // a refused choice changes nothing
  CHECK_NOTHROW(backend.set_gemm_backend(nanoddp::GemmBackend::kHand));
  CHECK(backend.gemm_backend() == nanoddp::GemmBackend::kHand);
}

TEST_CASE("cpu backend: gemm goes to the selected implementation") {
  // Eigen sums a long inner dimension in blocks of a few hundred terms, nanoddp's kernels in one
  // chain, so at k = 3000 the two round differently: the backend's result must equal, bit for
  // bit, the one it was told to use.
  nanoddp::Backend& backend = nanoddp::cpu_backend();
  const std::int64_t m = 64, n = 96, k = 3000;
  const auto a = nanoddp::test::random_floats(m * k, 11);
  const auto b = nanoddp::test::random_floats(n * k, 12);
  std::vector<float> own(m * n), eigen(m * n), got(m * n);
  namespace cpu = nanoddp::kernels::cpu;
  using nanoddp::Transpose;
  cpu::gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), b.data(), 0.0f, own.data());
  cpu::gemm_eigen(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), b.data(), 0.0f,
                  eigen.data());
  if (cpu::gemm_has_own_kernels()) REQUIRE(own != eigen);  // else the check below proves nothing
  for (auto [which, want] : {std::pair{nanoddp::GemmBackend::kHand, &own},
                             std::pair{nanoddp::GemmBackend::kEigen, &eigen}}) {
    backend.set_gemm_backend(which);
    backend.gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), b.data(), 0.0f,
                 got.data());
    CHECK(got == *want);
  }
  backend.set_gemm_backend(nanoddp::GemmBackend::kHand);
}

TEST_CASE("cpu backend: forwards gemm, fills and copy") {
  nanoddp::Backend& backend = nanoddp::cpu_backend();
  // [1 2; 3 4] * [1 0; 0 1]^T = itself
  const std::vector<float> a = {1, 2, 3, 4}, eye = {1, 0, 0, 1};
  nanoddp::test::Poisoned c(4);
  backend.gemm(nanoddp::Transpose::kNo, nanoddp::Transpose::kYes, 2, 2, 2, 1.0f, a.data(),
               eye.data(), 0.0f, c.data());
  CHECK(c[0] == 1.0f);
  CHECK(c[1] == 2.0f);
  CHECK(c[2] == 3.0f);
  CHECK(c[3] == 4.0f);
  std::vector<float> dst(4, nanoddp::test::kNaN);
  backend.copy(dst.data(), a.data(), 4 * sizeof(float));
  CHECK(dst == a);
  backend.copy(nullptr, nullptr, 0);  // empty copies are allowed
  float s = nanoddp::test::kNaN;
  backend.sum(a.data(), 4, &s);
  CHECK(s == 10.0f);
  backend.fill(dst.data(), 4, 7.0f);
  CHECK(dst[3] == 7.0f);
}
