// The Reducer in one process (a real Gloo group of one): bucket layout, gradient views, and
// recovery from a backward pass that failed half-way.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"

using namespace nanoddp;

namespace {

comm::Distributed world_of_one() {
  return comm::init_distributed(comm::WorldInfo{}, {.backend = "gloo", .device = Device::cpu()});
}

// A DDP-wrapped Mlp beside an unwrapped twin of the same shape (so the same initial values) and
// one batch: in a world of one, DDP must leave exactly the twin's gradients. Small caps: several
// buckets. Members are built in this order; ddp keeps references to model and params.
struct DdpAndPlainTwin {
  static constexpr nn::MlpOptions kShape{
      .in_features = 8, .out_features = 3, .hidden = 16, .layers = 2};

  comm::Distributed dist = world_of_one();
  nn::Mlp model{kShape};
  nn::Mlp reference{kShape};
  nn::FlatParameters params{model, Device::cpu()};
  nn::FlatParameters ref_params{reference, Device::cpu()};
  comm::DistributedDataParallel ddp{
      model,
      params,
      dist.group,
      dist.store,
      {.reducer = {.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001}}};
  const Tensor x = Tensor::normal({5, 8}, 0, 1, {.seed = 1});
  const Tensor y = Tensor::normal({5, 3}, 0, 1, {.seed = 2});
};

// An Mlp whose forward can put a node that throws in backward between the first layer's output
// and the rest: the backward fails after the last layers' gradients were delivered.
class PoisonableMlp : public nn::Module {
 public:
  explicit PoisonableMlp(const nn::MlpOptions& options)
      : mlp_(register_module("mlp", std::make_shared<nn::Mlp>(options))) {}
  Tensor forward(const Tensor& x) override {
    if (!poison) return mlp_->forward(x);
    const auto& layers = mlp_->children().front().second->children();
    Tensor h = layers[0].second->forward(x);
    h = record("explodes", h.detach(), {h},
               [](const Tensor&, GradSink&) { throw Error("backward failed on purpose"); });
    for (std::size_t i = 1; i < layers.size(); ++i) h = layers[i].second->forward(h);
    return h;
  }
  std::string describe() const override { return "PoisonableMlp"; }
  bool poison = false;

 private:
  std::shared_ptr<nn::Mlp> mlp_;
};

}  // namespace

TEST_CASE("reducer: buckets follow reverse registration order, first one small, no split") {
  comm::Distributed dist = world_of_one();
  // Linear(64,64) weights are 4096 floats = 16 KiB, biases 256 B.
  nn::Mlp model({.in_features = 64, .out_features = 64, .hidden = 64, .layers = 3});
  nn::FlatParameters params(model, Device::cpu());
  comm::DistributedDataParallel ddp(
      model, params, dist.group, dist.store,
      {.reducer = {.bucket_cap_mb = 32.0 / 1024, .first_bucket_mb = 8.0 / 1024}});
  const auto& buckets = ddp.reducer().buckets();
  const auto& slots = params.slots();
  // First bucket: capped at 8 KiB -> closes after the last layer's bias + weight (16.25 KiB).
  // Then 32 KiB caps: two layers (32.5 KiB) per bucket.
  REQUIRE(buckets.size() == 3);
  CHECK(slots[buckets[0].slots.front()].name == "layers.6.bias");
  CHECK(slots[buckets[0].slots.back()].name == "layers.6.weight");
  CHECK(buckets[0].slots.size() == 2);
  CHECK(buckets[1].slots.size() == 4);
  CHECK(buckets[2].slots.size() == 2);
  CHECK(slots[buckets[2].slots.back()].name == "layers.0.weight");
  // Contiguous, covering the whole gradient buffer, gradients are views into their bucket.
  std::int64_t offset = 0;
  for (const comm::Bucket& b : buckets) {
    CHECK(b.offset == offset);
    CHECK(b.grads.storage() == params.grads().storage());
    CHECK(b.grads.storage_offset() == params.grads().storage_offset() + b.offset);
    for (std::size_t slot : b.slots) {
      CHECK(slots[slot].offset >= b.offset);
      CHECK(slots[slot].offset + slots[slot].numel <= b.offset + b.numel);
    }
    offset += b.numel;
  }
  CHECK(offset == params.numel());
  CHECK(ddp.reducer().describe_buckets().find("bucket 0:") != std::string::npos);
}

TEST_CASE_FIXTURE(DdpAndPlainTwin,
                  "reducer: a world of one leaves exactly the plain backward's gradients") {
  for (int step = 0; step < 3; ++step) {
    params.zero_grad();
    ref_params.zero_grad();
    mse_loss(ddp(x), y).backward();
    mse_loss(reference(x), y).backward();
    CHECK(params.grads().to_vector() == ref_params.grads().to_vector());
  }
  const comm::ReducerStats& stats = ddp.reducer().last_stats();
  CHECK(stats.buckets.size() == ddp.reducer().buckets().size());
  for (const auto& b : stats.buckets) CHECK(b.end_ms >= b.start_ms);
}

