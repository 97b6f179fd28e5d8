// The FLOP model's arithmetic, and the step model that puts profile, buckets, network and replay
// together.

#include <doctest/doctest.h>

#include "benchmarks/sim/error.h"
#include "benchmarks/sim/flop_model.h"
#include "benchmarks/sim/step_model.h"

using namespace nanoddp::sim;

TEST_CASE("flop model: a single Linear, timed by the roofline by hand") {
  // Linear(1024 -> 1024), batch 1024, H100 fp32 at 100 %: the GEMM is 2 * 1024^3 FLOP =
  // 2.147e9 / 66.9e12 FLOP/s = 32.10 us (its 12.6 MB take only 3.8 us at 3.35 TB/s), + 4 us
  // launch. Forward adds the bias kernel (read + write 4 MiB: 1.25 us + 4) and the loss (reads
  // two 4 MiB tensors: 1.25 us + 4).
  const GpuSpec& h100 = find_gpu("h100");
  const MlpShape shape{.in = 1024, .out = 1024, .hidden = 1, .layers = 0};
  const ComputeProfile p =
      profile_from_flops(h100, {.shape = shape, .batch = 1024, .efficiency = 1.0});
  const double gemm_ms = 2.0 * 1024 * 1024 * 1024 / 66.9e9 + 0.004;
  const double elementwise_ms = 1024.0 * 1024 * 2 * 4 / 3350e6 + 0.004;
  CHECK(p.forward_ms == doctest::Approx(gemm_ms + 2 * elementwise_ms).epsilon(1e-9));
  // Backward: the loss's backward (2 reads + 1 write), dW, db (one read); no dX for the first
  // layer. Bias and weight are ready together.
  const double loss_backward_ms = 1024.0 * 1024 * 3 * 4 / 3350e6 + 0.004;
  const double db_ms = 1024.0 * 1024 * 1 * 4 / 3350e6 + 0.004;
  REQUIRE(p.grads.size() == 2);
  CHECK(p.grads[0].name == "layers.0.bias");
  CHECK(p.grads[0].work_ms == doctest::Approx(loss_backward_ms + gemm_ms + db_ms).epsilon(1e-9));
  CHECK(p.grads[1].work_ms == 0.0);
  // AdamW streams 28 bytes per parameter.
  const double params = 1024.0 * 1024 + 1024;
  CHECK(p.optimizer_ms == doctest::Approx(params * 28 / 3350e6 + 0.004).epsilon(1e-9));
}

TEST_CASE("flop model: precision, GPU and efficiency move the times the right way") {
  const MlpShape shape{.in = 4096, .out = 4096, .hidden = 4096, .layers = 4};
  const FlopModelOptions fp32{.shape = shape, .batch = 512};
  FlopModelOptions bf16 = fp32;
  bf16.precision = Precision::kBf16;
  const ComputeProfile h100_fp32 = profile_from_flops(find_gpu("h100"), fp32);
  const ComputeProfile h100_bf16 = profile_from_flops(find_gpu("h100"), bf16);
  const ComputeProfile h200_fp32 = profile_from_flops(find_gpu("h200"), fp32);
  CHECK(h100_bf16.backward_ms() < h100_fp32.backward_ms() / 5);
  // Same tensor cores, faster memory: the (memory-bound) optimizer is 4.8/3.35 faster on H200.
  CHECK(h200_fp32.optimizer_ms < h100_fp32.optimizer_ms);
  CHECK(h200_fp32.backward_ms() == doctest::Approx(h100_fp32.backward_ms()).epsilon(0.02));
  // The first Linear has no dX to compute: less backward work than an equal hidden one.
  const auto& g = h100_fp32.grads;
  CHECK(g[g.size() - 2].work_ms < g[g.size() - 4].work_ms);
  CHECK_THROWS_WITH_AS(profile_from_flops(find_gpu("h100"), {.shape = shape, .efficiency = 1.5}),
                       doctest::Contains("--efficiency"), SimError);
  CHECK_THROWS_WITH_AS(find_gpu("b200"), doctest::Contains("known: h100, h200, a100"), SimError);
}

