// Bucket order from observation (ReducerOptions::rebuild_buckets): a model registered out of its
// backward order gets buckets cut in the order its gradients really became ready, and keeps the
// overlap an MLP has; packed buckets (slots not contiguous in the flat buffer) reduce exactly.

#include <doctest/doctest.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"

using namespace nanoddp;

namespace {

comm::Distributed world_of_one() {
  return comm::init_distributed(comm::WorldInfo{}, {.backend = "gloo", .device = Device::cpu()});
}

// Four Linear(16, 16) layers fc0 -> fc1 -> fc2 -> fc3 (backward finishes fc3 first, fc0 last),
// registered in the order `registration` names them. The layers draw their initial values in
// forward order, so every registration order starts from the same values.
class ShuffledMlp : public nn::Module {
 public:
  explicit ShuffledMlp(std::array<int, 4> registration) : generator_(7) {
    for (int i = 0; i < 4; ++i) layers_[i] = std::make_shared<nn::Linear>(16, 16, generator_);
    for (const int i : registration) register_module("fc" + std::to_string(i), layers_[i]);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (int i = 0; i < 4; ++i) h = (*layers_[i])(i < 3 ? relu(h) : h);
    return h;
  }
  std::string describe() const override { return "ShuffledMlp"; }

 private:
  Generator generator_;
  std::array<std::shared_ptr<nn::Linear>, 4> layers_;
};

struct Replica {
  Replica(comm::Distributed& dist, std::array<int, 4> registration,
          const comm::ReducerOptions& options)
      : model(registration),
        params(model, Device::cpu()),
        ddp(model, params, dist.group, dist.store, {.reducer = options}) {}
  ShuffledMlp model;
  nn::FlatParameters params;
  comm::DistributedDataParallel ddp;

  std::vector<float> step(const Tensor& x, const Tensor& y) {
    params.zero_grad();
    mse_loss(ddp(x), y).backward();
    return params.grads().to_vector();
  }
  std::string first_bucket() {
    std::string names;
    for (std::size_t slot : ddp.reducer().buckets().front().slots) {
      names += params.slots()[slot].name + " ";
    }
    return names;
  }
};

const Tensor kX = Tensor::normal({8, 16}, 0, 1, {.seed = 3});
const Tensor kY = Tensor::normal({8, 16}, 0, 1, {.seed = 4});

}  // namespace

TEST_CASE("reducer: rebuilt in the observed order, a model registered out of order overlaps") {
  comm::Distributed dist = world_of_one();
  // Registered fc1, fc2, fc3, fc0: the layout (reverse registration) starts with fc0, whose
  // gradient is the last to be ready. Every layer a bucket of its own.
  const std::array<int, 4> registration{1, 2, 3, 0};
  const comm::ReducerOptions tiny{.bucket_cap_mb = 0.0001, .first_bucket_mb = 0.0001};
  comm::ReducerOptions fixed = tiny;
  fixed.rebuild_buckets = false;
  Replica rebuilt(dist, registration, tiny);
  Replica layout(dist, registration, fixed);
  REQUIRE(rebuilt.ddp.reducer().buckets().size() == 4);
  CHECK(rebuilt.first_bucket() == "fc0.bias fc0.weight ");

  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    // The same values, bit for bit, whatever the buckets.
    CHECK(rebuilt.step(kX, kY) == layout.step(kX, kY));
    const comm::ReducerStats& with = rebuilt.ddp.reducer().last_stats();
    const comm::ReducerStats& without = layout.ddp.reducer().last_stats();
    // Without the rebuild, bucket 0 holds the last gradient: nothing launches before backward's
    // end (in-order launch holds every other bucket back).
    CHECK(without.buckets[0].launch_ms >= without.backward_end_ms);
    if (step == 1) {
      // The first step observes (and is cut like the layout).
      CHECK(with.buckets[0].launch_ms >= with.backward_end_ms);
    } else {
      // Rebuilt: bucket 0 is fc3, launched while fc2..fc0's backward still has to run.
      CHECK(with.buckets[0].launch_ms < with.backward_end_ms);
      CHECK_FALSE(with.buckets[0].launched_after_backward);
    }
  }
  CHECK(rebuilt.ddp.reducer().buckets_rebuilt());
  CHECK(rebuilt.first_bucket() == "fc3.bias fc3.weight ");
  CHECK_FALSE(layout.ddp.reducer().buckets_rebuilt());
  CHECK(layout.first_bucket() == "fc0.bias fc0.weight ");
  for (const comm::Bucket& bucket : rebuilt.ddp.reducer().buckets()) CHECK_FALSE(bucket.packed);
}

