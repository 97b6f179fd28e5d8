// The optimizer in backward (nn/optimizer_in_backward.h) against the plain optimizer step after
// backward: the same parameters and optimizer state, to the bit, for SGD and AdamW, with
// gradient accumulation and with a parameter that gets no gradient; plus its NaN count and its
// misuse errors.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/optimizer_in_backward.h"
#include "nn/half_used.h"

namespace nanoddp::nn {
namespace {

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(FlatParameters&)>;

struct Run {
  std::vector<float> values;
  std::vector<std::vector<float>> state;
  std::int64_t steps = 0;
};

Tensor batch(std::int64_t rows, std::int64_t cols, std::uint64_t seed, std::uint64_t stream) {
  return Tensor::normal({rows, cols}, 0.0f, 1.0f, {.seed = seed, .stream = stream});
}

// Trains `model` for `steps` steps of `micro_batches` micro-batches each, with the optimizer
// stepping after backward or inside it.
Run train(Module& model, std::int64_t in, std::int64_t out, const MakeOptimizer& make,
          bool in_backward, int steps, int micro_batches) {
  FlatParameters flat(model, Device::cpu());
  std::unique_ptr<Optimizer> optimizer = make(flat);
  std::unique_ptr<OptimizerInBackward> fused;
  if (in_backward) {
    fused = std::make_unique<OptimizerInBackward>(*optimizer, flat, OptimizerInBackwardOptions{});
  }
  for (int step = 0; step < steps; ++step) {
    optimizer->zero_grad();
    for (int m = 0; m < micro_batches; ++m) {
      const auto seed = static_cast<std::uint64_t>(100 + step * micro_batches + m);
      const Tensor x = batch(8, in, seed, 0), y = batch(8, out, seed, 1);
      if (fused && m + 1 == micro_batches) fused->arm();
      mse_loss(model(x), y).backward();
    }
    if (fused) {
      fused->finish();
      CHECK(fused->nonfinite_gradients() == 0);
    } else {
      optimizer->step();
    }
  }
  Run run{.values = flat.values().to_vector(), .steps = optimizer->steps()};
  for (const NamedTensor& s : optimizer->state()) run.state.push_back(s.tensor.to_vector());
  return run;
}

void check_bits_equal(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  REQUIRE(a.size() == b.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    differ += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
  }
  CHECK_MESSAGE(differ == 0, what, ": ", differ, " of ", a.size(), " elements differ");
  // Two runs that both went to NaN hold the same bits whatever either computed on the way.
  const auto bad = std::find_if(a.begin(), a.end(), [](float v) { return !std::isfinite(v); });
  CHECK_MESSAGE(bad == a.end(), what, ": element ", bad - a.begin(), " is not finite");
}

void check_same(const Run& plain, const Run& fused) {
  CHECK(plain.steps == fused.steps);
  check_bits_equal(plain.values, fused.values, "parameters");
  REQUIRE(plain.state.size() == fused.state.size());
  for (std::size_t i = 0; i < plain.state.size(); ++i) {
    check_bits_equal(plain.state[i], fused.state[i], "optimizer state " + std::to_string(i));
  }
}

const std::vector<std::pair<std::string, MakeOptimizer>>& optimizers() {
  static const std::vector<std::pair<std::string, MakeOptimizer>> all{
      {"sgd momentum + nesterov + decay",
       [](FlatParameters& f) {
         return std::make_unique<SGD>(
             f, SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true});
       }},
      {"adamw",
       [](FlatParameters& f) {
         return std::make_unique<AdamW>(f, AdamWOptions{.lr = 0.01f, .weight_decay = 0.1f});
       }},
  };
  return all;
}

}  // namespace

