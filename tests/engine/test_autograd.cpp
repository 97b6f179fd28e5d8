// Autograd: every op's gradient against a float64 reference, graph semantics (accumulation,
// zero_grad, reuse, aliasing, NoGrad, errors) and post-accumulate-grad hooks.
//
// References: each test restates the forward computation in double by hand (independently of
// the engine's kernels) and differentiates it numerically with central differences in double
// (eps = 1e-6, truncation error ~1e-12), which is far more accurate than the float32 gradients
// under test. So tolerances only need to absorb float32 rounding in the engine.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "nanoddp/engine/autograd.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/nn/layers.h"

namespace nanoddp {
namespace {

using Vec = std::vector<double>;
using Inputs = std::vector<Vec>;
using Fn = std::function<double(const Inputs&)>;

// Deterministic test data (splitmix64), independent of the engine's Philox fills.
std::vector<float> test_values(std::size_t n, std::uint64_t seed, double lo = -1.0,
                               double hi = 1.0) {
  std::vector<float> out(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : out) {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) / 9007199254740992.0;  // [0, 1)
    v = static_cast<float>(lo + (hi - lo) * u);
  }
  return out;
}

// Values bounded away from zero (|v| in [0.2, 1]): no ReLU kink within reach of any eps.
std::vector<float> away_from_zero(std::size_t n, std::uint64_t seed) {
  std::vector<float> v = test_values(n, seed, 0.2, 1.0);
  const std::vector<float> sign = test_values(n, seed + 1000);
  for (std::size_t i = 0; i < n; ++i) v[i] = sign[i] < 0.0f ? -v[i] : v[i];
  return v;
}

Tensor leaf(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

Tensor constant(const std::vector<float>& values, const Shape& shape) {
  return Tensor::from_vector(values, shape);
}

Vec to_double(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

Vec numeric_grad(const Fn& f, Inputs inputs, std::size_t which, double eps = 1e-6) {
  Vec& x = inputs[which];
  Vec grad(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = f(inputs);
    x[i] = saved - eps;
    const double minus = f(inputs);
    x[i] = saved;
    grad[i] = (plus - minus) / (2.0 * eps);
  }
  return grad;
}

// |got - want| <= atol + rtol * |want| elementwise; reports the first offender.
void check_close(const Tensor& got_tensor, const Vec& want, const std::string& what,
                 double rtol = 2e-4, double atol = 2e-6) {
  REQUIRE_MESSAGE(got_tensor.defined(), what << ": gradient is undefined");
  const std::vector<float> got = got_tensor.to_vector();
  REQUIRE_MESSAGE(got.size() == want.size(),
                  what << ": size " << got.size() << " vs " << want.size());
  int bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {
      if (bad++ == 0) {
        first = fmt::format("[{}] got {} want {}", i, got[i], want[i]);
      }
    }
  }
  CHECK_MESSAGE(bad == 0,
                what << ": " << bad << " of " << got.size() << " differ, first " << first);
}

// ---- float64 restatements of the forward computations ----------------------------------------

constexpr double kSqrt2OverPi = 0.79788456080286535588;

double act_d(double z, Activation act) {
  switch (act) {
    case Activation::kRelu:
      return z > 0.0 ? z : 0.0;
    case Activation::kGelu:
      return 0.5 * z * (1.0 + std::tanh(kSqrt2OverPi * (z + 0.044715 * z * z * z)));
    case Activation::kNone:
      break;
  }
  return z;
}

// [m,k] x [k,n]
Vec matmul_d(const Vec& a, const Vec& b, std::size_t m, std::size_t k, std::size_t n) {
  Vec c(m * n, 0.0);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t p = 0; p < k; ++p) c[i * n + j] += a[i * k + p] * b[p * n + j];
    }
  }
  return c;
}

// act(x W^T + b), x [batch,in], w [out,in]; `bias` may be empty. `pre` receives z if given.
Vec linear_d(const Vec& x, const Vec& w, const Vec& bias, std::size_t batch, std::size_t in,
             std::size_t out, Activation act, Vec* pre = nullptr) {
  Vec y(batch * out);
  if (pre) pre->assign(batch * out, 0.0);
  for (std::size_t i = 0; i < batch; ++i) {
    for (std::size_t j = 0; j < out; ++j) {
      double z = bias.empty() ? 0.0 : bias[j];
      for (std::size_t p = 0; p < in; ++p) z += x[i * in + p] * w[j * in + p];
      if (pre) (*pre)[i * out + j] = z;
      y[i * out + j] = act_d(z, act);
    }
  }
  return y;
}

double mse_d(const Vec& p, const Vec& t) {
  double acc = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) acc += (p[i] - t[i]) * (p[i] - t[i]);
  return acc / static_cast<double>(p.size());
}

double min_abs(const Vec& v) {
  double m = std::numeric_limits<double>::infinity();
  for (double x : v) m = std::min(m, std::abs(x));
  return m;
}

