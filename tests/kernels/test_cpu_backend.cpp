// The CPU Backend forwards to the kernels and refuses cuBLAS with a message that says why.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/engine/cpu_backend.h"
#include "nanoddp/engine/error.h"

TEST_CASE("cpu backend: device, GEMM backend selection") {
  nanoddp::Backend& backend = nanoddp::cpu_backend();
  CHECK(&backend == &nanoddp::cpu_backend());  // one instance per process
  CHECK(backend.device() == nanoddp::Device::cpu());
  CHECK(backend.gemm_backend() == nanoddp::GemmBackend::kHand);
  CHECK_NOTHROW(backend.set_gemm_backend(nanoddp::GemmBackend::kHand));
  try {
    backend.set_gemm_backend(nanoddp::GemmBackend::kCublas);
    FAIL("expected nanoddp::Error");
  } catch (const nanoddp::Error& e) {
    CHECK(std::string(e.what()).find("--device cuda") != std::string::npos);
  }
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
