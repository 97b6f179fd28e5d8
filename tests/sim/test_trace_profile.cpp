// Compute profiles from real traces: nanoddp-train --trace run here, on one rank and as a
// two-rank DDP job, and the errors for files that are not such traces.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "benchmarks/sim/buckets.h"
#include "benchmarks/sim/error.h"
#include "benchmarks/sim/step_model.h"
#include "benchmarks/sim/trace_profile.h"
#include "support/subprocess.h"

using namespace nanoddp::sim;
using namespace nanoddp::testing;

namespace {

// Small and quick; several buckets with the tiny caps.
const MlpShape kShape{.in = 16, .out = 4, .hidden = 96, .layers = 2};

std::vector<std::string> train_args(const std::string& trace) {
  return {bin_path("nanoddp-train"),
          "--in",
          "16",
          "--out",
          "4",
          "--hidden",
          "96",
          "--layers",
          "2",
          "--batch",
          "16",
          "--steps",
          "8",
          "--trace",
          trace,
          "--trace-steps",
          "8",
          "--quiet",
          "--first-bucket-mb",
          "0.01",
          "--bucket-cap-mb",
          "0.03"};
}

ProcessOptions quick() {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "60";
  return options;
}

}  // namespace

TEST_CASE("trace profile: one rank's trace, per parameter, replays its own median step") {
  TempDir dir;
  const std::string trace = dir.file("one.json");
  const ProcessResult run = run_process(train_args(trace), quick());
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);

  const ComputeProfile p = profile_from_trace(trace, {.shape = kShape});
  // Layout order: last Linear first, bias before weight.
  REQUIRE(p.grads.size() == 6);
  CHECK(p.grads[0].name == "layers.4.bias");
  CHECK(p.grads[0].numel == 4);
  CHECK(p.grads[1].name == "layers.4.weight");
  CHECK(p.grads[1].numel == 4 * 96);
  CHECK(p.grads[5].name == "layers.0.weight");
  CHECK(p.grads[5].numel == 96 * 16);
  CHECK(p.numel() == 4 + 384 + 96 + 96 * 96 + 96 + 96 * 16);
  // A Linear's weight is ready with its bias (one backward node): no work of its own.
  CHECK(p.grads[1].work_ms == 0.0);
  CHECK(p.grads[0].work_ms > 0.0);
  CHECK(p.forward_ms > 0.0);
  CHECK(p.optimizer_ms > 0.0);
  CHECK(p.backward_ms() > 0.0);
  REQUIRE(p.measured.has_value());
  CHECK(p.measured->world_size == 1);
  CHECK(p.measured->bucket_numel.empty());  // no DDP on one process
  CHECK_FALSE(p.other_includes_sync);
  CHECK(p.source.find("medians of 7 steps") != std::string::npos);

  // Replayed on one rank (no communication), the profile gives back the trace's median step.
  const StepPrediction one = predict_step(
      p, {.cluster = {.nodes = 1, .gpus_per_node = 1}, .fabric = find_fabric("nvlink4-ib400")});
  CHECK(one.step_ms == doctest::Approx(p.measured->step_ms).epsilon(1e-9));
  CHECK(one.comm_ms == 0.0);
  CHECK(one.scaling_efficiency == doctest::Approx(1.0));

  // The shape must be the traced run's.
  CHECK_THROWS_WITH_AS(
      profile_from_trace(trace, {.shape = {.in = 16, .out = 4, .hidden = 96, .layers = 3}}),
      doctest::Contains("has 3 \"backward linear\" spans, but --layers 3 means 4"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .rank = 1}),
                       doctest::Contains("holds ranks 0"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .skip_steps = 8}),
                       doctest::Contains("no step remains"), SimError);
  // One rank has no peers to wait for.
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .peers = true}),
                       doctest::Contains("holds one rank"), SimError);
}