std::string error_message(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

// ---- gradient checks, one op at a time ----------------------------------------------------------

TEST_CASE("gradcheck: matmul") {
  constexpr std::size_t m = 3, k = 4, n = 5;
  const auto a = test_values(m * k, 1), b = test_values(k * n, 2), t = test_values(m * n, 3);
  Tensor ta = leaf(a, {m, k}), tb = leaf(b, {k, n});
  Tensor loss = mse_loss(matmul(ta, tb), constant(t, {m, n}));
  loss.backward();

  const Fn f = [&](const Inputs& in) { return mse_d(matmul_d(in[0], in[1], m, k, n), in[2]); };
  const Inputs in{to_double(a), to_double(b), to_double(t)};
  CHECK(loss.item() == doctest::Approx(f(in)).epsilon(1e-5));
  check_close(ta.grad(), numeric_grad(f, in, 0), "dA");
  check_close(tb.grad(), numeric_grad(f, in, 1), "dB");
}

TEST_CASE("gradcheck: linear with and without bias, for every activation") {
  constexpr std::size_t batch = 3, in = 4, out = 5;
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
    for (bool with_bias : {true, false}) {
      CAPTURE(static_cast<int>(act));
      CAPTURE(with_bias);
      const auto x = test_values(batch * in, 10), w = test_values(out * in, 11);
      const auto b = test_values(out, 12), t = test_values(batch * out, 13);
      Tensor tx = leaf(x, {batch, in}), tw = leaf(w, {out, in});
      Tensor tb = with_bias ? leaf(b, {out}) : Tensor();
      Tensor y = linear(tx, tw, tb, act);
      Tensor loss = mse_loss(y, constant(t, {batch, out}));
      loss.backward();

      const Vec bias_d = with_bias ? to_double(b) : Vec{};
      // The forward output itself, and no ReLU kink near any pre-activation.
      Vec z;
      const Vec y_ref = linear_d(to_double(x), to_double(w), bias_d, batch, in, out, act, &z);
      REQUIRE(min_abs(z) > 1e-3);
      check_close(y, y_ref, "forward");

      const Fn f = [&](const Inputs& v) {
        return mse_d(linear_d(v[0], v[1], with_bias ? v[2] : Vec{}, batch, in, out, act), v[3]);
      };
      const Inputs inputs{to_double(x), to_double(w), to_double(b), to_double(t)};
      CHECK(loss.item() == doctest::Approx(f(inputs)).epsilon(1e-5));
      check_close(tx.grad(), numeric_grad(f, inputs, 0), "dX");
      check_close(tw.grad(), numeric_grad(f, inputs, 1), "dW");
      if (with_bias) check_close(tb.grad(), numeric_grad(f, inputs, 2), "db");
    }
  }
}

TEST_CASE("gradcheck: add, sub and mul by a scalar") {
  constexpr std::size_t n = 6;
  const auto a = test_values(n, 20), b = test_values(n, 21), t = test_values(n, 22);
  const Inputs in{to_double(a), to_double(b), to_double(t)};

  SUBCASE("add") {
    Tensor ta = leaf(a, {2, 3}), tb = leaf(b, {2, 3});
    Tensor loss = mse_loss(add(ta, tb), constant(t, {2, 3}));
    loss.backward();
    const Fn f = [](const Inputs& v) {
      Vec s(v[0].size());
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = v[0][i] + v[1][i];
      return mse_d(s, v[2]);
    };
    check_close(ta.grad(), numeric_grad(f, in, 0), "da");
    check_close(tb.grad(), numeric_grad(f, in, 1), "db");
  }
  SUBCASE("sub") {
    Tensor ta = leaf(a, {2, 3}), tb = leaf(b, {2, 3});
    Tensor loss = mse_loss(ta - tb, constant(t, {2, 3}));
    loss.backward();
    const Fn f = [](const Inputs& v) {
      Vec s(v[0].size());
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = v[0][i] - v[1][i];
      return mse_d(s, v[2]);
    };
    check_close(ta.grad(), numeric_grad(f, in, 0), "da");
    check_close(tb.grad(), numeric_grad(f, in, 1), "db");
  }
  SUBCASE("mul") {
    Tensor ta = leaf(a, {2, 3});
    Tensor loss = mse_loss(-1.75f * ta, constant(t, {2, 3}));
    loss.backward();
    const Fn f = [](const Inputs& v) {
      Vec s(v[0].size());
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = -1.75 * v[0][i];
      return mse_d(s, v[2]);
    };
    check_close(ta.grad(), numeric_grad(f, in, 0), "da");
  }
}

TEST_CASE("gradcheck: relu and gelu") {
  constexpr std::size_t n = 10;
  const auto x = away_from_zero(n, 30);
  const auto x_gelu = test_values(n, 31, -3.0, 3.0);  // GELU's curvature lives around [-3, 3]
  const auto t = test_values(n, 32);
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    CAPTURE(static_cast<int>(act));
    const auto& xv = act == Activation::kRelu ? x : x_gelu;
    Tensor tx = leaf(xv, {2, 5});
    Tensor y = act == Activation::kRelu ? relu(tx) : gelu(tx);
    Tensor loss = mse_loss(y, constant(t, {2, 5}));
    loss.backward();
    const Fn f = [act](const Inputs& v) {
      Vec s(v[0].size());
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = act_d(v[0][i], act);
      return mse_d(s, v[1]);
    };
    const Inputs in{to_double(xv), to_double(t)};
    Vec y_ref(n);
    for (std::size_t i = 0; i < n; ++i) y_ref[i] = act_d(xv[i], act);
    check_close(y, y_ref, "forward");
    check_close(tx.grad(), numeric_grad(f, in, 0), "dx");
  }
}

