// The research ops on CUDA against their CPU twins: every op of engine/functional.h, forward and
// backward (through the same Tensor API, so the Backend dispatch is covered too), on sizes that
// are not multiples of any block size, plus the float4 path of the unary kernels and the
// device-side NaN of an out-of-range cross-entropy target. Runs only where a GPU is
// (gpu_main.cpp skips with 77).

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nanoddp/engine/functional.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"
#include "support/worst_error.h"

using namespace nanoddp;

namespace {

std::vector<float> values(std::size_t n, std::uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = (static_cast<std::uint32_t>(i) + 1u) * 2654435761u ^ seed * 40503u;
    v[i] = lo + (hi - lo) * static_cast<float>(h % 10007u) / 10007.0f;
  }
  return v;
}

struct Case {
  std::string name;
  std::vector<std::pair<Shape, std::vector<float>>> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> apply;
};

// Output and input gradients of sum(r * op(inputs)) on `device`.
std::vector<std::vector<float>> run(const Case& c, Device device) {
  std::vector<Tensor> leaves;
  for (const auto& [shape, v] : c.inputs) {
    Tensor t = Tensor::from_vector(v, shape, device);
    t.set_requires_grad(true);
    leaves.push_back(t);
  }
  const Tensor y = c.apply(leaves);
  const std::vector<float> r = values(static_cast<std::size_t>(y.numel()), 99);
  sum(mul(y, Tensor::from_vector(r, y.shape(), device))).backward();
  std::vector<std::vector<float>> out{y.to_vector()};
  for (const Tensor& l : leaves) out.push_back(l.grad().to_vector());
  return out;
}

}  // namespace

TEST_CASE("cuda functional ops match the CPU, forward and backward") {
  const auto in = [](Shape s, std::uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    return std::make_pair(s, values(static_cast<std::size_t>(shape_numel(s)), seed, lo, hi));
  };
  const Shape big{37, 301};  // 11137 elements: no multiple of 4, 32 or 256
  const Shape big4{64, 300};
  const std::vector<std::int64_t> targets = [] {
    std::vector<std::int64_t> t(37);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int64_t>((i * 7) % 301);
    t[5] = -100;
    return t;
  }();
  const std::vector<Case> cases{
      {"mul row", {in(big, 1), in({301}, 2)}, [](auto& t) { return mul(t[0], t[1]); }},
      {"div column",
       {in(big, 3), in({37, 1}, 4, 0.5f, 2.0f)},
       [](auto& t) { return div(t[0], t[1]); }},
      {"add scalar tensor", {in(big, 5), in({1}, 6)}, [](auto& t) { return add(t[0], t[1]); }},
      {"sub", {in(big, 7), in(big, 8)}, [](auto& t) { return sub(t[0], t[1]); }},
      {"unary chain",
       {in(big, 9)},
       [](auto& t) { return clamp(tanh(neg(t[0]) + 0.5f) * 3.0f, -1.0f, 2.0f); }},
      {"unary float4", {in(big4, 10)}, [](auto& t) { return sigmoid(exp(t[0]) / 3.0f); }},
      {"log sqrt pow",
       {in(big, 11, 0.1f, 3.0f)},
       [](auto& t) { return log(t[0]) + sqrt(pow(t[0], 1.5f)); }},
      {"transpose", {in(big, 12)}, [](auto& t) { return transpose(t[0]); }},
      {"narrow cat",
       {in(big, 13), in({37, 5}, 14)},
       [](auto& t) {
         return cat({narrow(t[0], 1, 7, 200), t[1]}, 1);
       }},
      {"split", {in(big, 15)}, [](auto& t) { return split(t[0], 10, 0)[3]; }},
      {"sum dim 0", {in(big, 16)}, [](auto& t) { return sum(t[0], 0); }},
      {"mean dim 1", {in(big, 17)}, [](auto& t) { return mean(t[0], 1, true); }},
      {"max dim 1", {in(big, 18)}, [](auto& t) { return max(t[0], 1).values; }},
      {"softmax dim 1", {in(big, 19, -30.0f, 30.0f)}, [](auto& t) { return softmax(t[0], 1); }},
      {"log_softmax dim 0", {in(big, 20)}, [](auto& t) { return log_softmax(t[0], 0); }},
      {"cross_entropy",
       {in(big, 21, -10.0f, 10.0f)},
       [&](auto& t) {
         return cross_entropy(t[0], Tensor::from_int64(targets, {37}, t[0].device()),
                              {.label_smoothing = 0.05f});
       }},
      {"dropout",
       {in(big, 22)},
       [](auto& t) {
         return dropout(t[0], 0.3f, true, RandomStream{.seed = 9, .stream = 2, .offset = 17});
       }},
      {"layer_norm",
       {in(big, 23), in({301}, 24), in({301}, 25)},
       [](auto& t) { return layer_norm(t[0], t[1], t[2]); }},
      {"embedding (atomicAdd scatter of repeated indices)",
       {in(big, 26)},
       [](auto& t) {
         std::vector<std::int64_t> index(3 * 41);
         for (std::size_t i = 0; i < index.size(); ++i) {
           index[i] = static_cast<std::int64_t>((i * 13) % 37 % 9);  // rows 0-8, many repeats
         }
         return embedding(t[0], Tensor::from_int64(index, {3, 41}, t[0].device()));
       }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto cpu = run(c, Device::cpu());
    const auto gpu = run(c, Device::cuda(0));
    REQUIRE(cpu.size() == gpu.size());
    for (std::size_t k = 0; k < cpu.size(); ++k) {
      CAPTURE(k);
      REQUIRE(cpu[k].size() == gpu[k].size());
      double worst = 0.0;
      for (std::size_t i = 0; i < cpu[k].size(); ++i) {
        worst = nanoddp::test::worse(worst, std::abs(static_cast<double>(cpu[k][i]) - gpu[k][i]) /
                                                (1.0 + std::abs(static_cast<double>(cpu[k][i]))));
      }
      CHECK(worst <= 1e-5);
    }
  }
}

TEST_CASE("cuda cross_entropy: a target out of range gives a NaN loss (no host sync)") {
  const Tensor logits = Tensor::zeros({2, 3}, Device::cuda(0));
  const std::vector<std::int64_t> bad{0, 3};
  CHECK(std::isnan(cross_entropy(logits, Tensor::from_int64(bad, {2}, Device::cuda(0))).item()));
}

TEST_CASE("cuda embedding: an index out of range gives a row of NaN and no gradient") {
  Tensor weight = Tensor::ones({3, 2}, Device::cuda(0));
  weight.set_requires_grad(true);
  const std::vector<std::int64_t> index{1, 3, -1};
  const Tensor out = embedding(weight, Tensor::from_int64(index, {3}, Device::cuda(0)));
  const std::vector<float> got = out.to_vector();
  CHECK(got[0] == 1.0f);
  for (std::size_t i = 2; i < got.size(); ++i) CHECK(std::isnan(got[i]));
  sum(narrow(out, 0, 0, 1)).backward();
  CHECK(weight.grad().to_vector() == std::vector<float>{0, 0, 1, 1, 0, 0});
}

#endif  // NANODDP_WITH_CUDA
