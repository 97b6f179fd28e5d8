// Bias + activation, activation backward, reductions and the MSE loss against float64.

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace {

using nanoddp::kernels::Activation;
using namespace nanoddp::test;
namespace cpu = nanoddp::kernels::cpu;

double gelu_ref(double z) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * z * (1.0 + std::tanh(k * (z + 0.044715 * z * z * z)));
}

double act_ref(Activation act, double z) {
  switch (act) {
    case Activation::kRelu:
      return z > 0 ? z : 0;
    case Activation::kGelu:
      return gelu_ref(z);
    case Activation::kNone:
      break;
  }
  return z;
}

// The exact derivative, taken numerically from the double reference (central difference):
// this checks the kernel's closed form without repeating it.
double act_grad_ref(Activation act, double z) {
  if (act == Activation::kRelu) return z > 0 ? 1.0 : 0.0;
  if (act == Activation::kNone) return 1.0;
  const double h = 1e-5;
  return (gelu_ref(z + h) - gelu_ref(z - h)) / (2 * h);
}

struct Dims {
  std::int64_t rows, cols;
};
const Dims kDims[] = {{1, 1}, {17, 33}, {1000, 3}, {3, 1000}, {64, 257}};
const Activation kActs[] = {Activation::kNone, Activation::kRelu, Activation::kGelu};

}  // namespace

TEST_CASE("cpu bias_activation: every activation, with and without bias/pre_activation") {
  for (const auto& d : kDims) {
    for (auto act : kActs) {
      for (bool with_bias : {true, false}) {
        for (bool with_pre : {true, false}) {
          CAPTURE(d.rows);
          CAPTURE(d.cols);
          CAPTURE(static_cast<int>(act));
          CAPTURE(with_bias);
          CAPTURE(with_pre);
          const std::size_t n = d.rows * d.cols;
          const auto y0 = random_floats(n, 21, -3.0f, 3.0f);
          const auto bias = random_floats(d.cols, 22);
          Poisoned y(y0), pre(n);
          cpu::bias_activation(y.data(), with_bias ? bias.data() : nullptr, d.rows, d.cols, act,
                               with_pre ? pre.data() : nullptr);
          std::vector<double> want_y(n), want_z(n);
          for (std::int64_t i = 0; i < d.rows; ++i) {
            for (std::int64_t j = 0; j < d.cols; ++j) {
              const double z = double(y0[i * d.cols + j]) + (with_bias ? bias[j] : 0.0);
              want_z[i * d.cols + j] = z;
              want_y[i * d.cols + j] = act_ref(act, z);
            }
          }
          check_close(y, want_y, 1e-5, 1e-6);
          CHECK(y.guards_intact());
          if (with_pre) {
            check_close(pre, want_z, 1e-6, 1e-7);
          } else {
            CHECK(std::isnan(pre[0]));  // untouched when null was passed
          }
          CHECK(pre.guards_intact());
        }
      }
    }
  }
}

TEST_CASE("cpu bias_activation: pre_activation may equal y for kNone") {
  Poisoned y(std::vector<float>{1.0f, -2.0f, 3.0f, -4.0f, 5.0f, 6.0f});
  const std::vector<float> bias = {0.5f, 0.25f, -1.0f};
  cpu::bias_activation(y.data(), bias.data(), 2, 3, Activation::kNone, y.data());
  CHECK(y[0] == 1.5f);
  CHECK(y[1] == -1.75f);
  CHECK(y[2] == 2.0f);
  CHECK(y[5] == 5.0f);
  CHECK(y.guards_intact());
}

