// find_unused_parameters with the unused parameters found after forward
// (Reducer::prepare_for_backward): a parameter the output does not reach no longer holds its
// bucket, and every later one, back to finalize.

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"

using namespace nanoddp;

namespace {

comm::Distributed world_of_one() {
  return comm::init_distributed(comm::WorldInfo{}, {.backend = "gloo", .device = Device::cpu()});
}

// fc0 -> fc1 -> fc2 -> fc3, and optionally a head registered last that forward never uses: it
// comes first in the layout (reverse registration), so it is bucket 0, right at the output.
class WithUnusedHead : public nn::Module {
 public:
  explicit WithUnusedHead(bool head) : generator_(11) {
    for (int i = 0; i < 4; ++i) {
      layers_.push_back(register_module("fc" + std::to_string(i),
                                        std::make_shared<nn::Linear>(16, 16, generator_)));
    }
    if (head) head_ = register_module("head", std::make_shared<nn::Linear>(16, 16, generator_));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (std::size_t i = 0; i < layers_.size(); ++i) h = (*layers_[i])(i > 0 ? relu(h) : h);
    return h;
  }
  // Two inputs: the second output is the head's, which a loss may leave out. The walk after
  // forward then reaches the head, and the backward that gives it no gradient finds it unused
  // only at finalize.
  std::vector<Tensor> forward_many(std::span<const Tensor> in) override {
    if (in.size() == 1) return {forward(in[0])};
    return {forward(in[0]), head_->forward(in[1])};
  }
  std::string describe() const override { return "WithUnusedHead"; }

 private:
  Generator generator_;
  std::vector<std::shared_ptr<nn::Linear>> layers_;
  std::shared_ptr<nn::Linear> head_;
};

struct Replica {
  explicit Replica(comm::Distributed& dist, bool head)
      : model(head),
        params(model, Device::cpu()),
        ddp(model, params, dist.group, dist.store,
            {.reducer = {.bucket_cap_mb = 0.0001,
                         .first_bucket_mb = 0.0001,
                         .find_unused_parameters = true}}) {}
  WithUnusedHead model;
  nn::FlatParameters params;
  comm::DistributedDataParallel ddp;
};

// Buckets launched before backward's last gradient, in bucket order.
std::vector<bool> launched_during_backward(const comm::ReducerStats& stats) {
  std::vector<bool> during;
  for (const comm::BucketStats& b : stats.buckets) {
    during.push_back(!b.launched_after_backward && b.launch_ms < stats.backward_end_ms);
  }
  return during;
}

const Tensor kX = Tensor::normal({8, 16}, 0, 1, {.seed = 5});
const Tensor kY = Tensor::normal({8, 16}, 0, 1, {.seed = 6});

}  // namespace

TEST_CASE("autograd: reachable_leaves finds the parameters an output depends on") {
  WithUnusedHead model(true);
  const Tensor out = model.forward(kX);
  const auto reached = reachable_leaves(out);
  for (const nn::NamedTensor& p : model.named_parameters()) {
    CAPTURE(p.name);
    CHECK(reached.contains(p.tensor.impl()) == (p.name.rfind("head", 0) != 0));
  }
}

TEST_CASE("autograd: reachable_leaves over several outputs is the union of what each reaches") {
  // DDP's forward_many hands every output to prepare_for_backward: a parameter used by any
  // output (here the head, through a second output) is not unused.
  WithUnusedHead model(true);
  const Tensor out = model.forward(kX);
  Tensor head_out;
  for (const nn::NamedTensor& p : model.named_parameters()) {
    if (p.name == "head.weight") head_out = mul(p.tensor, 2.0f);
  }
  REQUIRE(head_out.defined());
  const std::vector<Tensor> outputs = {out, head_out};
  const auto reached = reachable_leaves(std::span<const Tensor>(outputs));
  for (const nn::NamedTensor& p : model.named_parameters()) {
    CAPTURE(p.name);
    CHECK(reached.contains(p.tensor.impl()) == (p.name != "head.bias"));
  }
}

TEST_CASE(
    "reducer: an unused parameter near the output keeps the overlap of the model without it") {
  comm::Distributed dist = world_of_one();
  Replica with(dist, true);
  Replica without(dist, false);
  REQUIRE(with.ddp.reducer().buckets().size() == 5);  // head, fc3, fc2, fc1, fc0
  REQUIRE(without.ddp.reducer().buckets().size() == 4);
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    with.params.zero_grad();
    without.params.zero_grad();
    mse_loss(with.ddp(kX), kY).backward();
    mse_loss(without.ddp(kX), kY).backward();
    std::vector<bool> during = launched_during_backward(with.ddp.reducer().last_stats());
    // The head's bucket goes as backward starts; the rest exactly as without the head.
    CHECK(during.front());
    during.erase(during.begin());
    CHECK(during == launched_during_backward(without.ddp.reducer().last_stats()));
    CHECK(during == std::vector<bool>{true, true, true, false});  // fc0 holds the last gradient
    // Unused on every rank (the only one): no gradient, as PyTorch leaves .grad None.
    for (const auto& slot : with.params.slots()) {
      CAPTURE(slot.name);
      CHECK(slot.param.has_grad() == (slot.name.rfind("head", 0) != 0));
    }
  }
}

TEST_CASE("reducer: unused parameters found after forward give the gradients found at finalize") {
  comm::Distributed dist = world_of_one();
  Replica early(dist, true);
  Replica late(dist, true);  // its loss leaves out the head's output: found at finalize
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    early.params.zero_grad();
    late.params.zero_grad();
    mse_loss(early.ddp(kX), kY).backward();
    mse_loss(late.ddp(kX, kX).front(), kY).backward();
    CHECK(early.params.grads().to_vector() == late.params.grads().to_vector());
    CHECK(launched_during_backward(late.ddp.reducer().last_stats()) ==
          std::vector<bool>(5, false));  // the previous behaviour: nothing overlaps
  }
}

TEST_CASE("reducer: a gradient for a parameter the output does not reach is a clear error") {
  comm::Distributed dist = world_of_one();
  Replica replica(dist, true);
  const auto& head = replica.model.children().back().second;
  replica.params.zero_grad();
  const Tensor out = replica.ddp(kX);
  // The loss also uses the head, outside DDP's forward.
  CHECK_THROWS_WITH_AS(add(mse_loss(out, kY), mse_loss(head->forward(kX), kY)).backward(),
                       doctest::Contains("DDP's forward output does not depend on it"), Error);
  // The next step works.
  replica.params.zero_grad();
  CHECK_NOTHROW(mse_loss(replica.ddp(kX), kY).backward());
}

TEST_CASE("reducer: two forwards then one backward over both, a parameter only the first reached") {
  // Only the last forward's output is walked (as PyTorch's _post_forward does): the head, which
  // only the first forward used, was marked unused, and its gradient is an error naming it.
  comm::Distributed dist = world_of_one();
  Replica replica(dist, true);
  replica.params.zero_grad();
  const std::vector<Tensor> first = replica.ddp(kX, kX);  // reaches the head
  const Tensor second = replica.ddp(kX);                  // does not
  CHECK_THROWS_WITH_AS(add(mse_loss(first.back(), kY), mse_loss(second, kY)).backward(),
                       doctest::Contains("parameter 'head."), Error);
  // The next step works.
  replica.params.zero_grad();
  CHECK_NOTHROW(mse_loss(replica.ddp(kX), kY).backward());
}