TEST_CASE("reducer: an MLP's observed order is its layout: the rebuild changes nothing") {
  comm::Distributed dist = world_of_one();
  nn::Mlp model({.in_features = 8, .out_features = 3, .hidden = 16, .layers = 3});
  nn::FlatParameters params(model, Device::cpu());
  comm::DistributedDataParallel ddp(
      model, params, dist.group, dist.store,
      {.reducer = {.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001}});
  const std::string before = ddp.reducer().describe_buckets();
  const Tensor x = Tensor::normal({4, 8}, 0, 1, {.seed = 1});
  const Tensor y = Tensor::normal({4, 3}, 0, 1, {.seed = 2});
  for (int step = 0; step < 3; ++step) {
    params.zero_grad();
    mse_loss(ddp(x), y).backward();
  }
  CHECK(ddp.reducer().buckets_rebuilt());
  CHECK(ddp.reducer().describe_buckets() == before);
  for (const comm::Bucket& bucket : ddp.reducer().buckets())
    CHECK(bucket.grads.storage() == params.grads().storage());
}

TEST_CASE("reducer: packed buckets (not contiguous in the flat buffer) reduce exactly") {
  comm::Distributed dist = world_of_one();
  // Registered fc2, fc0, fc3, fc1: layout fc1, fc3, fc0, fc2. Caps of two layers: observed
  // buckets {fc3, fc2} and {fc1, fc0}, neither contiguous in the layout.
  const std::array<int, 4> registration{2, 0, 3, 1};
  Replica rebuilt(dist, registration, {.bucket_cap_mb = 0.002, .first_bucket_mb = 0.002});
  ShuffledMlp plain(registration);
  nn::FlatParameters plain_params(plain, Device::cpu());
  std::vector<std::pair<std::int64_t, std::int64_t>> handed_on;  // bucket-reduced hook calls
  rebuilt.ddp.reducer().set_bucket_reduced_hook([&](const comm::Bucket& piece) {
    CHECK_FALSE(piece.packed);
    CHECK(piece.grads.storage() == rebuilt.params.grads().storage());
    handed_on.emplace_back(piece.offset, piece.numel);
  });
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    handed_on.clear();
    plain_params.zero_grad();
    mse_loss(plain(kX), kY).backward();
    CHECK(rebuilt.step(kX, kY) == plain_params.grads().to_vector());
    std::int64_t covered = 0;
    for (const auto& [offset, numel] : handed_on) covered += numel;
    CHECK(covered == rebuilt.params.numel());  // every gradient handed on once
  }
  const auto& buckets = rebuilt.ddp.reducer().buckets();
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].packed);
  CHECK(buckets[1].packed);
  CHECK(rebuilt.first_bucket() == "fc3.bias fc3.weight fc2.bias fc2.weight ");
  // Layout fc1, fc3, fc0, fc2: bucket 0's two runs are fc3 then fc2, bucket 1's fc1 then fc0.
  CHECK(handed_on.size() == 4);
}

TEST_CASE("reducer: without DDP the ranks agree on the order through a broadcast") {
  // DDP agrees through its store; a Reducer on its own broadcasts rank 0's order.
  comm::Distributed dist = world_of_one();
  ShuffledMlp model({1, 2, 3, 0});
  nn::FlatParameters params(model, Device::cpu());
  comm::Reducer reducer(params, dist.group, {.bucket_cap_mb = 0.0001, .first_bucket_mb = 0.0001});
  for (int step = 0; step < 2; ++step) {
    params.zero_grad();
    const Tensor out = model.forward(kX);
    reducer.prepare_for_backward(out);  // what DDP's forward does: arms this backward
    mse_loss(out, kY).backward();
  }
  CHECK(reducer.buckets_rebuilt());
  CHECK(params.slots()[reducer.buckets().front().slots.front()].name == "fc3.bias");
}
