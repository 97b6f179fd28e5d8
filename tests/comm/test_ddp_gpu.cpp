// DistributedDataParallel on a GPU with NCCL, world of one: the Reducer's CUDA path (buckets
// reduced on the communication stream, the compute stream waiting on their events) must leave
// exactly the gradients a plain backward leaves, and training must work. A world of one issues
// no collective unless asked (ReducerOptions::collectives_in_world_of_one): asked here, so that
// one GPU runs that path. Runs only where a GPU is (gpu_main.cpp skips with 77).

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/optimizer_in_backward.h"

using namespace nanoddp;

namespace {

// A DDP-wrapped Mlp on cuda:0 in an NCCL world of one, beside an unwrapped twin of the same
// seed: whatever the CUDA path does, it must match the twin. Small caps: several buckets, so the
// in-order launch and the event waits are exercised. The seed is a template argument so that
// TEST_CASE_FIXTURE can build it. Members are built in this order; ddp keeps references.
template <std::uint64_t Seed>
struct NcclDdpAndPlainTwin {
  static constexpr nn::MlpOptions kShape{
      .in_features = 32, .out_features = 8, .hidden = 64, .layers = 3, .seed = Seed};

  const Device gpu = Device::cuda(0);
  comm::Distributed dist =
      comm::init_distributed(comm::WorldInfo{}, {.backend = "nccl", .device = gpu});
  nn::Mlp model{kShape};
  nn::Mlp reference{kShape};
  nn::FlatParameters params{model, gpu};
  nn::FlatParameters ref_params{reference, gpu};
  comm::DistributedDataParallel ddp{
      model,
      params,
      dist.group,
      dist.store,
      {.reducer = {
           .bucket_cap_mb = 0.01, .first_bucket_mb = 0.005, .collectives_in_world_of_one = true}}};
};

}  // namespace

TEST_CASE_FIXTURE(NcclDdpAndPlainTwin<11>,
                  "ddp on cuda:0 with NCCL (world of one) leaves the plain backward's gradients") {
  CHECK(ddp.reducer().buckets().size() >= 3);

  nn::SGD sgd(params, {.lr = 0.05f});
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    const Tensor x = Tensor::normal(
        {16, 32}, 0.0f, 1.0f, {.seed = 4, .offset = static_cast<std::uint64_t>(step) * 512}, gpu);
    const Tensor y = Tensor::zeros({16, 8}, gpu);
    sgd.zero_grad();
    ref_params.zero_grad();
    Tensor loss = mse_loss(ddp(x), y);
    loss.backward();
    mse_loss(reference(x), y).backward();
    // World of one: the average over ranks is the gradient itself.
    const auto got = params.grads().to_vector();
    const auto expected = ref_params.grads().to_vector();
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == expected[i]);
    sgd.step();
    Tensor ref_values = ref_params.values();
    ref_values.copy_from(params.values());
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(std::isfinite(last));
  CHECK(last < first);
}

#endif  // NANODDP_WITH_CUDA

