// Modules and FlatParameters: PyTorch-compatible names and shapes, initialisation, the flat
// buffer layout, parameters and gradients as views, and the MLP's forward.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nn/half_used.h"

namespace nanoddp::nn {
namespace {

struct Expected {
  std::string name;
  Shape shape;
};

void check_names_and_shapes(const Mlp& model, const std::vector<Expected>& expected) {
  const std::vector<NamedTensor> params = model.named_parameters();
  REQUIRE(params.size() == expected.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    CHECK(params[i].name == expected[i].name);
    CHECK(params[i].tensor.shape() == expected[i].shape);
    CHECK(params[i].tensor.requires_grad());
    CHECK(params[i].tensor.is_leaf());
  }
}

std::shared_ptr<Linear> linear_at(const Mlp& model, std::size_t index) {
  const auto& seq = model.children().at(0).second;
  return std::dynamic_pointer_cast<Linear>(seq->children().at(index).second);
}

}  // namespace

TEST_CASE("Mlp parameters are named and shaped like PyTorch's Sequential") {
  SUBCASE("layers = 2") {
    const Mlp model({.in_features = 5, .out_features = 3, .hidden = 7, .layers = 2});
    check_names_and_shapes(model, {{"layers.0.weight", {7, 5}},
                                   {"layers.0.bias", {7}},
                                   {"layers.2.weight", {7, 7}},
                                   {"layers.2.bias", {7}},
                                   {"layers.4.weight", {3, 7}},
                                   {"layers.4.bias", {3}}});
    CHECK(model.parameters().size() == 6);
  }
  SUBCASE("layers = 1") {
    const Mlp model({.in_features = 5, .out_features = 3, .hidden = 7, .layers = 1});
    check_names_and_shapes(model, {{"layers.0.weight", {7, 5}},
                                   {"layers.0.bias", {7}},
                                   {"layers.2.weight", {3, 7}},
                                   {"layers.2.bias", {3}}});
  }
  SUBCASE("layers = 0 is a single Linear(in, out)") {
    const Mlp model({.in_features = 5, .out_features = 3, .hidden = 7, .layers = 0});
    check_names_and_shapes(model, {{"layers.0.weight", {3, 5}}, {"layers.0.bias", {3}}});
  }
  CHECK_THROWS_AS(Mlp({.in_features = 5, .out_features = 3, .hidden = 7, .layers = -1}), Error);
  CHECK_THROWS_AS(Mlp({.in_features = 0, .out_features = 3, .hidden = 7, .layers = 1}), Error);
  CHECK_THROWS_AS(Mlp({.in_features = 5, .out_features = 3, .hidden = 0, .layers = 1}), Error);
  CHECK_THROWS_AS(Mlp({.in_features = 5,
                       .out_features = 3,
                       .hidden = 7,
                       .layers = 1,
                       .activation = Activation::kNone}),
                  Error);
}

TEST_CASE("Linear initialisation lies within +-1/sqrt(fan_in) and is spread out") {
  const Mlp model({.in_features = 16, .out_features = 4, .hidden = 64, .layers = 2, .seed = 1});
  for (const NamedTensor& p : model.named_parameters()) {
    CAPTURE(p.name);
    // fan_in of a weight [out, in] is in; the bias shares its layer's weight's bound.
    const std::string layer = p.name.substr(0, p.name.rfind('.'));
    std::int64_t fan_in = 0;
    for (const NamedTensor& q : model.named_parameters()) {
      if (q.name == layer + ".weight") fan_in = q.tensor.size(1);
    }
    REQUIRE(fan_in > 0);
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    const std::vector<float> v = p.tensor.to_vector();
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    // Each value in range (minmax_element passes over a NaN that does not come first).
    CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x >= -bound && x <= bound; }));
    CHECK(*lo < *hi);  // not all equal
    // Spread over the interval: for a uniform draw of >= 4 values this is near certain, and
    // a wrong bound (e.g. 1/fan_in) would fail it.
    CHECK(*hi - *lo > 0.5 * bound);
  }
}