TEST_CASE("gradcheck: sum and mean pass the upstream gradient on") {
  // loss = (reduce(x) - t)^2 makes the upstream gradient of the reduction 2 (reduce(x) - t),
  // not 1, so a backward that ignores its incoming gradient fails.
  const auto x = test_values(12, 40);
  const Inputs in{to_double(x)};
  for (bool is_mean : {false, true}) {
    CAPTURE(is_mean);
    Tensor tx = leaf(x, {3, 4});
    Tensor r = is_mean ? mean(tx) : sum(tx);
    CHECK(r.shape() == Shape{});
    Tensor loss = mse_loss(r, Tensor::full({}, 0.7f));
    loss.backward();
    const Fn f = [is_mean](const Inputs& v) {
      double s = 0.0;
      for (double e : v[0]) s += e;
      if (is_mean) s /= static_cast<double>(v[0].size());
      const double target = static_cast<double>(0.7f);
      return (s - target) * (s - target);
    };
    CHECK(loss.item() == doctest::Approx(f(in)).epsilon(1e-5));
    check_close(tx.grad(), numeric_grad(f, in, 0), "dx");
  }
  // And as the root: d sum / dx = 1, d mean / dx = 1/n.
  Tensor tx = leaf(x, {3, 4});
  sum(tx).backward();
  CHECK(tx.grad().to_vector() == std::vector<float>(12, 1.0f));
  Tensor tm = leaf(x, {3, 4});
  mean(tm).backward();
  check_close(tm.grad(), Vec(12, 1.0 / 12.0), "d mean");
}

TEST_CASE("gradcheck: mse_loss with respect to prediction and target") {
  const auto p = test_values(8, 50), t = test_values(8, 51);
  Tensor tp = leaf(p, {2, 4}), tt = leaf(t, {2, 4});
  Tensor loss = mse_loss(tp, tt);
  loss.backward();
  const Fn f = [](const Inputs& v) { return mse_d(v[0], v[1]); };
  const Inputs in{to_double(p), to_double(t)};
  CHECK(loss.item() == doctest::Approx(f(in)).epsilon(1e-6));
  check_close(tp.grad(), numeric_grad(f, in, 0), "dpred");
  check_close(tt.grad(), numeric_grad(f, in, 1), "dtarget");
  // Behind the mean: a scaled loss scales both gradients.
  Tensor tp2 = leaf(p, {2, 4}), tt2 = leaf(t, {2, 4});
  (mse_loss(tp2, tt2) * 3.0f).backward();
  Vec want = numeric_grad(f, in, 1);
  for (double& w : want) w *= 3.0;
  check_close(tt2.grad(), want, "dtarget scaled");
}

TEST_CASE("gradcheck: every parameter of a 3-layer MLP") {
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    CAPTURE(static_cast<int>(act));
    nn::MlpOptions options{.in_features = 3,
                           .out_features = 2,
                           .hidden = 5,
                           .layers = 2,
                           .activation = act,
                           .seed = 17};
    nn::Mlp model(options);
    const std::vector<nn::NamedTensor> params = model.named_parameters();
    REQUIRE(params.size() == 6);
    constexpr std::size_t batch = 4;
    const auto x = test_values(batch * 3, 60, -2.0, 2.0), t = test_values(batch * 2, 61);
    Tensor loss = mse_loss(model(constant(x, {batch, 3})), constant(t, {batch, 2}));
    loss.backward();

    // v[0..5] = parameters in registration order, v[6] = x, v[7] = target.
    const std::vector<std::size_t> widths{3, 5, 5, 2};
    double min_pre = std::numeric_limits<double>::infinity();
    const auto forward = [&](const Inputs& v, double* min_pre_out) {
      Vec h = v[6];
      for (std::size_t l = 0; l < 3; ++l) {
        Vec z;
        const Activation a = l == 2 ? Activation::kNone : act;
        h = linear_d(h, v[2 * l], v[2 * l + 1], batch, widths[l], widths[l + 1], a, &z);
        if (min_pre_out && l < 2) *min_pre_out = std::min(*min_pre_out, min_abs(z));
      }
      return mse_d(h, v[7]);
    };
    Inputs in;
    for (const auto& p : params) in.push_back(to_double(p.tensor.to_vector()));
    in.push_back(to_double(x));
    in.push_back(to_double(t));
    const double loss_ref = forward(in, &min_pre);
    REQUIRE(min_pre > 1e-4);  // no hidden unit sits on a ReLU kink
    CHECK(loss.item() == doctest::Approx(loss_ref).epsilon(1e-5));
    const Fn f = [&](const Inputs& v) { return forward(v, nullptr); };
    for (std::size_t i = 0; i < params.size(); ++i) {
      check_close(params[i].tensor.grad(), numeric_grad(f, in, i), params[i].name);
    }
  }
}

