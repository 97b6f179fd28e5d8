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
  // A rank the trace does not hold.
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .rank = 2}),
                       doctest::Contains("holds ranks 0, 1"), SimError);
  // The wrong widths: the layer count matches, the element count of the buckets does not.
  CHECK_THROWS_WITH_AS(
      profile_from_trace(trace, {.shape = {.in = 16, .out = 4, .hidden = 95, .layers = 2}}),
      doctest::Contains("all-reduce spans of rank 0 cover"), SimError);
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
