// Optimizers over FlatParameters against PyTorch's update rules restated in double, option
// validation, and an end-to-end training run that must actually learn.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/optimizer_in_backward.h"
#include "nn/half_used.h"

namespace nanoddp::nn {
namespace {

using Vec = std::vector<double>;

std::vector<float> test_values(std::size_t n, std::uint64_t seed, double lo = -1.0,
                               double hi = 1.0) {
  std::vector<float> out(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 7;
  for (float& v : out) {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v = static_cast<float>(lo + (hi - lo) * static_cast<double>(z >> 11) / 9007199254740992.0);
  }
  return out;
}

// A small model whose flat buffers the tests fill by hand: Linear(3, 2) = 8 parameters.
struct Fixture {
  Mlp model{MlpOptions{.in_features = 3, .out_features = 2, .hidden = 4, .layers = 0}};
  FlatParameters flat{model, Device::cpu()};
  std::size_t n = static_cast<std::size_t>(flat.numel());

  Vec set_initial_values() {
    const std::vector<float> v = test_values(n, 1, -2.0, 2.0);
    std::copy(v.begin(), v.end(), flat.values().data());
    return Vec(v.begin(), v.end());
  }
  // Writes the step's gradient into the flat gradient buffer (as a backward would), or, with
  // `none`, marks the gradients stale as if no backward had run: no parameter has a gradient,
  // and the optimizer must not touch any (PyTorch skips a parameter whose .grad is None).
  Vec set_grads(int step, bool none = false) {
    if (none) {
      flat.zero_grad();
      Tensor(flat.grads()).fill(99.0f);  // garbage the optimizer must not read
      return Vec(n, 0.0);
    }
    const std::vector<float> g = test_values(n, 100 + static_cast<std::uint64_t>(step));
    for (const ParameterSlot& slot : flat.slots()) {
      Tensor(slot.param).set_grad(flat.grads().view(slot.offset, slot.param.shape()));
    }
    std::copy(g.begin(), g.end(), flat.grads().data());
    return Vec(g.begin(), g.end());
  }
};

void check_close(const std::vector<float>& got, const Vec& want, const std::string& what,
                 double rtol = 1e-5, double atol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(what);
    CAPTURE(i);
    CHECK(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

// torch.optim.SGD, one parameter element at a time.
struct SgdReference {
  SgdOptions o;
  Vec buf;
  int steps = 0;
  void step(Vec& p, const Vec& grad) {
    if (buf.empty()) buf.assign(p.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = grad[i];
      if (o.weight_decay != 0.0f) d += static_cast<double>(o.weight_decay) * p[i];
      if (o.momentum != 0.0f) {
        if (steps == 0) {
          buf[i] = d;
        } else {
          buf[i] = o.momentum * buf[i] + (1.0 - static_cast<double>(o.dampening)) * d;
        }
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= static_cast<double>(o.lr) * d;
    }
    ++steps;
  }
};

// torch.optim.AdamW.
struct AdamWReference {
  AdamWOptions o;
  Vec m, v;
  int t = 0;
  void step(Vec& p, const Vec& grad) {
    if (m.empty()) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
    }
    ++t;
    const double lr = o.lr, b1 = o.beta1, b2 = o.beta2, eps = o.eps, wd = o.weight_decay;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1.0 - b1) * grad[i];
      v[i] = b2 * v[i] + (1.0 - b2) * grad[i] * grad[i];
      const double m_hat = m[i] / (1.0 - std::pow(b1, t));
      const double v_hat = v[i] / (1.0 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

const Tensor* find_state(const std::vector<NamedTensor>& state, const std::string& name) {
  for (const NamedTensor& s : state) {
    if (s.name == name) return &s.tensor;
  }
  return nullptr;
}
// The result points into `state`: a temporary (optimizer.state() is by value) would dangle.
const Tensor* find_state(std::vector<NamedTensor>&& state, const std::string& name) = delete;

}  // namespace

TEST_CASE("SGD matches torch.optim.SGD over several steps") {
  struct Case {
    const char* name;
    SgdOptions options;
  };
  const std::vector<Case> cases{
      {"plain", {.lr = 0.1f}},
      {"momentum", {.lr = 0.05f, .momentum = 0.9f}},
      {"momentum + dampening", {.lr = 0.05f, .momentum = 0.8f, .dampening = 0.3f}},
      {"nesterov", {.lr = 0.05f, .momentum = 0.9f, .nesterov = true}},
      {"weight decay", {.lr = 0.1f, .weight_decay = 0.05f}},
      {"everything", {.lr = 0.02f, .momentum = 0.7f, .weight_decay = 0.1f, .nesterov = true}},
      {"momentum + dampening + decay",
       {.lr = 0.03f, .momentum = 0.6f, .dampening = 0.5f, .weight_decay = 0.2f}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Fixture fx;
    Vec p = fx.set_initial_values();
    SGD sgd(fx.flat, c.options);
    SgdReference ref{.o = c.options};
    for (int step = 0; step < 6; ++step) {
      CAPTURE(step);
      const bool none = step == 3;
      const Vec g = fx.set_grads(step, none);
      sgd.step();
      if (!none) ref.step(p, g);  // skipped: no weight decay, no momentum, no step counted
      check_close(fx.flat.values().to_vector(), p, "params");
      // The parameters seen through the module moved too.
      CHECK(fx.model.named_parameters()[0].tensor.to_vector()[0] ==
            fx.flat.values().to_vector()[fx.flat.slots()[1].offset]);
    }
    CHECK(sgd.steps() == 6);
    const auto state = sgd.state();
    const Tensor* buf = find_state(state, "momentum_buffer");
    CHECK((buf != nullptr) == (c.options.momentum != 0.0f));
    if (buf != nullptr) check_close(buf->to_vector(), ref.buf, "momentum_buffer");
  }
}

TEST_CASE("AdamW matches torch.optim.AdamW over several steps") {
  struct Case {
    const char* name;
    AdamWOptions options;
  };
  const std::vector<Case> cases{
      {"defaults", {}},
      {"larger lr and decay", {.lr = 0.05f, .weight_decay = 0.1f}},
      {"no decay, other betas, big eps",
       {.lr = 0.01f, .beta1 = 0.5f, .beta2 = 0.8f, .eps = 1e-2f, .weight_decay = 0.0f}},
      {"beta1 = 0", {.lr = 0.02f, .beta1 = 0.0f, .beta2 = 0.99f}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Fixture fx;
    Vec p = fx.set_initial_values();
    AdamW adamw(fx.flat, c.options);
    AdamWReference ref{.o = c.options};
    for (int step = 0; step < 6; ++step) {
      CAPTURE(step);
      const bool none = step == 4;
      const Vec g = fx.set_grads(step, none);
      adamw.step();
      if (!none) ref.step(p, g);  // skipped: the bias correction's step count stays
      check_close(fx.flat.values().to_vector(), p, "params");
    }
    CHECK(adamw.steps() == 6);
    const auto state = adamw.state();
    const Tensor* m = find_state(state, "exp_avg");
    const Tensor* v = find_state(state, "exp_avg_sq");
    REQUIRE(m != nullptr);
    REQUIRE(v != nullptr);
    check_close(m->to_vector(), ref.m, "exp_avg");
    check_close(v->to_vector(), ref.v, "exp_avg_sq");
  }
}

TEST_CASE("a parameter that got no gradient is not touched: no weight decay, momentum or moments") {
  // HalfUsed's second layer is not in the graph. PyTorch's optimizers skip a parameter whose
  // .grad is None; nanoddp's skip one without a gradient since zero_grad(), in step() and in
  // backward alike.
  for (const bool adam : {false, true}) {
    for (const bool in_backward : {false, true}) {
      CAPTURE(adam);
      CAPTURE(in_backward);
      Generator gen(3);
      testing::HalfUsed model(gen, 3, 2);
      FlatParameters flat(model, Device::cpu());
      std::unique_ptr<Optimizer> optimizer;
      if (adam) {
        optimizer = std::make_unique<AdamW>(flat, AdamWOptions{.lr = 0.05f, .weight_decay = 0.1f});
      } else {
        optimizer = std::make_unique<SGD>(
            flat, SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.1f});
      }
      OptimizerInBackward fused(*optimizer, flat, {});
      const std::vector<float> before = flat.values().to_vector();
      for (int step = 0; step < 3; ++step) {
        optimizer->zero_grad();
        if (in_backward) fused.arm();
        const Tensor x = Tensor::normal({5, 3}, 0.0f, 1.0f, {.seed = 4, .stream = 0});
        const Tensor t = Tensor::normal({5, 2}, 0.0f, 1.0f, {.seed = 4, .stream = 1});
        mse_loss(model(x), t).backward();
        if (in_backward) {
          CHECK(fused.finish() == 0);
        } else {
          optimizer->step();
        }
      }
      const std::vector<float> after = flat.values().to_vector();
      for (std::size_t i = 0; i < flat.slots().size(); ++i) {
        const ParameterSlot& slot = flat.slots()[i];
        CAPTURE(slot.name);
        const auto begin = static_cast<std::ptrdiff_t>(slot.offset);
        const auto end = begin + static_cast<std::ptrdiff_t>(slot.numel);
        const bool same =
            std::equal(before.begin() + begin, before.begin() + end, after.begin() + begin);
        const bool used = slot.name.starts_with("first.");
        CHECK(same == !used);
        CHECK(optimizer->param_steps()[i] == (used ? 3 : 0));
        for (const NamedTensor& state : optimizer->state()) {
          CAPTURE(state.name);
          const std::vector<float> s = state.tensor.to_vector();
          const bool zero =
              std::all_of(s.begin() + begin, s.begin() + end, [](float v) { return v == 0.0f; });
          CHECK(zero == !used);
        }
      }
      CHECK(optimizer->steps() == 3);
    }
  }
}

TEST_CASE("invalid optimizer options are Errors") {
  Fixture fx;
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = 0.0f}), Error);
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = -0.1f}), Error);
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = std::nanf("")}), Error);
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = 0.1f, .momentum = -0.5f}), Error);
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = 0.1f, .weight_decay = -1.0f}), Error);
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = 0.1f, .nesterov = true}), Error);
  CHECK_THROWS_AS(SGD(fx.flat, {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}),
                  Error);
  CHECK_NOTHROW(SGD(fx.flat, {.lr = 0.1f, .momentum = 0.9f, .nesterov = true}));

  CHECK_THROWS_AS(AdamW(fx.flat, {.lr = 0.0f}), Error);
  CHECK_THROWS_AS(AdamW(fx.flat, {.lr = -1e-3f}), Error);
  CHECK_THROWS_AS(AdamW(fx.flat, {.beta1 = 1.0f}), Error);
  CHECK_THROWS_AS(AdamW(fx.flat, {.beta1 = -0.1f}), Error);
  CHECK_THROWS_AS(AdamW(fx.flat, {.beta2 = 1.0f}), Error);
  CHECK_THROWS_AS(AdamW(fx.flat, {.beta2 = 1.5f}), Error);
  CHECK_THROWS_AS(AdamW(fx.flat, {.weight_decay = -0.01f}), Error);
  CHECK_NOTHROW(AdamW(fx.flat, {}));
}