// ---- graph semantics ------------------------------------------------------------------------

TEST_CASE("gradients accumulate across backwards until zero_grad, then backward overwrites") {
  const auto w = test_values(6, 70), t1 = test_values(6, 71), t2 = test_values(6, 72);
  Tensor tw = leaf(w, {2, 3});
  const Fn f1 = [](const Inputs& v) { return mse_d(v[0], v[1]); };
  const Fn f2 = [](const Inputs& v) {
    Vec s(v[0].size());
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = 2.0 * v[0][i];
    return mse_d(s, v[1]);
  };
  const Vec g1 = numeric_grad(f1, {to_double(w), to_double(t1)}, 0);
  const Vec g2 = numeric_grad(f2, {to_double(w), to_double(t2)}, 0);

  CHECK_FALSE(tw.has_grad());
  CHECK_FALSE(tw.grad().defined());
  mse_loss(tw, constant(t1, {2, 3})).backward();
  check_close(tw.grad(), g1, "after first backward");
  mse_loss(tw * 2.0f, constant(t2, {2, 3})).backward();
  Vec sum(6);
  for (std::size_t i = 0; i < 6; ++i) sum[i] = g1[i] + g2[i];
  check_close(tw.grad(), sum, "accumulated");

  tw.zero_grad();
  CHECK_FALSE(tw.has_grad());
  CHECK_FALSE(tw.grad().defined());
  mse_loss(tw * 2.0f, constant(t2, {2, 3})).backward();
  check_close(tw.grad(), g2, "after zero_grad");
}

TEST_CASE("after zero_grad, backward overwrites a gradient buffer full of garbage") {
  // Every way a gradient reaches a leaf: GEMM (weight, input), column sums (bias),
  // mse_backward, broadcast_scalar (sum), and emitted tensors (add, sub, mul, relu).
  constexpr std::size_t batch = 3, in = 4, out = 2;
  const auto x = test_values(batch * in, 80), w = test_values(out * in, 81);
  const auto b = test_values(out, 82), t = test_values(batch * out, 83);
  Tensor tx = leaf(x, {batch, in}), tw = leaf(w, {out, in}), tb = leaf(b, {out});
  const auto make_loss = [&] {
    Tensor y = linear(tx, tw, tb, Activation::kGelu);
    // add/sub/mul/relu emit into x; sum accumulates into w through broadcast_scalar.
    Tensor extra = sum(relu(tx + tx * 0.5f - tx * 0.25f));
    return add(add(mse_loss(y, constant(t, {batch, out})), extra), sum(tw) * 0.1f);
  };
  make_loss().backward();
  const std::vector<float> gx = tx.grad().to_vector(), gw = tw.grad().to_vector(),
                           gb = tb.grad().to_vector();
  for (float v : gx) REQUIRE(std::isfinite(v));

  for (bool use_nan : {true, false}) {
    CAPTURE(use_nan);
    const float garbage = use_nan ? std::numeric_limits<float>::quiet_NaN() : 1e6f;
    for (Tensor* p : {&tx, &tw, &tb}) {
      Tensor buffer = p->grad();  // a handle to the buffer that zero_grad keeps
      p->zero_grad();
      buffer.fill(garbage);
    }
    make_loss().backward();
    CHECK(tx.grad().to_vector() == gx);
    CHECK(tw.grad().to_vector() == gw);
    CHECK(tb.grad().to_vector() == gb);
  }
}