TEST_CASE_FIXTURE(DdpAndPlainTwin, "reducer: a world of one issues no collective in a step") {
  // Its all-reduces would average one rank's gradients with nothing (issue #19: DDP over one
  // rank should cost what no DDP costs). The construction's broadcast and checks come before.
  const std::uint64_t before = dist.group->fingerprint().ops;
  for (int step = 0; step < 3; ++step) {
    params.zero_grad();
    mse_loss(ddp(x), y).backward();
  }
  CHECK(dist.group->fingerprint().ops == before);
  // The same with find_unused_parameters (its count of used parameters is a collective too) and
  // the bf16 hook (still rounds: the gradients a larger world would have reduced).
  ddp.reconfigure({.bucket_cap_mb = 0.0005,
                   .first_bucket_mb = 0.0001,
                   .find_unused_parameters = true,
                   .comm_hook = comm::CommHook::kBf16});
  const std::uint64_t after_reconfigure = dist.group->fingerprint().ops;
  params.zero_grad();
  ref_params.zero_grad();
  mse_loss(ddp(x), y).backward();
  mse_loss(reference(x), y).backward();
  CHECK(dist.group->fingerprint().ops == after_reconfigure);
  const std::vector<float> got = params.grads().to_vector(), plain = ref_params.grads().to_vector();
  bool rounded = false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(std::abs(got[i] - plain[i]) <= 1e-2f * std::abs(plain[i]) + 1e-6f);
    rounded |= got[i] != plain[i];
  }
  CHECK(rounded);
  // Asked to (the GPU tests, so that one GPU runs the communication stream): every bucket's
  // all-reduce and the used-parameter count are issued, and the gradients are still the plain
  // ones (an average over one rank).
  ddp.reconfigure({.bucket_cap_mb = 0.0005,
                   .first_bucket_mb = 0.0001,
                   .find_unused_parameters = true,
                   .collectives_in_world_of_one = true});
  const std::uint64_t before_forced = dist.group->fingerprint().ops;
  params.zero_grad();
  ref_params.zero_grad();
  mse_loss(ddp(x), y).backward();
  mse_loss(reference(x), y).backward();
  CHECK(dist.group->fingerprint().ops >= before_forced + ddp.reducer().buckets().size() + 1);
  CHECK(params.grads().to_vector() == ref_params.grads().to_vector());
}

TEST_CASE("reducer: after a backward pass that threw half-way, the next one works") {
  comm::Distributed dist = world_of_one();
  PoisonableMlp model({.in_features = 4, .out_features = 2, .hidden = 8, .layers = 2});
  nn::FlatParameters params(model, Device::cpu());
  comm::DistributedDataParallel ddp(
      model, params, dist.group, dist.store,
      {.reducer = {.bucket_cap_mb = 0.0001, .first_bucket_mb = 0.0001}});
  const Tensor x = Tensor::normal({3, 4}, 0, 1, {.seed = 1});
  const Tensor y = Tensor::zeros({3, 2});

  model.poison = true;
  params.zero_grad();
  CHECK_THROWS_WITH_AS(mse_loss(ddp(x), y).backward(), "backward failed on purpose", Error);
  CHECK_FALSE(ddp.reducer().expects_autograd_hooks());  // the failed pass consumed the forward

  // The Reducer saw some hooks of the dead pass; a fresh pass must reduce every bucket again.
  model.poison = false;
  params.zero_grad();
  CHECK_NOTHROW(mse_loss(ddp(x), y).backward());
  for (const auto& slot : params.slots()) CHECK(slot.param.has_grad());
}

TEST_CASE_FIXTURE(
    DdpAndPlainTwin,
    "reducer: the bucket-reduced hook runs once per bucket, in order, after the reduce") {
  const auto& buckets = ddp.reducer().buckets();
  REQUIRE(buckets.size() >= 3);
  std::vector<std::int64_t> seen;  // bucket offsets, in call order
  std::vector<float> grads_seen;   // what the hook found in the gradient buffer
  ddp.reducer().set_bucket_reduced_hook([&](const comm::Bucket& bucket) {
    seen.push_back(bucket.offset);
    const std::vector<float> g = bucket.grads.to_vector();
    grads_seen.insert(grads_seen.end(), g.begin(), g.end());
  });

  // no_sync passes reduce nothing, so they call nothing.
  params.zero_grad();
  {
    auto no_sync = ddp.no_sync();
    mse_loss(ddp(x), y).backward();
  }
  CHECK(seen.empty());

  // The synchronized pass calls it for bucket 0, 1, 2, ... with the final gradients in place.
  mse_loss(ddp(x), y).backward();
  ref_params.zero_grad();
  mse_loss(reference(x), y).backward();
  mse_loss(reference(x), y).backward();
  std::vector<std::int64_t> want;
  for (const comm::Bucket& b : buckets) want.push_back(b.offset);
  CHECK(seen == want);
  CHECK(grads_seen == ref_params.grads().to_vector());

  // A hook that throws fails the backward pass; the next pass runs normally.
  ddp.reducer().set_bucket_reduced_hook(
      [](const comm::Bucket&) { throw Error("hook failed on purpose"); });
  params.zero_grad();
  CHECK_THROWS_WITH_AS(mse_loss(ddp(x), y).backward(), "hook failed on purpose", Error);
  seen.clear();
  ddp.reducer().set_bucket_reduced_hook(
      [&](const comm::Bucket& bucket) { seen.push_back(bucket.offset); });
  params.zero_grad();
  CHECK_NOTHROW(mse_loss(ddp(x), y).backward());
  CHECK(seen == want);
}

