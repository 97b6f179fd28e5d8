// SGD and AdamW: hand-computed steps (the formulas of torch.optim) and float64 references.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace {
using nanoddp::kernels::AdamWHyper;
using nanoddp::kernels::SgdHyper;
using namespace nanoddp::test;
namespace cpu = nanoddp::kernels::cpu;

// Runs `steps` SGD steps of a one-element parameter with a constant gradient.
std::vector<float> sgd_trajectory(const SgdHyper& h, float p0, float g, int steps) {
  float p = p0, buf = kNaN;  // NaN: the first step must not read the buffer
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    cpu::sgd_step(&p, &g, &buf, 1, h, s == 0);
    out.push_back(p);
  }
  return out;
}
}  // namespace

TEST_CASE("cpu sgd: plain, no momentum buffer needed") {
  SgdHyper h;
  h.lr = 0.1f;
  float p = 1.0f, g = 0.5f;
  cpu::sgd_step(&p, &g, nullptr, 1, h, true);  // momentum 0: buffer is never touched
  CHECK(p == doctest::Approx(0.95f));
  cpu::sgd_step(&p, &g, nullptr, 1, h, false);
  CHECK(p == doctest::Approx(0.90f));
}

TEST_CASE("cpu sgd: momentum, first step copies the gradient") {
  SgdHyper h;
  h.lr = 0.1f;
  h.momentum = 0.9f;
  // buf: 0.5, 0.95, 1.355; p: 0.95, 0.855, 0.7195
  const auto p = sgd_trajectory(h, 1.0f, 0.5f, 3);
  CHECK(p[0] == doctest::Approx(0.95));
  CHECK(p[1] == doctest::Approx(0.855));
  CHECK(p[2] == doctest::Approx(0.7195));
}

TEST_CASE("cpu sgd: dampening is skipped on the first step") {
  SgdHyper h;
  h.lr = 0.1f;
  h.momentum = 0.9f;
  h.dampening = 0.5f;
  // buf: 0.5 (undamped), then 0.9*0.5 + 0.5*0.5 = 0.7; p: 0.95, 0.88
  const auto p = sgd_trajectory(h, 1.0f, 0.5f, 2);
  CHECK(p[0] == doctest::Approx(0.95));
  CHECK(p[1] == doctest::Approx(0.88));
}

TEST_CASE("cpu sgd: nesterov with weight decay") {
  SgdHyper h;
  h.lr = 0.1f;
  h.momentum = 0.9f;
  h.weight_decay = 0.1f;
  h.nesterov = true;
  // step 1: g = 0.5 + 0.1 = 0.6, buf = 0.6, g = 0.6 + 0.54 = 1.14, p = 0.886
  // step 2: g = 0.5 + 0.0886 = 0.5886, buf = 0.54 + 0.5886 = 1.1286,
  //         g = 0.5886 + 1.01574 = 1.60434, p = 0.725566
  const auto p = sgd_trajectory(h, 1.0f, 0.5f, 2);
  CHECK(p[0] == doctest::Approx(0.886));
  CHECK(p[1] == doctest::Approx(0.725566));
}

TEST_CASE("cpu sgd: many elements over several steps against float64") {
  SgdHyper h;
  h.lr = 0.05f;
  h.momentum = 0.8f;
  h.dampening = 0.1f;
  h.weight_decay = 0.01f;
  for (bool nesterov : {false, true}) {
    h.nesterov = nesterov;
    const std::int64_t n = 1001;
    auto p = random_floats(n, 101);
    std::vector<float> buf(n, kNaN);
    std::vector<double> rp(p.begin(), p.end()), rbuf(n, 0.0);
    for (int step = 0; step < 5; ++step) {
      const auto g = random_floats(n, 200 + step);
      cpu::sgd_step(p.data(), g.data(), buf.data(), n, h, step == 0);
      for (std::int64_t i = 0; i < n; ++i) {
        double gi = g[i] + double(h.weight_decay) * rp[i];
        rbuf[i] = step == 0 ? gi : double(h.momentum) * rbuf[i] + (1.0 - h.dampening) * gi;
        gi = nesterov ? gi + double(h.momentum) * rbuf[i] : rbuf[i];
        rp[i] -= double(h.lr) * gi;
      }
    }
    check_close(p, rp, 1e-5, 1e-6);
    check_close(buf, rbuf, 1e-5, 1e-6);
  }
}

TEST_CASE("cpu adamw: hand-computed steps with a constant gradient") {
  AdamWHyper h;
  h.lr = 0.1f;
  h.weight_decay = 0.01f;
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  // step 1: p = 0.999 (decay), m = 0.05, v = 0.00025, m_hat = 0.5, sqrt(v_hat) = 0.5,
  //         p -= 0.1 * 0.5 / 0.5  -> 0.899
  h.step = 1;
  cpu::adamw_step(&p, &g, &m, &v, 1, h);
  CHECK(m == doctest::Approx(0.05));
  CHECK(v == doctest::Approx(0.00025));
  CHECK(p == doctest::Approx(0.899).epsilon(1e-6));
  // step 2: p = 0.899 * 0.999 = 0.898101, m = 0.095, v = 0.00049975, the bias-corrected
  //         ratio is again 0.5 / 0.5 -> p = 0.798101
  h.step = 2;
  cpu::adamw_step(&p, &g, &m, &v, 1, h);
  CHECK(m == doctest::Approx(0.095));
  CHECK(v == doctest::Approx(0.00049975));
  CHECK(p == doctest::Approx(0.798101).epsilon(1e-6));
}

TEST_CASE("cpu adamw: first step moves every parameter by about lr, whatever |g|") {
  // With zero state, m_hat = g and sqrt(v_hat) = |g|: the first update is lr * sign(g).
  AdamWHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.0f;
  const std::vector<float> g = {1e-3f, -5.0f, 100.0f, -0.25f};
  std::vector<float> p(4, 0.0f), m(4, 0.0f), v(4, 0.0f);
  cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), 4, h);
  CHECK(p[0] == doctest::Approx(-0.01).epsilon(1e-4));
  CHECK(p[1] == doctest::Approx(0.01).epsilon(1e-4));
  CHECK(p[2] == doctest::Approx(-0.01).epsilon(1e-4));
  CHECK(p[3] == doctest::Approx(0.01).epsilon(1e-4));
}

TEST_CASE("cpu adamw: several steps on many elements against float64") {
  AdamWHyper h;
  h.lr = 3e-3f;
  h.beta1 = 0.85f;
  h.beta2 = 0.99f;
  h.eps = 1e-6f;
  h.weight_decay = 0.1f;
  const std::int64_t n = 1003;
  auto p = random_floats(n, 111);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  for (int step = 1; step <= 6; ++step) {
    const auto g = random_floats(n, 300 + step);
    h.step = step;
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, h);
    const double bc1 = 1.0 - std::pow(double(h.beta1), step);
    const double bc2 = 1.0 - std::pow(double(h.beta2), step);
    for (std::int64_t i = 0; i < n; ++i) {
      rp[i] *= 1.0 - double(h.lr) * h.weight_decay;
      rm[i] = h.beta1 * rm[i] + (1.0 - h.beta1) * g[i];
      rv[i] = h.beta2 * rv[i] + (1.0 - h.beta2) * double(g[i]) * g[i];
      rp[i] -= h.lr * (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + h.eps);
    }
  }
  check_close(p, rp, 1e-5, 1e-6);
  check_close(m, rm, 1e-5, 1e-7);
  check_close(v, rv, 1e-5, 1e-9);
}