#if NANODDP_WITH_CUDA
TEST_CASE(
    "ddp on cuda:0: the wait is the compute stream's stall, not the host's, no overlap, all "
    "exposed") {
  const Device gpu = Device::cuda(0);
  comm::Distributed dist =
      comm::init_distributed(comm::WorldInfo{}, {.backend = "nccl", .device = gpu});
  const nn::MlpOptions shape{
      .in_features = 256, .out_features = 256, .hidden = 1024, .layers = 3, .seed = 5};
  nn::Mlp model(shape);
  nn::FlatParameters params(model, gpu);
  // Overlap off: every bucket is reduced after backward, so the compute stream must stall for
  // all of it, while the host returns from backward() without waiting.
  comm::DistributedDataParallel ddp(
      model, params, dist.group, dist.store,
      {.reducer = {.bucket_cap_mb = 1, .overlap = false, .collectives_in_world_of_one = true}});
  nn::SGD sgd(params, {.lr = 0.01f});
  // A batch large enough that the GPU runs behind the host: the host has enqueued the step
  // (backward, the all-reduces, the waits) long before the GPU gets to the waits, so the stall
  // is the GPU's, and it covers the collectives. With a tiny batch an H200 would idle between
  // kernel launches, the collectives would be done before the waits were reached, and the
  // host's launch time would dominate both figures.
  const Tensor x = Tensor::normal({4096, 256}, 0.0f, 1.0f, {.seed = 1}, gpu);
  const Tensor y = Tensor::zeros({4096, 256}, gpu);
  const Stream compute = Stream::compute(gpu);
  for (int step = 0; step < 5; ++step) {
    Event step_begin(gpu), step_end(gpu);
    step_begin.record(compute);
    sgd.zero_grad();
    const auto host_start = std::chrono::steady_clock::now();
    mse_loss(ddp(x), y).backward();
    const double host_backward_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
            .count();
    sgd.step();
    step_end.record(compute);
    compute.synchronize();
    const double gpu_step_ms = step_begin.elapsed_ms(step_end);
    const comm::ReducerStats& stats = ddp.reducer().last_stats();
    CAPTURE(step);
    CAPTURE(stats.comm_ms);
    CAPTURE(stats.exposed_comm_ms);
    CAPTURE(stats.wait_ms);
    CAPTURE(gpu_step_ms);
    CAPTURE(host_backward_ms);
    if (step == 0) continue;  // a fresh communicator's first collectives include its set-up
    // What a world of one runs for an in-place all-reduce is NCCL's business (a kernel, a copy
    // or nothing), so the collectives may take microseconds: no ratio of two tiny timings is
    // asserted. What must hold on any GPU: both figures are GPU intervals inside the step, and
    // the stall (wait_ms) covers the collectives (they follow the same event on both streams) up
    // to a few launch gaps.
    CHECK(stats.comm_ms >= 0);
    CHECK(stats.wait_ms >= 0);
    CHECK(stats.wait_ms <= gpu_step_ms);
    CHECK(stats.wait_ms >= stats.comm_ms - 0.2);
    CHECK(stats.wait_ms <= stats.comm_ms + 0.5 * gpu_step_ms);
    // Without overlap every bucket is launched after backward: all of it is exposed.
    CHECK(stats.exposed_comm_ms == stats.comm_ms);
    CHECK(stats.overlap_fraction() == 0.0);
  }
}
#endif  // NANODDP_WITH_CUDA

#if NANODDP_WITH_CUDA
TEST_CASE_FIXTURE(
    NcclDdpAndPlainTwin<12>,
    "ddp on cuda:0: the optimizer in backward (bucket hook) equals the step after it") {
  REQUIRE(ddp.reducer().buckets().size() >= 3);
  nn::AdamW adamw(params, {.lr = 0.01f}), ref_adamw(ref_params, {.lr = 0.01f});
  // The Reducer hands each averaged bucket to the optimizer, on the compute stream after its
  // wait on the bucket's NCCL event.
  nn::OptimizerInBackward fused(adamw, params, {.hook_parameters = false});
  ddp.reducer().set_bucket_reduced_hook([&](const comm::Bucket& bucket) {
    fused.update_range(bucket.offset, bucket.numel, bucket.slots);
  });
  for (int step = 0; step < 10; ++step) {
    const Tensor x = Tensor::normal(
        {16, 32}, 0.0f, 1.0f, {.seed = 6, .offset = static_cast<std::uint64_t>(step) * 512}, gpu);
    const Tensor y = Tensor::zeros({16, 8}, gpu);
    adamw.zero_grad();
    ref_adamw.zero_grad();
    fused.arm();
    mse_loss(ddp(x), y).backward();
    CHECK(fused.finish() == 0);
    CHECK(fused.nonfinite_gradients() == 0);
    mse_loss(reference(x), y).backward();
    ref_adamw.step();
  }
  const auto got = params.values().to_vector();
  const auto expected = ref_params.values().to_vector();
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == expected[i]);
}
#endif  // NANODDP_WITH_CUDA