TEST_CASE("release_grad drops the buffer, and the grad source supplies the next one, once") {
  // ZeRO-2's gradient memory (comm/reducer.h): a leaf without a buffer asks its grad source.
  // Every way a gradient reaches a leaf: GEMM (weight), column sums (bias), emitted (x).
  constexpr std::size_t batch = 3, in = 4, out = 2;
  const auto x = test_values(batch * in, 84), w = test_values(out * in, 85);
  const auto b = test_values(out, 86), t = test_values(batch * out, 87);
  Tensor tx = leaf(x, {batch, in}), tw = leaf(w, {out, in}), tb = leaf(b, {out});
  const auto make_loss = [&] {
    Tensor y = linear(tx, tw, tb, Activation::kGelu);
    return add(mse_loss(y, constant(t, {batch, out})), sum(relu(tx * 0.5f)));
  };
  make_loss().backward();
  const std::vector<float> gx = tx.grad().to_vector(), gw = tw.grad().to_vector(),
                           gb = tb.grad().to_vector();

  // One pool of memory for the three leaves, each asked for once per release.
  Tensor pool =
      Tensor::full({batch * in + out * in + out}, std::numeric_limits<float>::quiet_NaN());
  int asked = 0;
  const auto source_for = [&](std::int64_t offset, Shape shape) {
    return [&, offset, shape] {
      ++asked;
      return pool.view(offset, shape);
    };
  };
  tx.set_grad_source(source_for(0, {batch, in}));
  tw.set_grad_source(source_for(batch * in, {out, in}));
  tb.set_grad_source(source_for(batch * in + out * in, {out}));
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    for (Tensor* p : {&tx, &tw, &tb}) {
      p->release_grad();
      CHECK_FALSE(p->has_grad());
      CHECK_FALSE(p->grad().defined());
    }
    pool.fill(std::numeric_limits<float>::quiet_NaN());  // stale contents are overwritten
    make_loss().backward();
    CHECK(asked == 3 * (round + 1));
    CHECK(tx.grad().to_vector() == gx);
    CHECK(tw.grad().to_vector() == gw);
    CHECK(tb.grad().to_vector() == gb);
    // The gradients live in the pool.
    CHECK(pool.view(batch * in, {out * in}).to_vector() == gw);
  }
  // A second backward accumulates into the buffer it has: the source is not asked again.
  make_loss().backward();
  CHECK(asked == 6);
  CHECK(tw.grad().to_vector()[0] == 2.0f * gw[0]);

  // drop_grad_buffer: the gradient lives elsewhere, so has_grad() stays and grad() is undefined;
  // the next backward adds to what the source gives (zeros here) and asks once.
  for (Tensor* p : {&tx, &tw, &tb}) {
    p->drop_grad_buffer();
    CHECK(p->has_grad());
    CHECK_FALSE(p->grad().defined());
  }
  pool.zero();
  make_loss().backward();
  CHECK(asked == 9);
  CHECK(tw.grad().to_vector() == gw);
  tw.zero_grad();  // zero_grad clears a dropped gradient too
  tw.drop_grad_buffer();
  CHECK_FALSE(tw.has_grad());

  // A source that gives the wrong shape is an error naming the leaf.
  tw.set_name("w");
  tw.set_grad_source([&] { return pool.view(0, {in, out + 1}); });
  tw.release_grad();
  CHECK_THROWS_WITH(make_loss().backward(),
                    doctest::Contains("the grad source of 'w' gave a buffer of shape"));
}

TEST_CASE("a tensor used twice gets the sum of both gradients") {
  const auto x = test_values(6, 90), t = test_values(6, 91);
  SUBCASE("x + x for a leaf") {
    Tensor tx = leaf(x, {2, 3});
    mse_loss(tx + tx, constant(t, {2, 3})).backward();
    const Fn f = [](const Inputs& v) {
      Vec s(v[0].size());
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = 2.0 * v[0][i];
      return mse_d(s, v[1]);
    };
    check_close(tx.grad(), numeric_grad(f, {to_double(x), to_double(t)}, 0), "dx");
  }
  SUBCASE("h + h for an intermediate") {
    Tensor tx = leaf(x, {2, 3});
    Tensor h = gelu(tx);
    mse_loss(h + h, constant(t, {2, 3})).backward();
    const Fn f = [](const Inputs& v) {
      Vec s(v[0].size());
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = 2.0 * act_d(v[0][i], Activation::kGelu);
      return mse_d(s, v[1]);
    };
    check_close(tx.grad(), numeric_grad(f, {to_double(x), to_double(t)}, 0), "dx");
  }
  SUBCASE("one weight used by two linear layers") {
    constexpr std::size_t batch = 3, n = 4;
    const auto xi = test_values(batch * n, 92), w = test_values(n * n, 93);
    const auto b1 = test_values(n, 94), b2 = test_values(n, 95);
    const auto tt = test_values(batch * n, 96);
    Tensor tx = leaf(xi, {batch, n}), tw = leaf(w, {n, n});
    Tensor tb1 = leaf(b1, {n}), tb2 = leaf(b2, {n});
    Tensor y = linear(linear(tx, tw, tb1, Activation::kGelu), tw, tb2);
    mse_loss(y, constant(tt, {batch, n})).backward();
    const Fn f = [](const Inputs& v) {
      const Vec h = linear_d(v[0], v[1], v[2], batch, n, n, Activation::kGelu);
      return mse_d(linear_d(h, v[1], v[3], batch, n, n, Activation::kNone), v[4]);
    };
    const Inputs in{to_double(xi), to_double(w), to_double(b1), to_double(b2), to_double(tt)};
    check_close(tx.grad(), numeric_grad(f, in, 0), "dx");
    check_close(tw.grad(), numeric_grad(f, in, 1), "dW (two uses)");
    check_close(tb1.grad(), numeric_grad(f, in, 2), "db1");
    check_close(tb2.grad(), numeric_grad(f, in, 3), "db2");
  }
}