TEST_CASE("the seed determines the parameters") {
  const MlpOptions options{
      .in_features = 6, .out_features = 2, .hidden = 8, .layers = 2, .seed = 11};
  const Mlp a(options), b(options);
  MlpOptions other = options;
  other.seed = 12;
  const Mlp c(other);
  const auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    CHECK(pa[i].tensor.to_vector() == pb[i].tensor.to_vector());
    CHECK(pa[i].tensor.to_vector() != pc[i].tensor.to_vector());
    CHECK_FALSE(pa[i].tensor.storage() == pb[i].tensor.storage());
  }
}

TEST_CASE("Mlp forward equals a hand-computed forward") {
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    CAPTURE(static_cast<int>(act));
    Mlp model({.in_features = 3,
               .out_features = 2,
               .hidden = 4,
               .layers = 2,
               .activation = act,
               .seed = 21});
    const std::vector<float> x{0.5f, -1.0f, 2.0f, -0.25f, 0.75f, 1.5f};
    const Tensor y = model(Tensor::from_vector(x, {2, 3}));
    REQUIRE(y.shape() == Shape{2, 2});

    const auto params = model.named_parameters();
    std::vector<double> h(x.begin(), x.end());
    std::size_t width = 3;
    for (std::size_t l = 0; l < 3; ++l) {
      const std::vector<float> w = params[2 * l].tensor.to_vector();
      const std::vector<float> b = params[2 * l + 1].tensor.to_vector();
      const std::size_t out = static_cast<std::size_t>(params[2 * l].tensor.size(0));
      std::vector<double> next(2 * out);
      for (std::size_t i = 0; i < 2; ++i) {
        for (std::size_t j = 0; j < out; ++j) {
          double z = b[j];
          for (std::size_t k = 0; k < width; ++k) z += h[i * width + k] * w[j * width + k];
          if (l < 2) {
            z = act == Activation::kRelu
                    ? std::max(z, 0.0)
                    : 0.5 * z * (1.0 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
          }
          next[i * out + j] = z;
        }
      }
      h = next;
      width = out;
    }
    const std::vector<float> got = y.to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == doctest::Approx(h[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("FlatParameters lays parameters out in reverse registration order") {
  Mlp model({.in_features = 5, .out_features = 3, .hidden = 4, .layers = 2, .seed = 2});
  const auto named = model.named_parameters();
  std::vector<std::vector<float>> before;
  for (const auto& p : named) before.push_back(p.tensor.to_vector());

  const FlatParameters flat(model, Device::cpu());
  const std::vector<std::string> expected_order{"layers.4.bias", "layers.4.weight",
                                                "layers.2.bias", "layers.2.weight",
                                                "layers.0.bias", "layers.0.weight"};
  REQUIRE(flat.slots().size() == expected_order.size());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < flat.slots().size(); ++i) {
    const ParameterSlot& slot = flat.slots()[i];
    CAPTURE(slot.name);
    CHECK(slot.name == expected_order[i]);
    CHECK(slot.offset == offset);
    CHECK(slot.numel == slot.param.numel());
    offset += slot.numel;
  }
  CHECK(flat.numel() == offset);
  CHECK(flat.numel() == 4 * 5 + 4 + 4 * 4 + 4 + 3 * 4 + 3);
  CHECK(flat.grads().numel() == flat.numel());
  CHECK(flat.device() == Device::cpu());

  // Every parameter (through the module's own handles) is now a view into values(), with its
  // value kept.
  const auto named_after = model.named_parameters();
  for (std::size_t i = 0; i < named_after.size(); ++i) {
    const Tensor& p = named_after[i].tensor;
    CAPTURE(named_after[i].name);
    CHECK(p.storage() == flat.values().storage());
    CHECK(p.to_vector() == before[i]);
    const auto slot = std::find_if(flat.slots().begin(), flat.slots().end(),
                                   [&](const ParameterSlot& s) { return s.name == named[i].name; });
    REQUIRE(slot != flat.slots().end());
    CHECK(p.storage_offset() == flat.values().storage_offset() + slot->offset);
    CHECK(slot->param.is_same(named[i].tensor));
  }
  CHECK(linear_at(model, 0)->weight().storage() == flat.values().storage());
}

TEST_CASE("writing FlatParameters::values() changes the module's parameters and forward") {
  Mlp model({.in_features = 2, .out_features = 2, .hidden = 3, .layers = 1, .seed = 4});
  FlatParameters flat(model, Device::cpu());
  const ParameterSlot& last_bias = flat.slots()[0];
  REQUIRE(last_bias.name == "layers.2.bias");

  flat.values().data()[last_bias.offset + 1] = 123.0f;
  CHECK(linear_at(model, 2)->bias().to_vector()[1] == 123.0f);
  CHECK(model.named_parameters()[3].tensor.to_vector()[1] == 123.0f);

  // With every value zero but the last bias, the output is that bias on every row.
  Tensor(flat.values()).fill(0.0f);
  const std::vector<float> bias{1.5f, -2.5f};
  std::copy(bias.begin(), bias.end(), flat.values().data() + last_bias.offset);
  const Tensor y = model(Tensor::ones({3, 2}));
  CHECK(y.to_vector() == std::vector<float>{1.5f, -2.5f, 1.5f, -2.5f, 1.5f, -2.5f});
}

TEST_CASE("after backward the gradients are in FlatParameters::grads()") {
  Mlp model({.in_features = 3, .out_features = 2, .hidden = 4, .layers = 1, .seed = 5});
  FlatParameters flat(model, Device::cpu());
  // Before any backward the flat gradients are zero and valid.
  CHECK(flat.grads().to_vector() ==
        std::vector<float>(static_cast<std::size_t>(flat.numel()), 0.0f));

  const Tensor x = Tensor::normal({4, 3}, 0.0f, 1.0f, {.seed = 3, .stream = 0});
  const Tensor t = Tensor::normal({4, 2}, 0.0f, 1.0f, {.seed = 3, .stream = 1});
  flat.zero_grad();
  mse_loss(model(x), t).backward();

  // The same backward without flat buffers gives the reference gradients.
  Mlp reference({.in_features = 3, .out_features = 2, .hidden = 4, .layers = 1, .seed = 5});
  mse_loss(reference(x), t).backward();
  const auto ref_params = reference.named_parameters();

  const std::vector<float> all = flat.grads().to_vector();
  bool any_nonzero = false;
  for (const ParameterSlot& slot : flat.slots()) {
    CAPTURE(slot.name);
    const Tensor g = slot.param.grad();
    REQUIRE(g.defined());
    CHECK(g.storage() == flat.grads().storage());
    CHECK(g.storage_offset() == flat.grads().storage_offset() + slot.offset);
    const std::vector<float> in_flat(all.begin() + slot.offset,
                                     all.begin() + slot.offset + slot.numel);
    CHECK(in_flat == g.to_vector());
    const auto ref = std::find_if(ref_params.begin(), ref_params.end(),
                                  [&](const NamedTensor& p) { return p.name == slot.name; });
    REQUIRE(ref != ref_params.end());
    CHECK(in_flat == ref->tensor.grad().to_vector());
    for (float v : in_flat) any_nonzero = any_nonzero || v != 0.0f;
  }
  CHECK(any_nonzero);
}

TEST_CASE("a module used twice is one parameter set: listed once, one slot, both uses' gradient") {
  // Sequential{lin, relu, lin}: PyTorch lists lin's weight and bias once ("0.weight",
  // "0.bias"); two listings would give two flat slots, one of them dead, and two hooks.
  auto build = [](Generator& g) {
    auto lin = std::make_shared<Linear>(3, 3, g);
    auto seq = std::make_shared<Sequential>();
    seq->push_back(lin);
    seq->push_back(std::make_shared<ReLU>());
    seq->push_back(lin);
    return seq;
  };
  Generator g1(9), g2(9);
  auto shared = build(g1);
  const auto params = shared->named_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].name == "0.weight");
  CHECK(params[1].name == "0.bias");

  FlatParameters flat(*shared, Device::cpu());
  CHECK(flat.numel() == 3 * 3 + 3);
  const Tensor x = Tensor::normal({5, 3}, 0.0f, 1.0f, {.seed = 4, .stream = 0});
  flat.zero_grad();
  sum((*shared)(x)).backward();
  // Without the flat buffer, the same module's gradient: the sum over both uses.
  auto reference = build(g2);
  sum((*reference)(x)).backward();
  const auto ref = reference->named_parameters();
  REQUIRE(ref.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(params[i].name);
    CHECK(params[i].tensor.grad().to_vector() == ref[i].tensor.grad().to_vector());
  }
}

TEST_CASE("zero_missing_grads zero-fills only the gradients no backward wrote, and gives none") {
  Generator gen(8);
  testing::HalfUsed model(gen, 3, 2);
  FlatParameters flat(model, Device::cpu());
  REQUIRE(flat.slots().size() == 4);
  CHECK(flat.slots()[0].name == "second.bias");
  CHECK(flat.slots()[3].name == "first.weight");

  const Tensor x = Tensor::normal({5, 3}, 0.0f, 1.0f, {.seed = 4, .stream = 0});
  const Tensor t = Tensor::normal({5, 2}, 0.0f, 1.0f, {.seed = 4, .stream = 1});
  flat.zero_grad();
  Tensor(flat.grads()).fill(7.0f);  // stale garbage from "a previous step"
  mse_loss(model(x), t).backward();

  std::vector<std::vector<float>> written;
  for (const ParameterSlot& slot : flat.slots()) {
    const bool used = slot.name.starts_with("first.");
    CAPTURE(slot.name);
    CHECK(slot.param.has_grad() == used);
    written.push_back(flat.grads().view(slot.offset, slot.param.shape()).to_vector());
  }
  // Backward overwrote the used ones (no 7s left), and left the unused ones alone.
  for (float v : written[2]) CHECK(v != 7.0f);
  for (float v : written[0]) CHECK(v == 7.0f);

  flat.zero_missing_grads();
  for (std::size_t i = 0; i < flat.slots().size(); ++i) {
    const ParameterSlot& slot = flat.slots()[i];
    CAPTURE(slot.name);
    const std::vector<float> now = flat.grads().view(slot.offset, slot.param.shape()).to_vector();
    if (slot.name.starts_with("second.")) {
      // Zeros in the buffer, but still no gradient: the optimizers skip the parameter.
      CHECK(now == std::vector<float>(static_cast<std::size_t>(slot.numel), 0.0f));
      CHECK_FALSE(slot.param.has_grad());
    } else {
      CHECK(slot.param.has_grad());
      CHECK(now == written[i]);
    }
  }
}

TEST_CASE(
    "module hooks: pre-hooks and hooks run around a call, children's inside, not on forward()") {
  Generator g(3);
  auto first = std::make_shared<Linear>(4, 3, g);
  auto second = std::make_shared<Linear>(3, 2, g);
  Sequential model;
  model.push_back(first);
  model.push_back(second);
  std::vector<std::string> log;
  const std::uint64_t a =
      model.register_forward_pre_hook([&](Module&) { log.push_back("model>"); });
  model.register_forward_hook([&](Module&) { log.push_back("model<"); });
  const std::uint64_t b = first->register_forward_pre_hook([&](Module& m) {
    CHECK(&m == first.get());
    log.push_back("first>");
  });
  second->register_forward_hook([&](Module&) { log.push_back("second<"); });
  const Tensor x = Tensor::ones({2, 4});
  (void)model(x);
  CHECK(log == std::vector<std::string>{"model>", "first>", "second<", "model<"});
  // forward() itself runs no hooks of its own module; its children are still called through
  // operator().
  log.clear();
  (void)model.forward(x);
  CHECK(log == std::vector<std::string>{"first>", "second<"});
  model.remove_forward_hook(a);
  first->remove_forward_hook(b);
  log.clear();
  (void)model(x);
  CHECK(log == std::vector<std::string>{"second<", "model<"});
  // A forward that throws runs no forward hook after it.
  log.clear();
  CHECK_THROWS_AS((void)model(Tensor::ones({2, 5})), Error);
  CHECK(log.empty());
}

}  // namespace nanoddp::nn
