// The research ops of engine/functional.h beyond the finite-difference table of
// test_every_op.cpp: the ops that return several tensors (split, max), PyTorch's semantics at
// the edges (broadcast shapes, stable softmax and cross-entropy, ignore_index, label smoothing,
// dropout's mask and seeding, layer norm's statistics), the errors, and the cases handed to
// PyTorch by tests/engine/torch_ops.sh.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nanoddp/engine/functional.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {
namespace {

std::vector<float> ramp(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

// Deterministic values in [lo, hi) (a multiplicative hash; no two equal for small n).
std::vector<float> values(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = (static_cast<std::uint32_t>(i) + 1u) * 2654435761u ^ seed * 40503u;
    v[i] = lo + (hi - lo) * static_cast<float>(h % 10007u) / 10007.0f;
  }
  return v;
}

Tensor tv(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}

Tensor leaf(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::from_vector(v, shape);
  t.set_requires_grad(true);
  return t;
}

// Central differences of f(x) = sum_j r_j y_j(x) against the engine's gradient of the same sum
// (the check of test_every_op.cpp, for ops whose result is not one tensor).
void gradcheck(const std::vector<float>& x0, const Shape& shape,
               const std::function<Tensor(const Tensor&)>& fn) {
  Tensor x = leaf(x0, shape);
  const Tensor y = fn(x);
  const std::vector<float> r = values(static_cast<std::size_t>(y.numel()), 77);
  sum(mul(y, Tensor::from_vector(r, y.shape()))).backward();
  const std::vector<float> analytic = x.grad().to_vector();
  const auto f = [&](const std::vector<float>& v) {
    const NoGrad no_grad;
    const std::vector<float> out = fn(Tensor::from_vector(v, shape)).to_vector();
    double acc = 0.0;
    for (std::size_t j = 0; j < out.size(); ++j) acc += static_cast<double>(r[j]) * out[j];
    return acc;
  };
  std::vector<float> v = x0;
  for (std::size_t e = 0; e < v.size(); ++e) {
    const float saved = v[e];
    const float plus = saved + 1e-2f, minus = saved - 1e-2f;
    v[e] = plus;
    const double fp = f(v);
    v[e] = minus;
    const double fm = f(v);
    v[e] = saved;
    const double numeric = (fp - fm) / (static_cast<double>(plus) - minus);
    CHECK_MESSAGE(std::abs(numeric - analytic[e]) <= 1e-3 + 1e-3 * std::abs(numeric),
                  "element " << e << ": analytic " << analytic[e] << ", numeric " << numeric);
  }
}

}  // namespace

TEST_CASE("functional: split's pieces and max's values carry gradients (finite differences)") {
  const std::vector<float> x = values(12, 1);
  SUBCASE("split into 2 + 2 + 1 columns, each weighted differently") {
    gradcheck(values(15, 2), {3, 5}, [](const Tensor& t) {
      const std::vector<Tensor> p = split(t, 2, 1);
      REQUIRE(p.size() == 3);
      CHECK(p[2].shape() == Shape{3, 1});
      return cat({mul(p[0], 2.0f), exp(p[1]), p[2]}, 1);
    });
  }
  SUBCASE("max over each dimension, keepdim or not; arguments 0.2 apart") {
    const std::vector<float> spread{0.3f, -0.5f, 0.9f, 0.0f, 0.6f, -0.2f};
    gradcheck(spread, {2, 3}, [](const Tensor& t) { return max(t, 1).values; });
    gradcheck(spread, {2, 3}, [](const Tensor& t) { return max(t, 0, true).values; });
  }
}

TEST_CASE("functional: max returns PyTorch's values and int64 indices") {
  const Tensor x = tv({1, 5, 5, 2, -1, 0}, {2, 3});
  const MaxResult m = max(x, 1);
  CHECK(m.values.to_vector() == std::vector<float>{5, 2});
  CHECK(m.indices.dtype() == DType::kI64);
  CHECK(m.indices.to_int64_vector() == std::vector<std::int64_t>{1, 0});  // first of the ties
  CHECK(max(x, 0, true).values.shape() == Shape{1, 3});
}