TEST_CASE("add hands one gradient to two inputs that both accumulate more (aliasing)") {
  const auto a = test_values(6, 100), b = test_values(6, 101), t = test_values(6, 102);
  const auto t2 = test_values(6, 103);
  const Inputs in{to_double(a), to_double(b), to_double(t), to_double(t2)};
  const auto elementwise = [](const Vec& u, const Vec& v, auto op) {
    Vec r(u.size());
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = op(u[i], v[i]);
    return r;
  };

  SUBCASE("leaves: y = a + b; z = 2y + a") {
    Tensor ta = leaf(a, {2, 3}), tb = leaf(b, {2, 3});
    Tensor y = ta + tb;
    Tensor z = y * 2.0f + ta;
    mse_loss(z, constant(t, {2, 3})).backward();
    const Fn f = [&](const Inputs& v) {
      const Vec yv = elementwise(v[0], v[1], [](double p, double q) { return p + q; });
      return mse_d(elementwise(yv, v[0], [](double p, double q) { return 2 * p + q; }), v[2]);
    };
    check_close(ta.grad(), numeric_grad(f, in, 0), "da");
    check_close(tb.grad(), numeric_grad(f, in, 1), "db");
  }
  SUBCASE("intermediates: both inputs of add get further emitted and accumulated gradients") {
    Tensor ta = leaf(a, {2, 3}), tb = leaf(b, {2, 3});
    Tensor ha = gelu(ta);  // nodes, not leaves: their gradients are summed by the pass
    Tensor hb = ta * 0.5f + tb;
    Tensor y = ha + hb;                                      // add emits g to both ha and hb
    Tensor z = y * 2.0f + ha;                                // ha: another emitted gradient
    Tensor loss = add(add(mse_loss(z, constant(t, {2, 3})),  // hb: an accumulated one
                          mse_loss(hb, constant(t2, {2, 3}))),
                      sum(hb) * 0.3f);
    loss.backward();
    const Fn f = [&](const Inputs& v) {
      Vec hav(v[0].size()), hbv(v[0].size());
      for (std::size_t i = 0; i < hav.size(); ++i) {
        hav[i] = act_d(v[0][i], Activation::kGelu);
        hbv[i] = 0.5 * v[0][i] + v[1][i];
      }
      const Vec yv = elementwise(hav, hbv, [](double p, double q) { return p + q; });
      const Vec zv = elementwise(yv, hav, [](double p, double q) { return 2 * p + q; });
      double s = 0.0;
      for (double e : hbv) s += e;
      return mse_d(zv, v[2]) + mse_d(hbv, v[3]) + 0.3 * s;
    };
    check_close(ta.grad(), numeric_grad(f, in, 0), "da");
    check_close(tb.grad(), numeric_grad(f, in, 1), "db");
  }
}

TEST_CASE("a gradient shared by add's two inputs is not modified in place by a later sum") {
  // Node order (creation): P = gelu(a), Q = gelu(b), R = 2P, y = P + Q, z = y + R.
  // Backward runs y before R (newest first): y hands ONE gradient tensor to both P and Q. Then R
  // adds its contribution to P while Q, older than R, has not run yet. Summing into the shared
  // tensor in place would hand Q the sum instead of its own gradient.
  const auto a = test_values(6, 105), b = test_values(6, 106), t = test_values(6, 107);
  Tensor ta = leaf(a, {2, 3}), tb = leaf(b, {2, 3});
  Tensor p = gelu(ta);
  Tensor q = gelu(tb);
  Tensor r = p * 2.0f;
  Tensor y = p + q;
  Tensor z = y + r;
  mse_loss(z, constant(t, {2, 3})).backward();
  const Fn f = [](const Inputs& v) {
    Vec zv(v[0].size());
    for (std::size_t i = 0; i < zv.size(); ++i) {
      const double pv = act_d(v[0][i], Activation::kGelu);
      const double qv = act_d(v[1][i], Activation::kGelu);
      zv[i] = (pv + qv) + 2.0 * pv;
    }
    return mse_d(zv, v[2]);
  };
  const Inputs in{to_double(a), to_double(b), to_double(t)};
  check_close(ta.grad(), numeric_grad(f, in, 0), "da");
  check_close(tb.grad(), numeric_grad(f, in, 1), "db");
}

TEST_CASE("among independent ready nodes, the most recently created runs first") {
  // Two towers that meet only in the loss: the second tower's layer was created later, so its
  // parameters' hooks fire first (as the last layer's do in a chain).
  Tensor x1 = constant(test_values(6, 150), {2, 3}), x2 = constant(test_values(6, 151), {2, 3});
  Tensor w1 = leaf(test_values(6, 152), {2, 3}), w2 = leaf(test_values(6, 153), {2, 3});
  std::vector<std::string> order;
  w1.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back("w1"); });
  w2.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back("w2"); });
  Tensor h1 = linear(x1, w1, Tensor(), Activation::kGelu);
  Tensor h2 = linear(x2, w2, Tensor(), Activation::kGelu);
  // Combine so that the older tower is the later input: order must not follow input order.
  add(sum(h2), sum(h1)).backward();
  CHECK(order == std::vector<std::string>{"w2", "w1"});
}