TEST_CASE("cpu activation_backward: matches the derivative of the forward, in place too") {
  for (auto act : kActs) {
    for (std::int64_t n : {1, 17, 1000, 4099}) {
      CAPTURE(static_cast<int>(act));
      CAPTURE(n);
      const auto z = random_floats(n, 31, -5.0f, 5.0f);
      const auto g = random_floats(n, 32);
      std::vector<double> want(n);
      for (std::int64_t i = 0; i < n; ++i) want[i] = g[i] * act_grad_ref(act, z[i]);
      Poisoned out(n);
      cpu::activation_backward(act, z.data(), g.data(), out.data(), n);
      check_close(out, want, 1e-5, 1e-6);
      CHECK(out.guards_intact());
      Poisoned inplace(g);  // grad_in aliases grad_out
      cpu::activation_backward(act, z.data(), inplace.data(), inplace.data(), n);
      check_close(inplace, want, 1e-5, 1e-6);
    }
  }
}

TEST_CASE("cpu activation values at known points") {
  // GELU(1) with the tanh form is 0.841192; ReLU'(0) is 0 (PyTorch's convention).
  Poisoned y(std::vector<float>{1.0f, 0.0f, -1.0f});
  cpu::bias_activation(y.data(), nullptr, 1, 3, Activation::kGelu, nullptr);
  CHECK(y[0] == doctest::Approx(0.8411920).epsilon(1e-6));
  CHECK(y[1] == 0.0f);
  CHECK(y[2] == doctest::Approx(-0.1588080).epsilon(1e-5));
  const float z0 = 0.0f, one = 1.0f;
  float out = kNaN;
  cpu::activation_backward(Activation::kRelu, &z0, &one, &out, 1);
  CHECK(out == 0.0f);
  cpu::activation_backward(Activation::kGelu, &z0, &one, &out, 1);
  CHECK(out == doctest::Approx(0.5));
}

TEST_CASE("cpu relu keeps a NaN, forward and backward, as torch.relu does") {
  // A NaN made inside a hidden layer (Inf - Inf once weights blow up) must reach the loss, where
  // the NaN/Inf policy sees it: max(NaN, 0) written as (z > 0 ? z : 0) would make it 0 and let
  // the run carry on with garbage.
  Poisoned y(std::vector<float>{kNaN, 0.0f, -1.0f, 2.0f});
  cpu::bias_activation(y.data(), nullptr, 1, 4, Activation::kRelu, nullptr);
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 0.0f);
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 2.0f);
  const std::vector<float> z = {kNaN, 0.0f, -1.0f, 2.0f}, g = {1.0f, 1.0f, kNaN, 3.0f};
  std::vector<float> dz(4, -7.0f);
  cpu::activation_backward(Activation::kRelu, z.data(), g.data(), dz.data(), 4);
  CHECK(dz[0] == 1.0f);  // threshold_backward: NaN <= 0 is false, the gradient passes
  CHECK(dz[1] == 0.0f);
  CHECK(dz[2] == 0.0f);  // a NaN gradient below the threshold is dropped (a select, no 0 * NaN)
  CHECK(dz[3] == 3.0f);
}

TEST_CASE("cpu column_sum: beta 0 over NaN, beta 1 and beta 0.5") {
  for (const auto& d : kDims) {
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      CAPTURE(d.rows);
      CAPTURE(d.cols);
      CAPTURE(beta);
      const auto x = random_floats(d.rows * d.cols, 41);
      const auto old = random_floats(d.cols, 42);
      Poisoned out = beta == 0.0f ? Poisoned(d.cols) : Poisoned(old);
      cpu::column_sum(x.data(), d.rows, d.cols, beta, out.data());
      std::vector<double> want(d.cols);
      for (std::int64_t j = 0; j < d.cols; ++j) {
        double s = beta == 0.0f ? 0.0 : double(beta) * old[j];
        for (std::int64_t i = 0; i < d.rows; ++i) s += x[i * d.cols + j];
        want[j] = s;
      }
      check_close(out, want, 1e-6, 1e-6);
      CHECK(out.guards_intact());
    }
  }
}