TEST_CASE("functional: binary ops broadcast the shapes MLPs use, and refuse the others") {
  const Tensor x = Tensor::from_vector(ramp(6, 1, 1), {2, 3});  // 1..6
  CHECK(add(x, tv({10, 20, 30}, {3})).to_vector() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK(mul(x, tv({10, 100}, {2, 1})).to_vector() == std::vector<float>{10, 20, 30, 400, 500, 600});
  CHECK(sub(tv({1}, {}), x).to_vector() == std::vector<float>{0, -1, -2, -3, -4, -5});
  CHECK(div(x, tv({2, 4, 8}, {1, 3})).shape() == Shape{2, 3});
  // [2, 1] x [1, 3] -> [2, 3] (an outer product)
  CHECK(mul(tv({1, 2}, {2, 1}), tv({1, 2, 3}, {1, 3})).to_vector() ==
        std::vector<float>{1, 2, 3, 2, 4, 6});
  CHECK_THROWS_WITH_AS(add(x, Tensor::ones({2})), doctest::Contains("do not broadcast"), Error);
  CHECK_THROWS_WITH_AS(mul(Tensor::ones({2, 1, 3}), Tensor::ones({1, 4, 1})),
                       doctest::Contains("does not support"), Error);
}

TEST_CASE("functional: softmax and cross_entropy are stable for huge logits") {
  const Tensor logits = tv({1000, 0, -1000, 1000, 1000, 0}, {2, 3});
  const std::vector<float> p = softmax(logits, 1).to_vector();
  CHECK(p[0] == doctest::Approx(1.0));
  CHECK(p[3] == doctest::Approx(0.5));
  CHECK(std::isfinite(log_softmax(logits, 1).to_vector()[2]));
  const Tensor targets = Tensor::from_int64(std::vector<std::int64_t>{0, 2}, {2});
  // row 0: -log 1 = 0; row 1: -log(e^-1000 / 2) = 1000 + log 2
  CHECK(cross_entropy(logits, targets).item() == doctest::Approx((1000 + std::log(2.0)) / 2));
}

TEST_CASE("functional: cross_entropy's ignore_index and label_smoothing follow PyTorch") {
  const std::vector<float> v = values(12, 3);
  const Tensor logits = Tensor::from_vector(v, {4, 3});
  const auto lse = [&](int r) {
    double s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(static_cast<double>(v[r * 3 + c]));
    return std::log(s);
  };
  const std::vector<std::int64_t> t{2, 7, 1, 0};
  const Tensor targets = Tensor::from_int64(t, {4});
  // Row 1 is ignored: the mean is over 3 rows. With eps, each row is (1 - eps) nll + eps
  // mean_c(-log p_c).
  const double eps = 0.1;
  double expected = 0.0;
  for (int r : {0, 2, 3}) {
    double smooth = 0.0;
    for (int c = 0; c < 3; ++c) smooth += (lse(r) - v[r * 3 + c]) / 3.0;
    expected += (1 - eps) * (lse(r) - v[r * 3 + t[r]]) + eps * smooth;
  }
  const Tensor loss = cross_entropy(logits, targets, {.ignore_index = 7, .label_smoothing = 0.1f});
  CHECK(loss.item() == doctest::Approx(expected / 3).epsilon(1e-6));
  // All rows ignored: 0 / 0, NaN as in PyTorch.
  const std::vector<std::int64_t> none(4, -100);
  CHECK(std::isnan(cross_entropy(logits, Tensor::from_int64(none, {4})).item()));
  const std::vector<std::int64_t> bad{0, 3, 0, 0};
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_int64(bad, {4})),
                       doctest::Contains("target 3 of row 1"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::zeros({4})), doctest::Contains("int64"),
                       Error);
}