TEST_CASE("trace profile: a two-rank DDP trace has the simulator's buckets and its comm") {
  TempDir dir;
  const std::string trace = dir.file("two.json");
  std::vector<std::string> args = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  const auto train = train_args(trace);
  args.insert(args.end(), train.begin(), train.end());
  const ProcessResult run = run_process(args, quick());
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);

  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const ComputeProfile p = profile_from_trace(trace, {.shape = kShape, .rank = rank});
    REQUIRE(p.measured.has_value());
    CHECK(p.measured->world_size == 2);
    CHECK(p.other_includes_sync);
    // The buckets the real Reducer reduced are the ones the simulator cuts.
    std::vector<std::int64_t> numels;
    for (const GradientWork& g : p.grads) numels.push_back(g.numel);
    const auto buckets = cut_buckets(numels, 0.01, 0.03);
    REQUIRE(p.measured->bucket_numel.size() == buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      CHECK(p.measured->bucket_numel[b] == buckets[b].numel);
      CHECK(p.measured->bucket_allreduce_ms[b] > 0.0);
    }
    CHECK(buckets.size() >= 2);
    CHECK(p.measured->comm_ms > 0.0);
  }
  // With its peers: per gradient the slowest rank's time, a bias and its weight together.
  // Waiting for the slowest rank can only delay the collectives.
  const ComputeProfile alone = profile_from_trace(trace, {.shape = kShape});
  const ComputeProfile peers = profile_from_trace(trace, {.shape = kShape, .peers = true});
  REQUIRE(peers.peers_ready_ms.size() == peers.grads.size());
  for (std::size_t i = 0; i < peers.grads.size(); i += 2) {
    CHECK(peers.peers_ready_ms[i] == peers.peers_ready_ms[i + 1]);
    CHECK(peers.peers_ready_ms[i] >= 0.0);
  }
  CHECK(alone.peers_ready_ms.empty());
  StepOptions o{.cluster = {.nodes = 1, .gpus_per_node = 2},
                .fabric = find_fabric("nvlink4-ib400"),
                .bucket_cap_mb = 0.03,
                .first_bucket_mb = 0.01};
  const StepPrediction identical = predict_step(peers, o);
  o.peers = true;
  const StepPrediction slowest = predict_step(peers, o);
  for (std::size_t b = 0; b < slowest.buckets.size(); ++b) {
    CHECK(slowest.timeline.buckets[b].start_ms >= identical.timeline.buckets[b].start_ms);
  }
  CHECK(slowest.exposed_comm_ms >= identical.exposed_comm_ms);

  // A rank the trace does not hold.
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .rank = 2}),
                       doctest::Contains("holds ranks 0, 1"), SimError);
  // The wrong widths: the layer count matches, the element count of the buckets does not.
  CHECK_THROWS_WITH_AS(
      profile_from_trace(trace, {.shape = {.in = 16, .out = 4, .hidden = 95, .layers = 2}}),
      doctest::Contains("all-reduce spans of rank 0 cover"), SimError);
}

namespace {

// A hand-made two-rank DDP trace of kShape (3 Linear, 11332 parameters in one bucket), 3 steps
// 1 ms apart. Per step, in microseconds from the step's start: data 0-10, forward 10-110, the
// three "backward linear" spans end at 200, 300 and 400 (+ `late_us` on rank 1), finalize waits
// 450-500 and the all-reduce ends at 500 on both ranks (+ `clock_offset_us` on rank 1's clock),
// optimizer 500-600.
std::string two_rank_trace(double late_us, double clock_offset_us) {
  std::string events;
  const auto add = [&](const std::string& name, int pid, int tid, double ts, double dur,
                       const std::string& args = "") {
    if (!events.empty()) events += ",";
    events += fmt::format(R"({{"name":"{}","ph":"X","pid":{},"tid":{},"ts":{},"dur":{}{}}})", name,
                          pid, tid, ts, dur, args);
  };
  for (int pid : {0, 1}) {
    const double late = pid == 1 ? late_us : 0.0;
    for (int step = 0; step < 3; ++step) {
      const double t0 = step * 1000.0 + (pid == 1 ? clock_offset_us : 0.0);
      add("data", pid, 3, t0, 10);
      add("forward", pid, 0, t0 + 10, 100);
      for (int k = 0; k < 3; ++k) add("backward linear", pid, 0, t0 + 110 + 100 * k + late, 90);
      add("all-reduce bucket 0", pid, 1, t0 + 150, 350, R"(,"args":{"elements":11332})");
      add("wait for all-reduce", pid, 0, t0 + 450, 50);
      add("optimizer step", pid, 0, t0 + 500, 100);
    }
  }
  return R"({"traceEvents": [)" + events + "]}";
}

}  // namespace