namespace {

// A hand-made profile: three Linear layers, 1 ms of backward each, 1 MiB of gradients each.
ComputeProfile hand_profile() {
  ComputeProfile p;
  p.source = "hand-made";
  for (int k = 0; k < 3; ++k) {
    p.grads.push_back({"bias", 0, 1.0});
    p.grads.push_back({"weight", 262144, 0.0});
  }
  p.forward_ms = 2.0;
  p.optimizer_ms = 0.5;
  p.other_ms = 0.25;
  return p;
}

// One level, 5 us steps, 10 GB/s: all-reduce of 1 MiB on 2 ranks = 10 us + 104.9 us.
Fabric slow_fabric() {
  return {.name = "slow",
          .intra_bw_gbs = 10.0,
          .intra_lat_us = 5.0,
          .inter_bw_gbs = 10.0,
          .inter_lat_us = 5.0};
}

// Two ranks on slow_fabric() with 1 MiB buckets: hand_profile()'s three layers make three
// buckets of 1 MiB, for the tests that add the times up by hand. kAuto is StepOptions' default.
StepOptions two_slow_ranks(Algorithm algorithm = Algorithm::kAuto) {
  return {.cluster = {.nodes = 1, .gpus_per_node = 2},
          .fabric = slow_fabric(),
          .algorithm = algorithm,
          .bucket_cap_mb = 1.0,
          .first_bucket_mb = 1.0};
}

}  // namespace

TEST_CASE("step model: step = forward + backward + exposed + sync + optimizer + other") {
  const ComputeProfile p = hand_profile();
  StepOptions o = two_slow_ranks(Algorithm::kRing);
  const StepPrediction s = predict_step(p, o);
  // Three buckets of 1 MiB, ready at 1, 2, 3 ms; each all-reduce 0.010 + 1048576/1e7 ms.
  const double c = 0.010 + 1048576.0 / 1e7;
  REQUIRE(s.buckets.size() == 3);
  CHECK(s.collectives[0].ms == doctest::Approx(c));
  // The last bucket starts at 3 ms (the stream is free by then): exposed = c.
  CHECK(s.exposed_comm_ms == doctest::Approx(c));
  CHECK(s.comm_ms == doctest::Approx(3 * c));
  // Sync: 2n floats = 16 bytes.
  CHECK(s.sync_ms == doctest::Approx(0.010 + 16.0 / 1e7));
  CHECK(s.step_ms == doctest::Approx(2.0 + 3.0 + c + s.sync_ms + 0.5 + 0.25));
  CHECK(s.single_gpu_step_ms == doctest::Approx(5.75));
  CHECK(s.scaling_efficiency == doctest::Approx(5.75 / s.step_ms));

  // Overlap off: all of the communication is exposed.
  o.overlap = false;
  const StepPrediction off = predict_step(p, o);
  CHECK(off.exposed_comm_ms == doctest::Approx(3 * c));
  CHECK(off.overlap_fraction == doctest::Approx(0.0));

  // Without the sync all-reduce, and on one rank: no communication at all.
  o.overlap = true;
  o.sync_allreduce = false;
  CHECK(predict_step(p, o).sync_ms == 0.0);
  o.cluster = {.nodes = 1, .gpus_per_node = 1};
  o.sync_allreduce = true;
  const StepPrediction one = predict_step(p, o);
  CHECK(one.comm_ms == 0.0);
  CHECK(one.sync_ms == 0.0);
  CHECK(one.step_ms == doctest::Approx(5.75));
  CHECK(one.scaling_efficiency == doctest::Approx(1.0));
}