TEST_CASE("an MLP learns a synthetic regression: the loss falls 100x") {
  // Targets from a fixed random linear map of normal inputs: exactly learnable.
  constexpr std::int64_t batch = 256, in = 8, out = 4;
  const Tensor x = Tensor::normal({batch, in}, 0.0f, 1.0f, {.seed = 77, .stream = 0});
  const Tensor map = Tensor::normal({in, out}, 0.0f, 1.0f, {.seed = 77, .stream = 1});
  Tensor y;
  {
    NoGrad no_grad;
    y = matmul(x, map);
  }
  for (bool use_adamw : {true, false}) {
    CAPTURE(use_adamw);
    Mlp model({.in_features = in, .out_features = out, .hidden = 32, .layers = 2, .seed = 1});
    FlatParameters flat(model, Device::cpu());
    std::unique_ptr<Optimizer> opt;
    if (use_adamw) {
      opt = std::make_unique<AdamW>(flat, AdamWOptions{.lr = 1e-2f, .weight_decay = 0.0f});
    } else {
      opt = std::make_unique<SGD>(flat, SgdOptions{.lr = 0.05f, .momentum = 0.9f});
    }
    const auto start = std::chrono::steady_clock::now();
    float initial = 0.0f, last = 0.0f;
    int steps = 0;
    for (; steps < 500; ++steps) {
      Tensor loss = mse_loss(model(x), y);
      last = loss.item();
      REQUIRE(std::isfinite(last));
      if (steps == 0) initial = last;
      if (last < initial / 100.0f) break;  // typically ~50 steps
      loss.backward();
      opt->step();
      opt->zero_grad();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MESSAGE("optimizer ", opt->describe(), ": loss ", initial, " -> ", last, " in ", steps,
            " steps, ", seconds, " s");
    CHECK(initial > 0.5f);  // the task is not trivially solved at initialisation
    CHECK(last < initial / 100.0f);
    CHECK(steps < 500);
  }
}

}  // namespace nanoddp::nn