TEST_CASE("optimizer in backward: an MLP ends bit-for-bit where optimizer.step() takes it") {
  for (const auto& [name, make] : optimizers()) {
    for (const int micro_batches : {1, 3}) {
      CAPTURE(name);
      CAPTURE(micro_batches);
      const MlpOptions shape{.in_features = 7, .out_features = 3, .hidden = 9, .layers = 2};
      Mlp plain_model(shape), fused_model(shape);
      const Run plain = train(plain_model, 7, 3, make, false, 5, micro_batches);
      const Run fused = train(fused_model, 7, 3, make, true, 5, micro_batches);
      check_same(plain, fused);
      // And the parameters did move (an optimizer that never ran would also "agree").
      Mlp initial(shape);
      FlatParameters initial_flat(initial, Device::cpu());
      CHECK(initial_flat.values().to_vector() != fused.values);
    }
  }
}

TEST_CASE("optimizer in backward: a parameter without a gradient is skipped, as by step()") {
  for (const auto& [name, make] : optimizers()) {
    CAPTURE(name);
    Generator gen_a(3), gen_b(3);
    testing::HalfUsed plain_model(gen_a, 6, 5), fused_model(gen_b, 6, 5);
    const Run plain = train(plain_model, 6, 5, make, false, 4, 1);
    const Run fused = train(fused_model, 6, 5, make, true, 4, 1);
    check_same(plain, fused);
  }
  // finish() updates no parameter of `second` (weight and bias): they got no gradient, so weight
  // decay leaves them alone too.
  Generator gen(3);
  testing::HalfUsed model(gen, 6, 5);
  FlatParameters flat(model, Device::cpu());
  SGD sgd(flat, {.lr = 0.1f, .weight_decay = 0.5f});
  OptimizerInBackward fused(sgd, flat, {});
  const std::vector<float> before = flat.values().to_vector();
  fused.arm();
  mse_loss(model(batch(4, 6, 1, 0)), batch(4, 5, 1, 1)).backward();
  CHECK(fused.finish() == 0);
  const std::vector<float> after = flat.values().to_vector();
  for (const ParameterSlot& slot : flat.slots()) {
    CAPTURE(slot.name);
    const auto begin = static_cast<std::ptrdiff_t>(slot.offset);
    const auto end = begin + static_cast<std::ptrdiff_t>(slot.numel);
    CHECK(std::equal(before.begin() + begin, before.begin() + end, after.begin() + begin) ==
          slot.name.starts_with("second."));
  }
}

namespace {
// Two heads; `use_b` says whether the next forward adds head b.
class OptionalHead : public Module {
 public:
  explicit OptionalHead(Generator& g)
      : a_(register_module("a", std::make_shared<Linear>(4, 2, g))),
        b_(register_module("b", std::make_shared<Linear>(4, 2, g))) {}
  bool use_b = true;
  Tensor forward(const Tensor& x) override {
    Tensor y = a_->forward(x);
    return use_b ? add(y, b_->forward(x)) : y;
  }
  std::string describe() const override { return "OptionalHead"; }

 private:
  std::shared_ptr<Linear> a_, b_;
};
}  // namespace

TEST_CASE(
    "optimizer in backward: a gradient from an earlier micro-batch only is applied at finish()") {
  Generator gen(5);
  OptionalHead model(gen);
  FlatParameters flat(model, Device::cpu());
  SGD sgd(flat, {.lr = 0.1f, .momentum = 0.9f});
  OptimizerInBackward fused(sgd, flat, {});
  const std::vector<float> before = flat.values().to_vector();
  sgd.zero_grad();
  model.use_b = true;  // micro-batch 0 (not armed): both heads
  mse_loss(model(batch(4, 4, 1, 0)), batch(4, 2, 1, 1)).backward();
  model.use_b = false;  // micro-batch 1 (armed): head a only
  fused.arm();
  mse_loss(model(batch(4, 4, 2, 0)), batch(4, 2, 2, 1)).backward();
  CHECK(fused.finish() == 2);  // b.weight and b.bias
  const std::vector<float> after = flat.values().to_vector();
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i] != before[i]);
  CHECK(sgd.param_steps() == std::vector<std::int64_t>(flat.slots().size(), 1));
}