TEST_CASE("step model: the optimizer in backward hides the last all-reduces, by hand") {
  ComputeProfile p = hand_profile();
  StepOptions o = two_slow_ranks(Algorithm::kRing);
  o.optimizer_in_backward = true;
  // Three equal buckets end at 1 + c, 2 + c and 3 + c ms; backward ends at 3 ms.
  const double c = 0.010 + 1048576.0 / 1e7;
  // Updates of 0.5 / 3 ms each: bucket 0 and 1 are done when backward ends, their updates take
  // until 3.333 ms, by when bucket 2 (3 + c = 3.115 ms) is done too: nothing exposed.
  const StepPrediction hidden = predict_step(p, o);
  CHECK(hidden.exposed_comm_ms == doctest::Approx(0.0));
  // The overlap is nanoddp-bench-ddp's (ReducerStats'): the share that ran during backward.
  // Bucket 2 ran after it, beside the updates: shorter step, but not overlap.
  CHECK(hidden.overlap_fraction == doctest::Approx(2.0 / 3.0));
  CHECK(hidden.step_ms == doctest::Approx(2.0 + 3.0 + hidden.sync_ms + 0.5 + 0.25));
  // Updates of 0.01 ms: waiting for bucket 2 starts at 3.02 ms and lasts until 3 + c.
  p.optimizer_ms = 0.03;
  const StepPrediction partial = predict_step(p, o);
  CHECK(partial.exposed_comm_ms == doctest::Approx(c - 0.02));
  // Never worse than the step after backward, which waits for all of them first.
  o.optimizer_in_backward = false;
  const StepPrediction after = predict_step(p, o);
  CHECK(after.exposed_comm_ms == doctest::Approx(c));
  CHECK(partial.step_ms == doctest::Approx(after.step_ms - 0.02));
}

TEST_CASE("step model: the optimizer in backward on CPU cores that are all busy gains nothing") {
  const ComputeProfile p = hand_profile();
  StepOptions o = two_slow_ranks(Algorithm::kRing);
  o.cores = 2;
  // 2 ranks on 2 cores: an update and an all-reduce running together get half a core each, so
  // interleaving them conserves the work and finalize takes as long as waiting first, then
  // updating (measured on the 2-core VM: no clear change beyond the run-to-run noise).
  const StepPrediction after = predict_step(p, o);
  REQUIRE(after.exposed_comm_ms > 0);
  o.optimizer_in_backward = true;
  const StepPrediction busy = predict_step(p, o);
  CHECK(busy.step_ms == doctest::Approx(after.step_ms));
  // With a spare core per thread (4 cores) the two run side by side at full speed: the same as
  // the uncontended model (no --cores), which hides the last all-reduce behind the updates.
  o.cores = 4;
  const StepPrediction spare = predict_step(p, o);
  o.cores = 0;
  const StepPrediction unlimited = predict_step(p, o);
  CHECK(spare.step_ms == doctest::Approx(unlimited.step_ms));
  CHECK(spare.exposed_comm_ms == doctest::Approx(0.0));
}

TEST_CASE("step model: the bucket sweep names the fastest cap") {
  // With a large per-collective cost, fewer buckets win: one bucket after the first (cap >= 2 MiB
  // holds the remaining two layers) pays the launch cost twice instead of three times.
  const ComputeProfile p = hand_profile();
  StepOptions o = two_slow_ranks();
  o.fabric.launch_us = 5000;  // 5 ms per collective
  const auto rows = sweep_bucket_caps(p, o, {0.5, 1.0, 2.0, 25.0});
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].buckets == 3);
  CHECK(rows[2].buckets == 2);
  CHECK(rows[3].buckets == 2);
  const SweepRow& best = best_row(rows);
  CHECK(best.bucket_cap_mb == 2.0);  // ties with 25 MiB: the smaller cap
  for (const SweepRow& r : rows) CHECK(best.step_ms <= r.step_ms);
  CHECK(default_sweep_caps(3.0).size() == default_sweep_caps(25.0).size() + 1);
}

TEST_CASE("step model: the node sweep doubles the nodes up to the cluster's") {
  const ComputeProfile p = hand_profile();
  const StepOptions o{.cluster = {.nodes = 6, .gpus_per_node = 4},
                      .fabric = find_fabric("nvlink4-ib400")};
  const auto rows = sweep_nodes(p, o);
  std::vector<int> nodes;
  for (const ScalingRow& r : rows) nodes.push_back(r.nodes);
  CHECK(nodes == std::vector<int>{1, 2, 4, 6});
  CHECK(rows.back().world_size == 24);
  CHECK(rows.back().step_ms == doctest::Approx(predict_step(p, o).step_ms));
  // More ranks never make this step faster: every rank still computes as much.
  for (std::size_t i = 1; i < rows.size(); ++i) CHECK(rows[i].step_ms >= rows[i - 1].step_ms);
  CHECK(rows.front().scaling_efficiency <= 1.0);
}