TEST_CASE_FIXTURE(DdpAndPlainTwin,
                  "reducer: a backward that bypassed DDP's forward issues no collective") {
  const auto ops = [&] { return dist.group->fingerprint().ops; };
  params.zero_grad();
  const std::uint64_t before = ops();
  mse_loss(model(x), y).backward();  // the wrapped module called directly
  CHECK(ops() == before);
  ref_params.zero_grad();
  mse_loss(reference(x), y).backward();
  CHECK(params.grads().to_vector() == ref_params.grads().to_vector());

  // DDP's forward arms the next backward; a reconfigure in between keeps the arming.
  params.zero_grad();
  const Tensor out = ddp(x);
  CHECK(ddp.reducer().expects_autograd_hooks());
  ddp.reconfigure({.bucket_cap_mb = 100, .first_bucket_mb = 100});
  CHECK(ddp.reducer().expects_autograd_hooks());
  mse_loss(out, y).backward();
  // A world of one issues nothing even then (its average is its gradient); the 2-rank scenario
  // of test_ddp.cpp counts the all-reduce the armed backward issues.
  CHECK(ops() == before);
  CHECK(ddp.reducer().last_stats().buckets.size() == 1);  // but it was a reducing pass
  CHECK_FALSE(ddp.reducer().expects_autograd_hooks());    // consumed by that backward's finalize
}

TEST_CASE("reducer: a discarded DDP leaves no hook on the parameters") {
  comm::Distributed dist = world_of_one();
  nn::Mlp model({.in_features = 4, .out_features = 2, .hidden = 8, .layers = 1});
  nn::FlatParameters params(model, Device::cpu());
  for (int round = 0; round < 3; ++round) {
    comm::DistributedDataParallel ddp(model, params, dist.group, dist.store);
    for (const auto& slot : params.slots())
      CHECK(slot.param.post_accumulate_grad_hook_count() == 1);
  }
  for (const auto& slot : params.slots()) CHECK(slot.param.post_accumulate_grad_hook_count() == 0);
}

TEST_CASE("ddp: reconfigure between steps rebuilds the buckets and keeps the gradients right") {
  DdpAndPlainTwin t;
  const auto step_matches_twin = [&] {
    t.params.zero_grad();
    t.ref_params.zero_grad();
    mse_loss(t.ddp(t.x), t.y).backward();
    mse_loss(t.reference(t.x), t.y).backward();
    CHECK(t.params.grads().to_vector() == t.ref_params.grads().to_vector());
  };
  step_matches_twin();
  REQUIRE(t.ddp.reducer().buckets().size() > 1);
  int reduced = 0;
  t.ddp.reducer().set_bucket_reduced_hook([&](const comm::Bucket&) { ++reduced; });

  t.ddp.reconfigure({.bucket_cap_mb = 100, .first_bucket_mb = 100, .overlap = false});
  CHECK(t.ddp.reducer().buckets().size() == 1);  // every parameter in one bucket now
  CHECK(t.ddp.options().reducer.bucket_cap_mb == 100);
  CHECK_FALSE(t.ddp.reducer().options().overlap);
  for (const auto& slot : t.params.slots()) {
    CHECK(slot.param.post_accumulate_grad_hook_count() == 1);  // the old Reducer's are gone
  }
  step_matches_twin();
  CHECK(reduced == 1);  // the bucket-reduced hook carried over: one bucket, one call
  t.ddp.reconfigure({.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001});
  step_matches_twin();
}

// An outside tester's: DDP given another model's FlatParameters (or one whose parameters a
// second FlatParameters took since) reduced gradients nobody reads, and training silently
// changed nothing.
TEST_CASE("ddp: a FlatParameters of another model, or whose parameters moved, is refused") {
  comm::Distributed dist = world_of_one();
  nn::Mlp model({.in_features = 4, .out_features = 2, .hidden = 8, .layers = 2});
  nn::Mlp other({.in_features = 4, .out_features = 2, .hidden = 8, .layers = 2});
  nn::FlatParameters params(model, Device::cpu());
  nn::FlatParameters others(other, Device::cpu());
  try {
    comm::DistributedDataParallel ddp(model, others, dist.group, dist.store);
    FAIL("another model's parameters were taken");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("the FlatParameters given holds other parameters than the "
                                     "model's") != std::string::npos);
  }
  nn::FlatParameters again(model, Device::cpu());  // takes the parameters from `params`
  try {
    comm::DistributedDataParallel ddp(model, params, dist.group, dist.store);
    FAIL("a FlatParameters whose parameters moved was taken");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("whose parameters have moved since") != std::string::npos);
  }
  comm::DistributedDataParallel ddp(model, again, dist.group, dist.store);  // the current one
}