TEST_CASE("a hook handle removes that hook only, once, and a running hook cannot remove hooks") {
  Tensor w = leaf(test_values(4, 160), {2, 2});
  std::vector<std::string> fired;
  HookHandle a = w.register_post_accumulate_grad_hook([&](Tensor&) { fired.push_back("a"); });
  HookHandle b = w.register_post_accumulate_grad_hook([&](Tensor&) { fired.push_back("b"); });
  CHECK(w.post_accumulate_grad_hook_count() == 2);
  a.remove();
  a.remove();  // idempotent
  CHECK(w.post_accumulate_grad_hook_count() == 1);
  sum(w).backward();
  CHECK(fired == std::vector<std::string>{"b"});

  HookHandle self;
  self = w.register_post_accumulate_grad_hook([&](Tensor&) { self.remove(); });
  w.zero_grad();
  CHECK_THROWS_WITH_AS(sum(w).backward(), doctest::Contains("cannot remove hooks"), Error);
  b.remove();
  self.remove();  // outside the pass it can
  CHECK(w.post_accumulate_grad_hook_count() == 0);
  HookHandle{}.remove();  // a default handle removes nothing
}

TEST_CASE("NoGrad records nothing and restores the previous mode") {
  Tensor w = leaf(test_values(4, 110), {2, 2});
  CHECK(NoGrad::grad_enabled());
  {
    NoGrad outer;
    CHECK_FALSE(NoGrad::grad_enabled());
    {
      NoGrad inner;
      CHECK_FALSE(NoGrad::grad_enabled());
    }
    CHECK_FALSE(NoGrad::grad_enabled());  // the inner scope restores "off", not "on"
    Tensor y = matmul(w, w) * 2.0f + w;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    CHECK(y.is_leaf());
    Tensor loss = mse_loss(y, Tensor::zeros({2, 2}));
    CHECK(loss.grad_fn() == nullptr);
    CHECK_THROWS_AS(loss.backward(), Error);
  }
  CHECK(NoGrad::grad_enabled());
  Tensor y = w * 2.0f;
  CHECK(y.requires_grad());
  CHECK(y.grad_fn() != nullptr);
  CHECK_FALSE(w.has_grad());
}

TEST_CASE("backward errors: non-scalar root, second backward, nothing requires a gradient") {
  Tensor w = leaf(test_values(6, 120), {2, 3});

  const std::string non_scalar = error_message([&] { (w * 2.0f).backward(); });
  CHECK(non_scalar.find("one-element") != std::string::npos);
  CHECK(non_scalar.find("[2, 3]") != std::string::npos);

  Tensor loss = mse_loss(relu(w * 3.0f), Tensor::zeros({2, 3}));
  loss.backward();
  const std::vector<float> first = w.grad().to_vector();
  const std::string twice = error_message([&] { loss.backward(); });
  CHECK(twice.find("second time") != std::string::npos);
  CHECK(w.grad().to_vector() == first);  // the failed backward added nothing

  const Tensor plain = Tensor::full({}, 2.0f);
  const std::string no_grad = error_message([&] { plain.backward(); });
  CHECK(no_grad.find("does not require a gradient") != std::string::npos);
  const Tensor from_constants = sum(Tensor::ones({3}) * 2.0f);
  CHECK_THROWS_AS(from_constants.backward(), Error);
}

// ---- post-accumulate-grad hooks -----------------------------------------------------------------

TEST_CASE("a leaf's hook fires once per backward, after its gradient is complete") {
  constexpr std::size_t batch = 3, n = 4;
  Tensor tx = constant(test_values(batch * n, 130), {batch, n});
  Tensor tw = leaf(test_values(n * n, 131), {n, n});
  Tensor tb = leaf(test_values(n, 132), {n});
  const Tensor target = constant(test_values(batch * n, 133), {batch, n});

  int w_calls = 0, b_calls = 0;
  std::vector<float> w_grad_in_hook;
  bool b_complete_in_hook = false;
  tw.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++w_calls;
    CHECK(p.is_same(tw));
    REQUIRE(p.has_grad());
    w_grad_in_hook = p.grad().to_vector();
  });
  tb.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++b_calls;
    b_complete_in_hook = p.has_grad();
  });

  // w is used by both layers (and b too) and also by an extra sum: three contributions each.
  const auto make_loss = [&] {
    Tensor y = linear(linear(tx, tw, tb, Activation::kGelu), tw, tb);
    return add(mse_loss(y, target), add(sum(tw), sum(tb)) * 0.1f);
  };
  make_loss().backward();
  CHECK(w_calls == 1);
  CHECK(b_calls == 1);
  CHECK(b_complete_in_hook);
  CHECK(w_grad_in_hook == tw.grad().to_vector());

  // The gradient in the hook is the full one: compare with the double reference.
  const Fn f = [&](const Inputs& v) {
    const Vec h = linear_d(v[0], v[1], v[2], batch, n, n, Activation::kGelu);
    double s = 0.0;
    for (double e : v[1]) s += e;
    for (double e : v[2]) s += e;
    return mse_d(linear_d(h, v[1], v[2], batch, n, n, Activation::kNone), v[3]) + 0.1 * s;
  };
  const Inputs in{to_double(tx.to_vector()), to_double(tw.to_vector()), to_double(tb.to_vector()),
                  to_double(target.to_vector())};
  check_close(constant(w_grad_in_hook, {n, n}), numeric_grad(f, in, 1), "grad in hook");

  // A second backward (accumulating) fires each hook once more.
  make_loss().backward();
  CHECK(w_calls == 2);
  CHECK(b_calls == 2);
  CHECK(w_grad_in_hook == tw.grad().to_vector());
}