TEST_CASE("functional: dropout keeps about 1 - p, scales by 1 / (1 - p), reproduces from its rng") {
  const Tensor x = Tensor::ones({100, 100});
  const RandomStream rng{.seed = 42, .stream = 3, .offset = 0};
  const std::vector<float> y = dropout(x, 0.25f, true, rng).to_vector();
  int kept = 0;
  for (float v : y) {
    REQUIRE((v == 0.0f || v == doctest::Approx(1.0 / 0.75)));
    kept += v != 0.0f;
  }
  CHECK(kept > 7300);  // 7500 expected, sd 43
  CHECK(kept < 7700);
  CHECK(dropout(x, 0.25f, true, rng).to_vector() == y);  // the same rng, the same mask
  RandomStream other_rank = rng;
  other_rank.stream = 4;
  CHECK(dropout(x, 0.25f, true, other_rank).to_vector() != y);
  CHECK(dropout(x, 0.25f, false, rng).is_same(x));  // evaluation: x itself
  CHECK(dropout(x, 1.0f, true, rng).to_vector() == std::vector<float>(10000, 0.0f));
  CHECK_THROWS_WITH_AS(dropout(x, 1.5f, true, rng), doctest::Contains("[0, 1]"), Error);
  // The gradient is the mask, scaled.
  Tensor w = leaf(std::vector<float>(10000, 2.0f), {100, 100});
  sum(dropout(w, 0.25f, true, rng)).backward();
  const std::vector<float> g = w.grad().to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == y[i]);
}

TEST_CASE("functional: layer_norm normalises each row (biased variance, eps inside the root)") {
  const Tensor x = Tensor::from_vector(values(40, 4, -3.0f, 5.0f), {4, 10});
  const std::vector<float> y = layer_norm(x, Tensor(), Tensor()).to_vector();
  for (int r = 0; r < 4; ++r) {
    double m = 0, s = 0;
    for (int c = 0; c < 10; ++c) m += y[r * 10 + c] / 10.0;
    for (int c = 0; c < 10; ++c) s += (y[r * 10 + c] - m) * (y[r * 10 + c] - m) / 10.0;
    CHECK(std::abs(m) < 1e-6);
    CHECK(s == doctest::Approx(1.0).epsilon(1e-4));
  }
  CHECK_THROWS_WITH_AS(layer_norm(x, Tensor::ones({9}), Tensor()), doctest::Contains("[10]"),
                       Error);
}