TEST_CASE("cpu sum: float64 accumulation, empty and odd sizes") {
  for (std::int64_t n : {0, 1, 3, 17, 100003}) {
    CAPTURE(n);
    const auto x = random_floats(n, 51);
    double want = 0.0;
    for (float v : x) want += v;
    float out = kNaN;
    cpu::sum(x.data(), n, &out);
    CHECK(out == doctest::Approx(want).epsilon(1e-6));
  }
  // 2^24 followed by 1000 ones: a float accumulator never moves off 2^24 (each +1 rounds
  // away), a double one gets 16778216 exactly (representable in float).
  std::vector<float> x(1001, 1.0f);
  x[0] = 16777216.0f;
  float out = kNaN;
  cpu::sum(x.data(), static_cast<std::int64_t>(x.size()), &out);
  CHECK(out == 16778216.0f);
}

TEST_CASE("cpu count_nonfinite: NaN and +-Inf anywhere, finite extremes are not counted") {
  const float kInf = std::numeric_limits<float>::infinity();
  const float kDenormal = std::numeric_limits<float>::denorm_min();
  const float kMax = std::numeric_limits<float>::max();
  for (std::int64_t n : {0, 1, 15, 16, 17, 1000, 65537}) {
    CAPTURE(n);
    auto x = random_floats(n, 71, -1e30f, 1e30f);
    float out = -1.0f;
    cpu::count_nonfinite(x.data(), n, &out);
    CHECK(out == 0.0f);
    if (n == 0) continue;
    // Finite values whose bits come closest to a non-finite exponent must not count.
    x[0] = kMax;
    x[static_cast<std::size_t>(n / 2)] = -kMax;
    x[static_cast<std::size_t>(n - 1)] = kDenormal;
    cpu::count_nonfinite(x.data(), n, &out);
    CHECK(out == 0.0f);
    // Then non-finite values at the first, a middle (inside the vector body) and the last
    // (the scalar tail) positions, and a negative NaN.
    std::int64_t want = 0;
    for (const std::int64_t i : {std::int64_t{0}, n / 2, n - 1, n / 3}) {
      const float bad[] = {kNaN, kInf, -kInf, -kNaN};
      if (std::isfinite(x[static_cast<std::size_t>(i)])) ++want;
      x[static_cast<std::size_t>(i)] = bad[want % 4];
    }
    cpu::count_nonfinite(x.data(), n, &out);
    CHECK(out == static_cast<float>(want));
  }
}

TEST_CASE("cpu mse forward/backward against float64") {
  for (std::int64_t n : {1, 17, 1000, 65537}) {
    CAPTURE(n);
    const auto p = random_floats(n, 61, -2.0f, 2.0f), t = random_floats(n, 62);
    double want = 0.0;
    for (std::int64_t i = 0; i < n; ++i) want += (double(p[i]) - t[i]) * (double(p[i]) - t[i]);
    want /= n;
    float loss = kNaN;
    cpu::mse_forward(p.data(), t.data(), n, &loss);
    CHECK(loss == doctest::Approx(want).epsilon(1e-6));

    const float grad_out = 3.0f;
    for (float beta : {0.0f, 1.0f}) {
      CAPTURE(beta);
      const auto old = random_floats(n, 63);
      Poisoned g = beta == 0.0f ? Poisoned(n) : Poisoned(old);
      cpu::mse_backward(p.data(), t.data(), n, &grad_out, beta, g.data());
      std::vector<double> wg(n);
      for (std::int64_t i = 0; i < n; ++i) {
        wg[i] = (beta == 0.0f ? 0.0 : old[i]) + 3.0 * 2.0 * (double(p[i]) - t[i]) / n;
      }
      check_close(g, wg, 1e-5, 1e-7);
      CHECK(g.guards_intact());
    }
  }
  // A hand-computed case: pred {1, 2}, target {0, 0}: loss = (1 + 4) / 2 = 2.5,
  // grad = 2 (p - t) / 2 = {1, 2}.
  const float p[] = {1.0f, 2.0f}, t[] = {0.0f, 0.0f}, one = 1.0f;
  float loss = kNaN, g[2] = {kNaN, kNaN};
  cpu::mse_forward(p, t, 2, &loss);
  cpu::mse_backward(p, t, 2, &one, 0.0f, g);
  CHECK(loss == 2.5f);
  CHECK(g[0] == 1.0f);
  CHECK(g[1] == 2.0f);
}