TEST_CASE("trace profile: the slowest rank's gradient times, by hand") {
  // Rank 1 finishes each Linear 30 us after rank 0. Seen from rank 0 (backward from 110): its own
  // gradients at 0.09, 0.19, 0.29 ms, rank 1's at 0.12, 0.22, 0.32 -- the slowest.
  const std::string late = two_rank_trace(30, 0);
  const ComputeProfile p0 =
      profile_from_trace_text(late, "late.json", {.shape = kShape, .peers = true});
  REQUIRE(p0.peers_ready_ms.size() == 6);
  const std::vector<double> expected0 = {0.12, 0.12, 0.22, 0.22, 0.32, 0.32};
  for (std::size_t i = 0; i < 6; ++i) CHECK(p0.peers_ready_ms[i] == doctest::Approx(expected0[i]));
  CHECK(p0.grads[0].work_ms == doctest::Approx(0.09));
  CHECK(p0.source.find("slowest rank") != std::string::npos);
  // Seen from rank 1 (backward from 140): rank 0's ends are 30 us earlier than its own, so the
  // slowest is rank 1 itself: 0.09, 0.19, 0.29.
  const ComputeProfile p1 =
      profile_from_trace_text(late, "late.json", {.shape = kShape, .rank = 1, .peers = true});
  const std::vector<double> expected1 = {0.09, 0.09, 0.19, 0.19, 0.29, 0.29};
  for (std::size_t i = 0; i < 6; ++i) CHECK(p1.peers_ready_ms[i] == doctest::Approx(expected1[i]));

  // Ranks on different clocks (hosts): the same all-reduce ends 5 s apart.
  CHECK_THROWS_WITH_AS(profile_from_trace_text(two_rank_trace(0, 5e6), "hosts.json",
                                               {.shape = kShape, .peers = true}),
                       doctest::Contains("the ranks' clocks differ"), SimError);
  // Without the peers, the clocks do not matter.
  CHECK_NOTHROW(profile_from_trace_text(two_rank_trace(0, 5e6), "hosts.json", {.shape = kShape}));
}

TEST_CASE("trace profile: files that are not nanoddp traces are refused with a reason") {
  const TraceProfileOptions o{.shape = kShape};
  CHECK_THROWS_WITH_AS(profile_from_trace("/nonexistent/trace.json", o),
                       doctest::Contains("cannot open"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace_text("{\"traceEvents\": [", "t.json", o),
                       doctest::Contains("not valid JSON"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace_text("[1, 2, 3]", "t.json", o),
                       doctest::Contains("no \"traceEvents\" array"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace_text(R"({"traceEvents": []})", "t.json", o),
                       doctest::Contains("no events"), SimError);
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(R"({"traceEvents": [{"name": "forward", "ph": "X", "pid": 0}]})",
                              "t.json", o),
      doctest::Contains("no numeric \"tid\""), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace_text(R"({"traceEvents": [{"ph": "X"}]})", "t.json", o),
                       doctest::Contains("integer \"pid\""), SimError);

  // Well-formed, but steps without an optimizer span (gradient accumulation: two forwards per
  // step) cannot be modelled.
  std::string events;
  for (int step = 0; step < 4; ++step) {
    const double t0 = step * 1000.0;
    if (!events.empty()) events += ",";
    events += fmt::format(R"({{"name":"forward","ph":"X","pid":0,"tid":0,"ts":{},"dur":10}})", t0);
    for (int k = 0; k < 3; ++k) {
      events +=
          fmt::format(R"(,{{"name":"backward linear","ph":"X","pid":0,"tid":0,"ts":{},"dur":10}})",
                      t0 + 20 + 20 * k);
    }
  }
  CHECK_THROWS_WITH_AS(profile_from_trace_text(R"({"traceEvents": [)" + events + "]}", "t.json", o),
                       doctest::Contains("has no \"optimizer step\" span"), SimError);
}