TEST_CASE("a backward callback that throws: the later callbacks are aborted, not run") {
  // Two end-of-pass callbacks, queued in this order from a hook (as Reducers do). When the first
  // throws, backward() throws, and the second's owner must hear of it through its on_abort (to
  // wait for collectives it launched) instead of being skipped in silence.
  Tensor a = leaf(test_values(3, 150), {3});
  bool second_ran = false, second_aborted = false, first_aborted = false;
  a.register_post_accumulate_grad_hook([&](Tensor&) {
    queue_backward_callback([] { throw Error("the first owner failed"); },
                            [&] { first_aborted = true; });
    queue_backward_callback([&] { second_ran = true; }, [&] { second_aborted = true; });
  });
  CHECK_THROWS_WITH_AS(sum(a * 2.0f).backward(), doctest::Contains("first owner failed"), Error);
  CHECK_FALSE(second_ran);
  CHECK(second_aborted);
  CHECK_FALSE(first_aborted);  // its own on_done ran (and threw): nothing to abort for it
  // No pass is left half-open: the next backward runs.
  Tensor c = leaf(test_values(3, 152), {3});
  CHECK_NOTHROW(sum(c).backward());
}

TEST_CASE("x + x: the hook fires once, with both contributions in") {
  Tensor x = leaf(test_values(4, 140), {4});
  int calls = 0;
  std::vector<float> in_hook;
  x.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++calls;
    in_hook = p.grad().to_vector();
  });
  sum(x + x).backward();
  CHECK(calls == 1);
  CHECK(in_hook == std::vector<float>(4, 2.0f));
}

TEST_CASE("hooks on an MLP fire in reverse layer order, in the middle of backward") {
  nn::MlpOptions options{.in_features = 4,
                         .out_features = 3,
                         .hidden = 6,
                         .layers = 3,
                         .activation = Activation::kRelu,
                         .seed = 3};
  nn::Mlp model(options);
  const std::vector<nn::NamedTensor> params = model.named_parameters();
  REQUIRE(params.size() == 8);  // layers.0, .2, .4, .6: weight and bias each

  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> in_hook;
  std::map<std::string, bool> first_layer_had_grad;
  for (const auto& p : params) {
    Tensor t = p.tensor;
    const std::string name = p.name;
    t.register_post_accumulate_grad_hook([&, name](Tensor& param) {
      order.push_back(name);
      in_hook[name] = param.grad().to_vector();
      first_layer_had_grad[name] = params[0].tensor.has_grad();
    });
  }
  const Tensor x = Tensor::normal({5, 4}, 0.0f, 1.0f, {.seed = 9, .stream = 0});
  const Tensor y = Tensor::normal({5, 3}, 0.0f, 1.0f, {.seed = 9, .stream = 1});
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    order.clear();
    model.zero_grad();
    mse_loss(model(x), y).backward();
    REQUIRE(order.size() == params.size());
    // Layer index of each hook call: 6, 6, 4, 4, 2, 2, 0, 0.
    std::vector<int> layer_of_call;
    for (const std::string& name : order) layer_of_call.push_back(name[7] - '0');
    CHECK(layer_of_call == std::vector<int>{6, 6, 4, 4, 2, 2, 0, 0});
    for (const auto& p : params) {
      CAPTURE(p.name);
      CHECK(std::count(order.begin(), order.end(), p.name) == 1);
      CHECK(in_hook[p.name] == p.tensor.grad().to_vector());
    }
    // When the last layer's hooks ran, the first layer's gradient did not exist yet.
    CHECK_FALSE(first_layer_had_grad["layers.6.weight"]);
    CHECK_FALSE(first_layer_had_grad["layers.6.bias"]);
  }
}

}  // namespace nanoddp

namespace nanoddp {

// An outside tester's: a running total kept as a tensor (`total = add(total, loss)`) and dropped
// without a backward freed its graph one destructor inside another, and overflowed the stack.
TEST_CASE("autograd: a graph 300,000 nodes deep is freed without a backward") {
  Tensor w = Tensor::ones({1}).set_requires_grad(true);
  {
    Tensor total = mul(w, 1.0f);
    for (int i = 0; i < 300000; ++i) total = add(total, w);
    CHECK(total.item() == 300001.0f);
  }  // the whole chain goes here
  // And a shared tail survives a dropped head: the nodes another tensor still holds stay.
  Tensor tail = mul(w, 2.0f);
  {
    Tensor head = tail;
    for (int i = 0; i < 1000; ++i) head = add(head, w);
  }
  tail.backward();
  CHECK(w.grad().item() == 2.0f);
}

}  // namespace nanoddp
