// Modules with several inputs and outputs, train/eval mode, and the research blocks of
// nn/blocks.h (LayerNorm, Dropout, ResidualBlock, CrossEntropyLoss).

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/engine/functional.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/blocks.h"
#include "nanoddp/nn/layers.h"

using namespace nanoddp;

namespace {

// Two towers over one shared encoder, plus an auxiliary head on the second tower.
class TwoTower : public nn::Module {
 public:
  explicit TwoTower(Generator& g)
      : encoder_(register_module("encoder", std::make_shared<nn::Linear>(4, 6, g))),
        aux_(register_module("aux", std::make_shared<nn::Linear>(6, 3, g))) {}
  std::vector<Tensor> forward_many(std::span<const Tensor> in) override {
    const Tensor a = tanh(encoder_->forward(in[0]));
    const Tensor b = tanh(encoder_->forward(in[1]));
    return {sum(mul(a, b), 1), aux_->forward(b)};
  }
  std::string describe() const override { return "TwoTower"; }

 private:
  std::shared_ptr<nn::Linear> encoder_, aux_;
};

// One input, two outputs: the one-tensor forward must refuse it (which output would it be?).
class TwoOutputs : public nn::Module {
 public:
  std::vector<Tensor> forward_many(std::span<const Tensor> in) override { return {in[0], in[0]}; }
  std::string describe() const override { return "TwoOutputs"; }
};

class Neither : public nn::Module {
 public:
  std::string describe() const override { return "Neither"; }
};

}  // namespace

TEST_CASE("nn: a module takes several inputs and returns several outputs") {
  Generator g(1);
  TwoTower model(g);
  const Tensor a = Tensor::uniform({5, 4}, -1, 1, g.next());
  const Tensor b = Tensor::uniform({5, 4}, -1, 1, g.next());
  const std::vector<Tensor> out = model(a, b);
  REQUIRE(out.size() == 2);
  CHECK(out[0].shape() == Shape{5});
  CHECK(out[1].shape() == Shape{5, 3});
  // Both towers' gradients reach the shared encoder; the auxiliary loss reaches aux.
  const std::vector<std::int64_t> t{0, 1, 2, 0, 1};
  add(mean(out[0]), cross_entropy(out[1], Tensor::from_int64(t, {5}))).backward();
  for (const nn::NamedTensor& p : model.named_parameters()) {
    CAPTURE(p.name);
    CHECK(p.tensor.has_grad());
  }
  // The span form and the one-input bridges.
  const std::vector<Tensor> inputs{a, b};
  CHECK(model(std::span<const Tensor>(inputs)).size() == 2);
  // (Not `model(a)`: TwoTower reads two inputs, and calling it with one read past the span, which
  // AddressSanitizer caught.)
  TwoOutputs two;
  CHECK_THROWS_WITH_AS(two(a), doctest::Contains("returns 2 outputs"), Error);
  nn::Linear lin(4, 2, g);
  const std::vector<Tensor> one = lin.forward_many(std::span<const Tensor>(&a, 1));
  CHECK(one.at(0).to_vector() == lin(a).to_vector());
  CHECK_THROWS_WITH_AS(lin(a, b), doctest::Contains("takes one input"), Error);
  Neither neither;
  CHECK_THROWS_WITH_AS(neither(a), doctest::Contains("implements neither"), Error);
}

TEST_CASE("nn: LayerNorm and ResidualBlock are named like PyTorch and train every parameter") {
  Generator g(2);
  nn::ResidualBlock block({.features = 8, .hidden = 16}, g);
  std::vector<std::string> names;
  for (const nn::NamedTensor& p : block.named_parameters()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"norm.weight", "norm.bias", "fc1.weight", "fc1.bias",
                                          "fc2.weight", "fc2.bias"});
  const Tensor x = Tensor::uniform({3, 8}, -1, 1, g.next());
  const Tensor y = block(x);
  CHECK(y.shape() == Shape{3, 8});
  sum(mul(y, y)).backward();
  for (const nn::NamedTensor& p : block.named_parameters()) {
    CAPTURE(p.name);
    REQUIRE(p.tensor.has_grad());
    double norm = 0;
    for (float v : p.tensor.grad().to_vector()) norm += static_cast<double>(v) * v;
    CHECK(norm > 0);
  }
  CHECK_THROWS_AS(nn::LayerNorm(0), Error);
}

TEST_CASE("nn: Embedding is named like PyTorch's, starts from N(0, 1) and trains its rows") {
  Generator g(3);
  nn::Embedding table(50, 8, g);
  const auto named = table.named_parameters();
  REQUIRE(named.size() == 1);
  CHECK(named[0].name == "weight");
  CHECK(named[0].tensor.shape() == Shape{50, 8});
  CHECK(table.describe() == "Embedding(num_embeddings=50, embedding_dim=8)");
  const std::vector<float> w = table.weight().to_vector();
  double mean = 0, square = 0;
  for (const float v : w) {
    mean += v;
    square += static_cast<double>(v) * v;
  }
  mean /= static_cast<double>(w.size());
  square /= static_cast<double>(w.size());
  CHECK(std::abs(mean) < 0.15);  // 400 draws: the standard error of the mean is 0.05
  CHECK(std::abs(square - 1.0) < 0.25);
  // Only the looked-up rows get a gradient.
  const std::vector<std::int64_t> index{7, 7, 0};
  sum(table(Tensor::from_int64(index, {3}))).backward();
  const std::vector<float> grad = table.weight().grad().to_vector();
  for (std::size_t row = 0; row < 50; ++row) {
    const float want = row == 7 ? 2.0f : row == 0 ? 1.0f : 0.0f;
    for (std::size_t j = 0; j < 8; ++j) CHECK(grad[row * 8 + j] == want);
  }
  CHECK_THROWS_WITH_AS(nn::Embedding(0, 8, g), doctest::Contains("must be positive"), Error);
}

TEST_CASE("nn: Dropout is active in training only, draws fresh masks, and reproduces") {
  const Tensor x = Tensor::ones({8, 64});
  nn::Sequential seq;
  auto drop = std::make_shared<nn::Dropout>(0.5f, RandomStream{.seed = 3, .stream = 0});
  seq.push_back(drop);
  const std::vector<float> first = seq(x).to_vector();
  const std::vector<float> second = seq(x).to_vector();
  CHECK(first != second);  // the offset moved on
  CHECK(drop->rng().offset == 2 * 512);
  nn::Dropout again(0.5f, RandomStream{.seed = 3, .stream = 0});
  CHECK(again(x).to_vector() == first);
  seq.eval();
  CHECK_FALSE(drop->is_training());
  CHECK(seq(x).is_same(x));
  seq.train();
  CHECK(seq(x).to_vector() != first);
}