TEST_CASE("step model: CPU ranks sharing cores, shares by hand") {
  CHECK(core_share(0, 64) == 1.0);  // unlimited: GPUs
  CHECK(core_share(2, 1) == 1.0);
  CHECK(core_share(2, 2) == 1.0);
  CHECK(core_share(2, 3) == doctest::Approx(2.0 / 3));
  CHECK(core_share(2, 8) == doctest::Approx(0.25));

  ComputeProfile alone = hand_profile();
  alone.measured = MeasuredStep{.world_size = 1};
  StepOptions o{.cluster = {.nodes = 1, .gpus_per_node = 3}, .fabric = slow_fabric()};
  // Without --cores nothing changes, whatever the profile and the network.
  o.network_ranks = 3;
  ReplayRates r = sharing_rates(alone, o);
  CHECK(r.compute_alone == 1.0);
  CHECK(r.compute_shared == 1.0);
  CHECK(r.comm_alone == 1.0);
  CHECK(r.comm_shared == 1.0);

  // Three ranks on two cores from a one-rank profile and a network fitted on three ranks:
  // compute alone 2/3 (3 threads), beside a collective 1/3 (6 threads); the fit already ran 3
  // communication threads on the 2 cores, so collectives run as fitted alone and at
  // (1/3) / (2/3) beside backward.
  o.cores = 2;
  r = sharing_rates(alone, o);
  CHECK(r.compute_alone == doctest::Approx(2.0 / 3));
  CHECK(r.compute_shared == doctest::Approx(1.0 / 3));
  CHECK(r.comm_alone == doctest::Approx(1.0));
  CHECK(r.comm_shared == doctest::Approx(0.5));

  // Two ranks on two cores: compute has a core each until the collectives come.
  o.cluster.gpus_per_node = 2;
  o.network_ranks = 2;
  r = sharing_rates(alone, o);
  CHECK(r.compute_alone == 1.0);
  CHECK(r.compute_shared == doctest::Approx(0.5));
  CHECK(r.comm_alone == 1.0);
  CHECK(r.comm_shared == doctest::Approx(0.5));

  // The cores are a node's: two nodes of three ranks share like one node of three.
  o.cluster = {.nodes = 2, .gpus_per_node = 3};
  o.network_ranks = 3;
  r = sharing_rates(alone, o);
  CHECK(r.compute_alone == doctest::Approx(2.0 / 3));
  CHECK(r.compute_shared == doctest::Approx(1.0 / 3));
  CHECK(r.comm_shared == doctest::Approx(0.5));
  o.cluster = {.nodes = 1, .gpus_per_node = 2};

  // A named (GPU) fabric is no CPU work when measured: collectives get share(n) of a core.
  o.network_ranks = 0;
  o.cluster.gpus_per_node = 4;
  r = sharing_rates(alone, o);
  CHECK(r.comm_alone == doctest::Approx(0.5));
  CHECK(r.comm_shared == doctest::Approx(0.25));

  // A profile traced on the simulated world already ran at that world's shares, beside its
  // collectives included: compute as traced. The collectives were fitted alone; beside backward
  // they share the cores with the compute threads: share(8) / share(4).
  ComputeProfile traced = hand_profile();
  traced.measured = MeasuredStep{.world_size = 4};
  o.network_ranks = 4;
  r = sharing_rates(traced, o);
  CHECK(r.compute_alone == doctest::Approx(1.0));
  CHECK(r.compute_shared == doctest::Approx(1.0));
  CHECK(r.comm_alone == doctest::Approx(1.0));
  CHECK(r.comm_shared == doctest::Approx(0.5));
}