namespace nanoddp::nn {
namespace {

TEST_CASE("a sharded optimizer updates its ranges only, as the whole one does, with sliced state") {
  // ZeRO (comm/zero.h): state for ranges [1, 4) and [6, 8) of Linear(3, 2)'s 8 elements, held
  // shard-locally at 2 and 0; with `grads` the gradients come from a shard buffer too.
  for (const bool adam : {false, true}) {
    for (const bool shard_grads : {false, true}) {
      CAPTURE(adam);
      CAPTURE(shard_grads);
      Mlp whole_model{MlpOptions{.in_features = 3, .out_features = 2, .hidden = 4, .layers = 0}};
      Mlp part_model{MlpOptions{.in_features = 3, .out_features = 2, .hidden = 4, .layers = 0}};
      FlatParameters whole(whole_model, Device::cpu()), part(part_model, Device::cpu());
      const auto make = [&](FlatParameters& flat) -> std::unique_ptr<Optimizer> {
        if (adam) return std::make_unique<AdamW>(flat, AdamWOptions{.lr = 0.05f});
        return std::make_unique<SGD>(flat, SgdOptions{.lr = 0.05f, .momentum = 0.9f});
      };
      auto reference = make(whole), sharded = make(part);
      const std::vector<ShardRange> ranges = {{.offset = 1, .numel = 3, .local = 2},
                                              {.offset = 6, .numel = 2, .local = 0}};
      Tensor grads = Tensor::zeros({5}, Device::cpu());
      sharded->shard({.ranges = ranges, .numel = 5, .grads = shard_grads ? grads : Tensor()});
      CHECK(sharded->sharded());
      CHECK(sharded->state_bytes() == (adam ? 2 : 1) * 5 * 4);
      const std::vector<float> before = part.values().to_vector();
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> g = test_values(8, static_cast<std::uint64_t>(step) + 5);
        for (FlatParameters* flat : {&whole, &part}) {
          flat->zero_grad();
          std::copy(g.begin(), g.end(), flat->grads().data());
          for (const ParameterSlot& slot : flat->slots()) {
            Tensor param = slot.param;
            param.set_grad(flat->grads().view(slot.offset, slot.param.shape()));
          }
        }
        if (shard_grads) {
          Tensor(part.grads()).fill(99.0f);  // must not be read: the shard buffer is
          for (const ShardRange& r : ranges) {
            std::copy(g.begin() + r.offset, g.begin() + r.offset + r.numel, grads.data() + r.local);
          }
        }
        reference->step();
        CHECK_THROWS_WITH_AS(sharded->step(), doctest::Contains("zero()->step()"), Error);
        sharded->step_shard();
      }
      const std::vector<float> want = whole.values().to_vector(), got = part.values().to_vector();
      for (std::size_t i = 0; i < 8; ++i) {
        CAPTURE(i);
        const bool owned = (i >= 1 && i < 4) || i >= 6;
        CHECK(got[i] == (owned ? want[i] : before[i]));
      }
      for (std::size_t s = 0; s < sharded->state().size(); ++s) {
        const std::vector<float> full = reference->state()[s].tensor.to_vector();
        const std::vector<float> local = sharded->state()[s].tensor.to_vector();
        for (const ShardRange& r : ranges) {
          for (std::int64_t k = 0; k < r.numel; ++k) {
            CHECK(local[static_cast<std::size_t>(r.local + k)] ==
                  full[static_cast<std::size_t>(r.offset + k)]);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace nanoddp::nn

namespace nanoddp::nn {

// An outside tester's: a second FlatParameters over the same model took its parameters, and the
// optimizer built over the first went on updating a copy nobody read: the loss never moved.
TEST_CASE("an optimizer whose FlatParameters lost its parameters to another is refused") {
  Mlp model({.in_features = 3, .out_features = 2, .hidden = 4, .layers = 2});
  FlatParameters first(model, Device::cpu());
  SGD stale(first, {.lr = 0.1f});
  FlatParameters second(model, Device::cpu());
  SGD current(second, {.lr = 0.1f});
  mse_loss(model.forward(Tensor::ones({2, 3})), Tensor::zeros({2, 2})).backward();
  try {
    stale.step();
    FAIL("the stale optimizer stepped");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("was built over a FlatParameters whose parameters have "
                                     "moved since") != std::string::npos);
  }
  const std::vector<float> before = second.values().to_vector();
  current.step();
  CHECK(second.values().to_vector() != before);
}

}  // namespace nanoddp::nn