TEST_CASE("functional: shape ops and their errors") {
  const Tensor x = Tensor::from_vector(ramp(6, 0, 1), {2, 3});
  CHECK(transpose(x).to_vector() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(narrow(x, 1, 1, 2).to_vector() == std::vector<float>{1, 2, 4, 5});
  CHECK(narrow(x, -1, -1, 1).to_vector() == std::vector<float>{2, 5});
  CHECK(cat({x, x}, 0).shape() == Shape{4, 3});
  CHECK(cat({narrow(x, 1, 2, 1), narrow(x, 1, 0, 2)}, 1).to_vector() ==
        std::vector<float>{2, 0, 1, 5, 3, 4});
  CHECK(sum(x, 0).to_vector() == std::vector<float>{3, 5, 7});
  CHECK(mean(x, 1, true).shape() == Shape{2, 1});
  CHECK_THROWS_WITH_AS(narrow(x, 1, 2, 2), doctest::Contains("do not fit"), Error);
  CHECK_THROWS_WITH_AS(cat({x, Tensor::ones({3, 2})}, 0), doctest::Contains("outside dimension"),
                       Error);
  CHECK_THROWS_WITH_AS(sum(x, 2), doctest::Contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(transpose(Tensor::ones({2, 2, 2})), doctest::Contains("2-D"), Error);
  // reshape and view infer one -1 (PyTorch's x.view(-1, n)).
  CHECK(x.reshape({-1}).shape() == Shape{6});
  CHECK(x.view({3, -1}).shape() == Shape{3, 2});
  CHECK_THROWS_WITH_AS(x.reshape({4, -1}), doctest::Contains("to [4, -1]"), Error);
  CHECK_THROWS_WITH_AS(x.reshape({-1, -1}), doctest::Contains("to [-1, -1]"), Error);
}

// An outside researcher's cases: a start near INT64_MAX passed the check (start + length
// overflowed) and narrow read and wrote outside the tensor; a negative start was reported after
// the size was added to it.
TEST_CASE("functional: narrow refuses starts and lengths that overflow, naming what was given") {
  Tensor x = leaf(ramp(8, 0, 1), {2, 4});
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  for (const std::int64_t start : {kMax - 1, kMax, kMax - 3}) {
    CHECK_THROWS_WITH_AS(narrow(x, 1, start, 2),
                         doctest::Contains(fmt::format("start {}", start).c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(narrow(x, 1, 1, kMax), doctest::Contains("do not fit dimension 1 of size 4"),
                       Error);
  CHECK_THROWS_WITH_AS(narrow(x, 1, std::numeric_limits<std::int64_t>::min(), 1),
                       doctest::Contains("must be in [-4, 4]"), Error);
  CHECK_THROWS_WITH_AS(narrow(x, 1, -5, 1), doctest::Contains("start -5 and length 1"), Error);
  CHECK(narrow(x, 1, -4, 1).to_vector() == std::vector<float>{0, 4});
  CHECK(narrow(x, 1, 4, 0).numel() == 0);  // an empty slice at the end, as in PyTorch
}

// An outside researcher masked a class with a -inf logit (the usual way to rule out items): the
// loss was NaN, from 0 * inf in the label-smoothing term that had weight 0. PyTorch gives log 3.
TEST_CASE("functional: cross_entropy with a -inf logit gives PyTorch's loss and gradient") {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor logits = leaf({-inf, 0, 0, 0}, {1, 4});
  const Tensor target = Tensor::from_int64(std::vector<std::int64_t>{1}, {1});
  Tensor loss = cross_entropy(logits, target);
  CHECK(loss.item() == doctest::Approx(std::log(3.0)));
  loss.backward();
  const std::vector<float> g = logits.grad().to_vector();
  CHECK(g[0] == 0.0f);
  CHECK(g[1] == doctest::Approx(1.0 / 3 - 1));
  CHECK(g[2] == doctest::Approx(1.0 / 3));
  // The masked class at the target: +inf, as in PyTorch; with smoothing the -inf term counts.
  const Tensor at_target = Tensor::from_int64(std::vector<std::int64_t>{0}, {1});
  CHECK(cross_entropy(tv({-inf, 0, 0, 0}, {1, 4}), at_target).item() == inf);
  CHECK(cross_entropy(tv({-inf, 0, 0, 0}, {1, 4}), target, {.label_smoothing = 0.1f}).item() ==
        inf);
  // eps = 1 leaves the target's own term out.
  CHECK(cross_entropy(tv({0, 0, 0, 0}, {1, 4}), target, {.label_smoothing = 1.0f}).item() ==
        doctest::Approx(std::log(4.0)));
}

// An outside researcher's empty batch: mean threw where PyTorch (and this library's own
// cross_entropy) give NaN.
TEST_CASE("functional: the mean of nothing is NaN, as in PyTorch") {
  Tensor empty = leaf({}, {0, 3});
  Tensor m = mean(empty);
  CHECK(std::isnan(m.item()));
  m.backward();  // a gradient of no elements
  CHECK(empty.grad().numel() == 0);
  const std::vector<float> rows = mean(Tensor::zeros({0, 3}), 0).to_vector();
  REQUIRE(rows.size() == 3);
  for (const float v : rows) CHECK(std::isnan(v));
  CHECK(mean(Tensor::zeros({2, 0}), 1).shape() == Shape{2});
  CHECK(std::isnan(mse_loss(Tensor::zeros({0, 2}), Tensor::zeros({0, 2})).item()));
  CHECK(sum(Tensor::zeros({0, 3})).item() == 0.0f);
}

// The cases tests/engine/torch_ops.sh hands to PyTorch: each op on fixed float32 inputs, its
// output, and the gradients of sum(r * output) for fixed weights r. Written to
// $NANODDP_TORCH_OPS_OUT when set; always computed and checked finite.
TEST_CASE("functional: embedding gathers rows, scatter-adds repeated ones, refuses bad indices") {
  const std::vector<float> table{0, 1, 10, 11, 20, 21, 30, 31};  // 4 rows of 2
  Tensor weight = Tensor::from_vector(table, {4, 2});
  weight.set_requires_grad(true);
  const std::vector<std::int64_t> index{2, 0, 2, 3, 2, 0};
  const Tensor out = embedding(weight, Tensor::from_int64(index, {2, 3}));
  CHECK(out.shape() == Shape{2, 3, 2});
  CHECK(out.to_vector() == std::vector<float>{20, 21, 0, 1, 20, 21, 30, 31, 20, 21, 0, 1});
  // The gradient of sum(out * g): each row's g summed into its index's row (row 1 unused: 0).
  std::vector<float> g(12);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i + 1);
  sum(mul(out, Tensor::from_vector(g, {2, 3, 2}))).backward();
  CHECK(weight.grad().to_vector() ==
        std::vector<float>{3 + 11, 4 + 12, 0, 0, 1 + 5 + 9, 2 + 6 + 10, 7, 8});
  // A second backward accumulates.
  sum(embedding(weight, Tensor::from_int64(std::vector<std::int64_t>{1}, {1}))).backward();
  CHECK(weight.grad().to_vector() == std::vector<float>{14, 16, 1, 1, 15, 18, 7, 8});

  CHECK_THROWS_WITH_AS(embedding(weight, Tensor::from_int64(std::vector<std::int64_t>{0, 4}, {2})),
                       doctest::Contains("index 4 (element 1 of indices [2]) is out of range for "
                                         "4 embeddings"),
                       Error);
  CHECK_THROWS_WITH_AS(embedding(weight, Tensor::from_int64(std::vector<std::int64_t>{-1}, {1})),
                       doctest::Contains("index -1"), Error);
  CHECK_THROWS_WITH_AS(embedding(weight, Tensor::zeros({2})),
                       doctest::Contains("indices must be an int64 tensor, got float32"), Error);
  CHECK_THROWS_WITH_AS(embedding(Tensor::zeros({4}), Tensor::from_int64(index, {6})),
                       doctest::Contains("must be [num_embeddings, embedding_dim]"), Error);
}

TEST_CASE("functional: cases for the PyTorch comparison") {
  using Json = nlohmann::json;
  struct Case {
    std::string op;
    Json args;
    std::vector<std::pair<Shape, std::vector<float>>> inputs;
    std::function<Tensor(const std::vector<Tensor>&)> apply;
  };
  const auto in = [](Shape s, std::uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    return std::make_pair(s, values(static_cast<std::size_t>(shape_numel(s)), seed, lo, hi));
  };
  const std::vector<std::int64_t> targets{3, 0, 4, 1, 1, -100};
  const std::vector<Case> cases{
      {"mul", {}, {in({6, 5}, 1), in({5}, 2)}, [](auto& t) { return mul(t[0], t[1]); }},
      {"div",
       {},
       {in({6, 5}, 3), in({6, 1}, 4, 0.5f, 2.0f)},
       [](auto& t) { return div(t[0], t[1]); }},
      {"add", {}, {in({6, 5}, 5), in({5}, 6)}, [](auto& t) { return add(t[0], t[1]); }},
      {"sub", {}, {in({6, 5}, 7), in({6, 5}, 8)}, [](auto& t) { return sub(t[0], t[1]); }},
      {"neg", {}, {in({6, 5}, 9)}, [](auto& t) { return neg(t[0]); }},
      {"exp", {}, {in({6, 5}, 10)}, [](auto& t) { return exp(t[0]); }},
      {"log", {}, {in({6, 5}, 11, 0.1f, 3.0f)}, [](auto& t) { return log(t[0]); }},
      {"sqrt", {}, {in({6, 5}, 12, 0.1f, 3.0f)}, [](auto& t) { return sqrt(t[0]); }},
      {"tanh", {}, {in({6, 5}, 13)}, [](auto& t) { return tanh(t[0]); }},
      {"sigmoid", {}, {in({6, 5}, 14)}, [](auto& t) { return sigmoid(t[0]); }},
      {"pow",
       {{"exponent", 1.5}},
       {in({6, 5}, 15, 0.1f, 3.0f)},
       [](auto& t) { return pow(t[0], 1.5f); }},
      {"clamp",
       {{"min", -0.5}, {"max", 1.0}},
       {in({6, 5}, 16)},
       [](auto& t) { return clamp(t[0], -0.5f, 1.0f); }},
      {"transpose", {}, {in({6, 5}, 17)}, [](auto& t) { return transpose(t[0]); }},
      {"narrow",
       {{"dim", 1}, {"start", 1}, {"length", 3}},
       {in({6, 5}, 18)},
       [](auto& t) { return narrow(t[0], 1, 1, 3); }},
      {"cat",
       {{"dim", 1}},
       {in({6, 5}, 19), in({6, 2}, 20)},
       [](auto& t) {
         return cat({t[0], t[1]}, 1);
       }},
      {"sum",
       {{"dim", 0}, {"keepdim", true}},
       {in({6, 5}, 21)},
       [](auto& t) { return sum(t[0], 0, true); }},
      {"mean",
       {{"dim", 1}, {"keepdim", false}},
       {in({6, 5}, 22)},
       [](auto& t) { return mean(t[0], 1); }},
      {"max", {{"dim", 1}}, {in({6, 5}, 23)}, [](auto& t) { return max(t[0], 1).values; }},
      {"embedding",
       {{"indices", {3, 0, 3, 5, 1, 3, 0, 2}}, {"indices_shape", {2, 4}}},
       {in({6, 5}, 40)},
       [](auto& t) {
         const std::vector<std::int64_t> index{3, 0, 3, 5, 1, 3, 0, 2};
         return embedding(t[0], Tensor::from_int64(index, {2, 4}));
       }},
      {"softmax",
       {{"dim", 1}},
       {in({6, 5}, 24, -20.0f, 20.0f)},
       [](auto& t) { return softmax(t[0], 1); }},
      {"log_softmax",
       {{"dim", 0}},
       {in({6, 5}, 25, -20.0f, 20.0f)},
       [](auto& t) { return log_softmax(t[0], 0); }},
      {"cross_entropy",
       {{"targets", targets}, {"ignore_index", -100}, {"label_smoothing", 0.1}},
       {in({6, 5}, 26, -5.0f, 5.0f)},
       [&](auto& t) {
         return cross_entropy(t[0], Tensor::from_int64(targets, {6}), {.label_smoothing = 0.1f});
       }},
      {"layer_norm",
       {{"eps", 1e-5}},
       {in({6, 5}, 27), in({5}, 28), in({5}, 29)},
       [](auto& t) { return layer_norm(t[0], t[1], t[2]); }},
  };
  Json out = Json::array();
  for (const Case& c : cases) {
    CAPTURE(c.op);
    std::vector<Tensor> leaves;
    Json inputs = Json::array();
    for (const auto& [shape, v] : c.inputs) {
      leaves.push_back(leaf(v, shape));
      inputs.push_back({{"shape", shape}, {"values", v}});
    }
    const Tensor y = c.apply(leaves);
    const std::vector<float> r = values(static_cast<std::size_t>(y.numel()), 99);
    sum(mul(y, Tensor::from_vector(r, y.shape()))).backward();
    Json grads = Json::array();
    for (const Tensor& l : leaves) {
      const std::vector<float> g = l.grad().to_vector();
      for (float v : g) REQUIRE(std::isfinite(v));
      grads.push_back(g);
    }
    const std::vector<float> yv = y.to_vector();
    for (float v : yv) REQUIRE(std::isfinite(v));
    out.push_back({{"op", c.op},
                   {"args", c.args},
                   {"inputs", inputs},
                   {"output", {{"shape", y.shape()}, {"values", yv}}},
                   {"weights", r},
                   {"grads", grads}});
  }
  if (const char* path = std::getenv("NANODDP_TORCH_OPS_OUT")) {
    std::ofstream file(path);
    file << out.dump();
    REQUIRE(file.good());
  }
}

}  // namespace nanoddp