TEST_CASE("step model: three CPU ranks on two cores, the step by hand") {
  // hand_profile measured on one rank; three ranks share two cores; the network (1 MiB: c =
  // 4 x 5 us + 4/3 x 1 MiB / 10 GB/s) was measured on three ranks.
  //   forward 2 / (2/3) = 3, optimizer 0.75, other 0.375.
  //   backward: gradient 0 at 1.5; bucket 0 runs at 1/2 (2c) while backward does 2c/3 of work at
  //   1/3, which alone would have taken c: each overlapped bucket adds c. Buckets 0 and 1
  //   overlap; bucket 2 is ready as backward ends (no tail) at 4.5 + 2c and runs alone: c
  //   exposed.
  ComputeProfile p = hand_profile();
  p.measured = MeasuredStep{.world_size = 1};
  const StepOptions o{.cluster = {.nodes = 1, .gpus_per_node = 3},
                      .fabric = slow_fabric(),
                      .algorithm = Algorithm::kRing,
                      .bucket_cap_mb = 1.0,
                      .first_bucket_mb = 1.0,
                      .cores = 2,
                      .network_ranks = 3};
  const StepPrediction s = predict_step(p, o);
  const double c = 0.020 + 4.0 / 3 * 1048576.0 / 1e7;
  REQUIRE(s.buckets.size() == 3);
  CHECK(s.collectives[0].ms == doctest::Approx(c));
  CHECK(s.forward_ms == doctest::Approx(3.0));
  CHECK(s.optimizer_ms == doctest::Approx(0.75));
  CHECK(s.other_ms == doctest::Approx(0.375));
  CHECK(s.timeline.buckets[1].ready_ms == doctest::Approx(3.0 + c));
  CHECK(s.backward_ms == doctest::Approx(4.5 + 2 * c));
  CHECK(s.exposed_comm_ms == doctest::Approx(c));
  CHECK(s.comm_ms == doctest::Approx(5 * c));  // two at half speed, one at full
  const double sync = 0.020 + 4.0 / 3 * 24 / 1e7;
  CHECK(s.sync_ms == doctest::Approx(sync));
  CHECK(s.step_ms == doctest::Approx(3.0 + 4.5 + 3 * c + sync + 0.75 + 0.375));
  // One rank alone has a core: the profile as measured.
  CHECK(s.single_gpu_step_ms == doctest::Approx(5.75));

  // The same profile traced on the three ranks: its compute replays as traced (the sharing is
  // in the trace already); the overlapped buckets 0 and 1 still take 2c beside backward, and one
  // rank alone would have run 3/2 as fast.
  ComputeProfile traced = hand_profile();
  traced.measured = MeasuredStep{.world_size = 3};
  const StepPrediction t = predict_step(traced, o);
  CHECK(t.forward_ms == doctest::Approx(2.0));
  CHECK(t.backward_ms == doctest::Approx(3.0));
  CHECK(t.optimizer_ms == doctest::Approx(0.5));
  CHECK(t.comm_ms == doctest::Approx(5 * c));
  CHECK(t.exposed_comm_ms == doctest::Approx(c));
  CHECK(t.single_gpu_step_ms == doctest::Approx(5.75 / 1.5));
}

TEST_CASE("step model: the slowest rank needs a profile with peers, on the traced world") {
  ComputeProfile p = hand_profile();
  p.measured = MeasuredStep{.world_size = 2};
  StepOptions o = two_slow_ranks();
  o.peers = true;
  CHECK_THROWS_WITH_AS(predict_step(p, o), doctest::Contains("needs a profile read with its peers"),
                       SimError);
  // The peer has every gradient 0.5 ms after this rank: the last bucket starts 0.5 ms later.
  p.peers_ready_ms = {1.5, 1.5, 2.5, 2.5, 3.5, 3.5};
  const StepPrediction with = predict_step(p, o);
  o.peers = false;
  const StepPrediction without = predict_step(p, o);
  CHECK(with.timeline.buckets[2].start_ms == doctest::Approx(3.5));
  CHECK(with.exposed_comm_ms == doctest::Approx(without.exposed_comm_ms + 0.5));
  o.peers = true;
  o.cluster.gpus_per_node = 4;
  CHECK_THROWS_WITH_AS(predict_step(p, o), doctest::Contains("the trace holds 2 ranks"), SimError);
  o.cluster.gpus_per_node = 2;
  o.cores = -1;
  CHECK_THROWS_WITH_AS(predict_step(p, o), doctest::Contains("--cores must be >= 0"), SimError);
}