TEST_CASE("optimizer in backward: updates happen during backward, and only when armed") {
  const MlpOptions shape{.in_features = 4, .out_features = 2, .hidden = 3, .layers = 1};
  Mlp model(shape);
  FlatParameters flat(model, Device::cpu());
  SGD sgd(flat, {.lr = 0.1f});
  OptimizerInBackward fused(sgd, flat, {});
  const std::vector<float> before = flat.values().to_vector();

  // Not armed: backward only accumulates.
  mse_loss(model(batch(4, 4, 1, 0)), batch(4, 2, 1, 1)).backward();
  CHECK(flat.values().to_vector() == before);
  CHECK(sgd.steps() == 0);

  // Armed: backward() returns with every parameter already updated; finish() has nothing left.
  sgd.zero_grad();
  fused.arm();
  CHECK(fused.armed());
  mse_loss(model(batch(4, 4, 2, 0)), batch(4, 2, 2, 1)).backward();
  const std::vector<float> after = flat.values().to_vector();
  std::size_t moved = 0;
  for (std::size_t i = 0; i < after.size(); ++i) moved += after[i] != before[i];
  CHECK(moved == after.size());
  CHECK(fused.finish() == 0);
  CHECK_FALSE(fused.armed());
  CHECK(sgd.steps() == 1);
}

TEST_CASE("optimizer in backward: NaN/Inf gradients are counted as they are applied") {
  const MlpOptions shape{.in_features = 4, .out_features = 2, .hidden = 3, .layers = 0};
  Mlp model(shape);
  FlatParameters flat(model, Device::cpu());
  AdamW adamw(flat, {});
  OptimizerInBackward fused(adamw, flat, {});
  // One input is Inf: it makes that row's predictions, so the loss gradient, NaN/Inf, and from
  // there part of the weight and bias gradients (the exact count is taken from the buffer).
  const Tensor initial = flat.values().clone();
  Tensor x = batch(3, 4, 5, 0);
  x.data()[2] = std::numeric_limits<float>::infinity();
  fused.arm();
  mse_loss(model(x), batch(3, 2, 5, 1)).backward();
  fused.finish();
  std::int64_t want = 0;
  for (const float g : flat.grads().to_vector()) want += std::isfinite(g) ? 0 : 1;
  CHECK(want > 0);
  CHECK(fused.nonfinite_gradients() == want);

  // The next step starts counting from zero (from finite parameters again: the NaN step above
  // was applied to them).
  Tensor(flat.values()).copy_from(initial);
  adamw.zero_grad();
  fused.arm();
  mse_loss(model(batch(3, 4, 6, 0)), batch(3, 2, 6, 1)).backward();
  fused.finish();
  CHECK(fused.nonfinite_gradients() == 0);
}

TEST_CASE("optimizer in backward: misuse is an Error, not a silent wrong step") {
  Mlp model(MlpOptions{.in_features = 2, .out_features = 1, .hidden = 2, .layers = 0});
  FlatParameters flat(model, Device::cpu());
  SGD sgd(flat, {.lr = 0.1f});
  OptimizerInBackward fused(sgd, flat, {});
  CHECK_THROWS_AS(fused.finish(), Error);  // finish() without arm()
  fused.arm();
  CHECK_THROWS_AS(fused.arm(), Error);  // arm() twice
  // The same parameter twice in one step (a caller feeding overlapping ranges).
  const std::vector<std::size_t> twice = {0, 0};
  CHECK_THROWS_AS(fused.update_range(0, 1, twice), Error);
  // A parameter index outside the model.
  const std::vector<std::size_t> outside = {flat.slots().size()};
  CHECK_THROWS_AS(sgd.update(outside), Error);
}

}  // namespace nanoddp::nn
