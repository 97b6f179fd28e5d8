// Compute profiles from real traces: nanoddp-train --trace run here, on one rank and as a
// two-rank DDP job, with and without the shape flags (the traces' "grad" markers carry the
// parameters); hand-made traces: a model that is no MLP, an older trace without markers; and
// the errors for files that are not such traces.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "benchmarks/sim/buckets.h"
#include "benchmarks/sim/error.h"
#include "benchmarks/sim/input_file.h"
#include "benchmarks/sim/step_model.h"
#include "benchmarks/sim/trace_profile.h"
#include "sim/sim_runs.h"
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

  // Shape flags that disagree with the trace's "grad" markers: the message names both.
  const auto wrong_layers = [&] {
    profile_from_trace(trace, {.shape = MlpShape{.in = 16, .out = 4, .hidden = 96, .layers = 3}});
  };
  CHECK_THROWS_WITH_AS(wrong_layers(),
                       doctest::Contains("markers (rank 0, step 2) list 6 parameters"), SimError);
  CHECK_THROWS_WITH_AS(wrong_layers(), doctest::Contains("--layers 3 mean 8 parameters"), SimError);
  CHECK_THROWS_WITH_AS(wrong_layers(), doctest::Contains("layers.6.weight 384"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .rank = 1}),
                       doctest::Contains("holds ranks 0"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .skip_steps = 8}),
                       doctest::Contains("no step remains"), SimError);
  // The rule the message states: more traced steps than skipped ones (it said N > 9 here).
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .skip_steps = 8}),
                       doctest::Contains("--trace-steps N with N > 8; 13 or more"), SimError);
  CHECK(profile_from_trace(trace, {.shape = kShape, .skip_steps = 7}).warnings.size() == 1);
  CHECK(profile_from_trace(trace, {.shape = kShape, .skip_steps = 3}).warnings.empty());
  // One rank has no peers to wait for.
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .peers = true}),
                       doctest::Contains("holds one rank"), SimError);
}

namespace {
// A real 2-rank DDP trace: nanoddp-run starting two nanoddp-train ranks with --trace.
void write_two_rank_trace(const std::string& trace, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  const auto train = train_args(trace);
  args.insert(args.end(), train.begin(), train.end());
  args.insert(args.end(), extra.begin(), extra.end());
  const ProcessResult run = run_process(args, quick());
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
}
}  // namespace

TEST_CASE("trace profile: a two-rank DDP trace has the simulator's buckets and its comm") {
  TempDir dir;
  const std::string trace = dir.file("two.json");
  write_two_rank_trace(trace);

  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const ComputeProfile p = profile_from_trace(trace, {.shape = kShape, .rank = rank});
    REQUIRE(p.measured.has_value());
    CHECK(p.measured->world_size == 2);
    CHECK(p.other_includes_sync);
    CHECK(p.comm_hook == std::optional<std::string>("allreduce"));
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
    // Waiting for the slowest rank can only delay a start (to float rounding: the two replays
    // add the same times in different orders).
    CHECK(slowest.timeline.buckets[b].start_ms >= identical.timeline.buckets[b].start_ms - 1e-9);
  }
  CHECK(slowest.exposed_comm_ms >= identical.exposed_comm_ms - 1e-9);

  // A rank the trace does not hold.
  CHECK_THROWS_WITH_AS(profile_from_trace(trace, {.shape = kShape, .rank = 2}),
                       doctest::Contains("holds ranks 0, 1"), SimError);
  // The wrong widths: the layer count matches, the markers' sizes do not.
  CHECK_THROWS_WITH_AS(
      profile_from_trace(trace, {.shape = MlpShape{.in = 16, .out = 4, .hidden = 95, .layers = 2}}),
      doctest::Contains("layers.0.weight 1536; but the shape flags --in 16 --out 4 --hidden 95 "
                        "--layers 2 mean 6 parameters, 11119 elements"),
      SimError);
}

TEST_CASE("trace profile: with grad markers the shape flags are optional and change nothing") {
  TempDir dir;
  const std::string trace = dir.file("two.json");
  write_two_rank_trace(trace);

  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const ComputeProfile flags = profile_from_trace(trace, {.shape = kShape, .rank = rank});
    const ComputeProfile markers = profile_from_trace(trace, {.rank = rank});
    // The same parameters, in the same (layout) order, with the same times.
    REQUIRE(markers.grads.size() == flags.grads.size());
    for (std::size_t i = 0; i < flags.grads.size(); ++i) {
      CAPTURE(i);
      CHECK(markers.grads[i].name == flags.grads[i].name);
      CHECK(markers.grads[i].numel == flags.grads[i].numel);
      CHECK(markers.grads[i].work_ms == flags.grads[i].work_ms);
    }
    CHECK(markers.numel() == 11332);
    CHECK(markers.backward_tail_ms == flags.backward_tail_ms);
    CHECK(markers.source.find("6 parameters (11332 elements) from the trace's \"grad\" markers") !=
          std::string::npos);
    // So the same buckets, which are the ones the real Reducer reduced.
    std::vector<std::int64_t> numels;
    for (const GradientWork& g : markers.grads) numels.push_back(g.numel);
    const auto buckets = cut_buckets(numels, 0.01, 0.03);
    REQUIRE(markers.measured.has_value());
    REQUIRE(markers.measured->bucket_numel.size() == buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      CHECK(markers.measured->bucket_numel[b] == buckets[b].numel);
    }
    CHECK(buckets.size() >= 2);
  }
  const ComputeProfile peers = profile_from_trace(trace, {.peers = true});
  REQUIRE(peers.peers_ready_ms.size() == 6);
  for (double t : peers.peers_ready_ms) CHECK(t >= 0.0);
}

namespace {

// A hand-made one-rank trace of a model that is no MLP: 3 steps 1 ms apart, per step (us from
// the step's start) data 0-10, forward 10-110, then three backward nodes: "backward embed"
// 110-200 finishes "embed.table" (10 elements, marker at 201), "backward matmul" 210-300
// finishes "head.proj" then "head.gain" (1000 and 5; markers at 301, 302: layout order is the
// reverse), "backward sum" 310-400 finishes nothing; optimizer 500-600. `buckets` adds all-reduce
// spans of those element counts (and a finalize wait 450-500); `extra` one more marker in step 3.
std::string marker_trace(const std::vector<int>& buckets, bool extra = false) {
  std::string events;
  const auto add = [&](const std::string& event) {
    if (!events.empty()) events += ",";
    events += event;
  };
  const auto span = [&](const std::string& name, int tid, double ts, double dur,
                        const std::string& args = "") {
    add(fmt::format(R"({{"name":"{}","ph":"X","pid":0,"tid":{},"ts":{},"dur":{}{}}})", name, tid,
                    ts, dur, args));
  };
  const auto marker = [&](const std::string& param, int numel, double ts) {
    add(fmt::format(
        R"({{"name":"grad {}","ph":"i","s":"t","pid":0,"tid":2,"ts":{},"args":{{"numel":"{}"}}}})",
        param, ts, numel));
  };
  for (int step = 0; step < 3; ++step) {
    const double t0 = step * 1000.0;
    span("data", 3, t0, 10);
    span("forward", 0, t0 + 10, 100);
    span("backward embed", 0, t0 + 110, 90);
    marker("embed.table", 10, t0 + 201);
    span("backward matmul", 0, t0 + 210, 90);
    marker("head.proj", 1000, t0 + 301);
    marker("head.gain", 5, t0 + 302);
    if (extra && step == 2) marker("head.extra", 7, t0 + 303);
    span("backward sum", 0, t0 + 310, 90);
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      span(fmt::format("all-reduce bucket {}", b), 1, t0 + 220 + 100 * b, 50,
           fmt::format(R"(,"args":{{"elements":"{}"}})", buckets[b]));
    }
    if (!buckets.empty()) span("wait for all-reduce", 0, t0 + 450, 50);
    span("optimizer step", 0, t0 + 500, 100);
  }
  return R"({"traceEvents": [)" + events + "]}";
}

}  // namespace

TEST_CASE("trace profile: grad markers give any model's parameters, sizes and ready times") {
  const ComputeProfile p = profile_from_trace_text(marker_trace({}), "m.json", {});
  REQUIRE(p.grads.size() == 3);
  CHECK(p.grads[0].name == "embed.table");
  CHECK(p.grads[0].numel == 10);
  CHECK(p.grads[1].name == "head.gain");
  CHECK(p.grads[1].numel == 5);
  CHECK(p.grads[2].name == "head.proj");
  CHECK(p.grads[2].numel == 1000);
  // Backward from 110: embed.table final at 201, the matmul's pair at 302 (its last marker).
  CHECK(p.grads[0].work_ms == doctest::Approx(0.091));
  CHECK(p.grads[1].work_ms == doctest::Approx(0.101));
  CHECK(p.grads[2].work_ms == 0.0);
  // "backward sum" ends at 400: the tail.
  CHECK(p.backward_tail_ms == doctest::Approx(0.098));
  CHECK(p.source.find("3 parameters (1015 elements)") != std::string::npos);
  // Replayed alone it gives back the median step (data excluded): 10 to 600.
  const StepPrediction one = predict_step(
      p, {.cluster = {.nodes = 1, .gpus_per_node = 1}, .fabric = find_fabric("nvlink4-ib400")});
  CHECK(one.step_ms == doctest::Approx(0.59));

  // With buckets: they must be contiguous runs of that layout.
  const ComputeProfile ddp = profile_from_trace_text(marker_trace({15, 1000}), "m.json", {});
  REQUIRE(ddp.measured.has_value());
  CHECK(ddp.measured->bucket_numel == std::vector<std::int64_t>{15, 1000});
  CHECK_THROWS_WITH_AS(profile_from_trace_text(marker_trace({510, 505}), "m.json", {}),
                       doctest::Contains("bucket 0 of rank 0 ends 510 elements into the gradients, "
                                         "inside a parameter"),
                       SimError);
  // Every step must finalize the same parameters.
  CHECK_THROWS_WITH_AS(profile_from_trace_text(marker_trace({}, true), "m.json", {}),
                       doctest::Contains("step 3 of rank 0 has \"grad\" markers for 4 parameters"),
                       SimError);
  // Shape flags describe an MLP; these markers are not one: the message names both.
  const auto with_flags = [] {
    profile_from_trace_text(marker_trace({}), "m.json",
                            {.shape = MlpShape{.in = 2, .out = 1, .hidden = 3, .layers = 1}});
  };
  CHECK_THROWS_WITH_AS(with_flags(),
                       doctest::Contains("list 3 parameters, 1015 elements: embed.table 10, "
                                         "head.gain 5, head.proj 1000"),
                       SimError);
  CHECK_THROWS_WITH_AS(with_flags(),
                       doctest::Contains("--in 2 --out 1 --hidden 3 --layers 1 mean 4 parameters"),
                       SimError);
}

namespace {

// A hand-made two-rank DDP trace of kShape (3 Linear, 11332 parameters in one bucket), 3 steps
// 1 ms apart. Per step, in microseconds from the step's start: data 0-10, forward 10-110, the
// three "backward linear" spans end at 200, 300 and 400 (+ `late_us` on rank 1), finalize waits
// 450-500 and the all-reduce, `allreduce_us` long, ends at 500 on both ranks (+
// `clock_offset_us` on rank 1's clock), optimizer 500-600. The step (data excluded) is 0.59 ms.
std::string two_rank_trace(double late_us, double clock_offset_us, double allreduce_us = 350) {
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
      add("all-reduce bucket 0", pid, 1, t0 + 500 - allreduce_us, allreduce_us,
          R"(,"args":{"elements":11332})");
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
  // Without markers (an older trace) the shape flags say what the spans are; absent, they are
  // nanoddp-train's defaults.
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(late, "late.json",
                              {.shape = MlpShape{.in = 16, .out = 4, .hidden = 96, .layers = 3}}),
      doctest::Contains("has 3 \"backward linear\" spans, but --layers 3 means 4"), SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace_text(late, "late.json", {}),
                       doctest::Contains("cover 11332 gradient elements, but MLP in=32 hidden=128"),
                       SimError);
  // Without the peers, the clocks do not matter.
  CHECK_NOTHROW(profile_from_trace_text(two_rank_trace(0, 5e6), "hosts.json", {.shape = kShape}));
}

namespace {
// `text` with every occurrence of `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// True when one of `warnings` holds `part`.
bool warned(const std::vector<std::string>& warnings, const std::string& part) {
  return std::any_of(warnings.begin(), warnings.end(),
                     [&](const std::string& w) { return w.find(part) != std::string::npos; });
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

// An outside tester: a clock gap under 1 ms passed, and shifting one rank's times by half a
// step moved a CPU prediction by 25 % without a word. The bounds scale with the step and the
// collectives now.
TEST_CASE("trace profile: --peers traced refuses a clock offset the collectives rule out") {
  const TraceProfileOptions o{.shape = kShape, .peers = true};
  // 0.08 ms with all-reduces of 0.05 ms: rank 0's (450-500) ends before rank 1's (530-580)
  // starts, which no collective does on one clock, however small the offset.
  CHECK_THROWS_WITH_AS(profile_from_trace_text(two_rank_trace(0, 80, 50), "short.json", o),
                       doctest::Contains("step 2: 'all-reduce bucket 0' ends on rank 0 (event 13, "
                                         "1500.000 us) before it starts on rank 1 (event 37, "
                                         "1530.000 us)"),
                       SimError);
  CHECK_THROWS_WITH_AS(profile_from_trace_text(two_rank_trace(0, 80, 50), "short.json", o),
                       doctest::Contains("the ranks' clocks differ"), SimError);
  TraceProfileOptions from_rank1 = o;
  from_rank1.rank = 1;
  CHECK_THROWS_WITH_AS(profile_from_trace_text(two_rank_trace(0, 80, 50), "short.json", from_rank1),
                       doctest::Contains("ends on rank 0 (event 13"), SimError);
  // Half the 0.59 ms step with all-reduces of 0.35 ms (150-500, 450-800 on rank 1): they still
  // share a moment, but end 0.3 ms apart, 51 % of the step: said.
  const ComputeProfile half = profile_from_trace_text(two_rank_trace(0, 300), "half.json", o);
  CHECK(warned(half.warnings,
               "--peers traced: in half.json the same collectives end 0.3 ms "
               "later on rank 1 than on rank 0 (median of 2), 51 % of the median "
               "step (0.59 ms): a waiting thread woken late on a busy machine, or "
               "a clock offset"));
  CHECK(warned(profile_from_trace_text(two_rank_trace(0, 300), "half.json", from_rank1).warnings,
               "end 0.3 ms earlier on rank 0 than on rank 1"));
  // One clock, rank 1 late by 0.03 ms: nothing to say.
  CHECK_FALSE(
      warned(profile_from_trace_text(two_rank_trace(30, 0), "late.json", o).warnings, "--peers"));
}

TEST_CASE("trace profile: a real two-rank trace has one clock, half a step's shift has not") {
  TempDir dir;
  const std::string trace = dir.file("two.json");
  write_two_rank_trace(trace);
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    CHECK_NOTHROW(profile_from_trace(trace, {.rank = rank, .peers = true}));
  }
  const ComputeProfile p = profile_from_trace(trace, {});
  REQUIRE(p.measured.has_value());
  // Rank 1's times moved by half the median step, either way.
  for (const double sign : {1.0, -1.0}) {
    CAPTURE(sign);
    nlohmann::json doc = nlohmann::json::parse(slurp(trace));
    for (auto& e : doc["traceEvents"]) {
      if (e["pid"] == 1 && e.contains("ts")) {
        e["ts"] = e["ts"].get<double>() + sign * p.measured->step_ms * 500.0;
      }
    }
    CHECK_THROWS_WITH_AS(profile_from_trace_text(doc.dump(), "shifted.json", {.peers = true}),
                         doctest::Contains("the ranks' clocks differ"), SimError);
    // Without the peers the clocks do not matter.
    CHECK_NOTHROW(profile_from_trace_text(doc.dump(), "shifted.json", {}));
  }
}

// An outside tester: a step's backward spans moved onto its forward's start (backward beside
// forward on one thread) was predicted as if fine.
TEST_CASE("trace profile: forward, backward and optimizer spans that overlap are refused") {
  // Step 2 of the hand-made trace (t0 = 1000): its forward is event 10 (1010-1110), "backward
  // embed" event 11 (1110-1200), the optimizer step event 17 (1500-1600).
  const std::string trace = marker_trace({});
  CHECK_NOTHROW(profile_from_trace_text(trace, "m.json", {}));
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(replaced(trace, R"("ts":1110,)", R"("ts":1010,)"), "m.json", {}),
      doctest::Contains("m.json: event 11 ('backward embed', ts 1010.000 us) starts 100.000 us "
                        "before event 10 ('forward', ts 1010.000 us, dur 100.000 us) ends, on "
                        "rank 0's compute thread in step 2"),
      SimError);
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(replaced(trace, R"("ts":1500,)", R"("ts":1350,)"), "m.json", {}),
      doctest::Contains("event 17 ('optimizer step', ts 1350.000 us) starts 50.000 us before "
                        "event 16 ('backward sum'"),
      SimError);
  // A real trace: every backward span of rank 0's third step moved onto its forward's start.
  TempDir dir;
  const std::string real = dir.file("two.json");
  write_two_rank_trace(real);
  CHECK_NOTHROW(profile_from_trace(real, {.peers = true}));
  nlohmann::json doc = nlohmann::json::parse(slurp(real));
  int forwards = 0;
  double forward_ts = 0;
  for (auto& e : doc["traceEvents"]) {
    if (e["pid"] != 0 || e["ph"] != "X") continue;
    const std::string name = e["name"];
    if (name == "forward" && ++forwards == 3) forward_ts = e["ts"];
    if (forwards == 3 && name.rfind("backward ", 0) == 0) e["ts"] = forward_ts;
  }
  REQUIRE(forward_ts > 0);
  CHECK_THROWS_WITH_AS(profile_from_trace_text(doc.dump(), "moved.json", {}),
                       doctest::Contains("on rank 0's compute thread in step 3; nanoddp-train "
                                         "runs forward, each backward node and the optimizer "
                                         "step one after another there"),
                       SimError);
}

// An outside tester's errors that blamed the wrong thing.
TEST_CASE("trace profile: an error names what is wrong with the file or the event") {
  TempDir dir;
  // Rank 0's spans cut out, its run_config kept: it said no step remained after --skip-steps.
  nlohmann::json doc = nlohmann::json::parse(two_rank_trace(0, 0));
  auto& events = doc["traceEvents"];
  events.erase(std::remove_if(events.begin(), events.end(),
                              [](const nlohmann::json& e) { return e["pid"] == 0; }),
               events.end());
  events.insert(events.begin(),
                nlohmann::json::parse(R"({"name":"run_config","ph":"M","pid":0,"args":{}})"));
  CHECK_THROWS_WITH_AS(profile_from_trace_text(doc.dump(), "cut.json", {.shape = kShape}),
                       doctest::Contains("cut.json: rank 0 has no events, only metadata (\"ph\": "
                                         "\"M\"); the trace holds the spans of rank(s) 1"),
                       SimError);
  CHECK_NOTHROW(profile_from_trace_text(doc.dump(), "cut.json", {.shape = kShape, .rank = 1}));

  // A UNIX socket: open() fails with "No such device or address".
  const std::string socket_path = dir.file("sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  REQUIRE(socket_path.size() < sizeof(address.sun_path));
  std::copy(socket_path.begin(), socket_path.end(), address.sun_path);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0);
  CHECK_THROWS_WITH_AS(
      profile_from_trace(socket_path, {}),
      doctest::Contains(("--profile " + socket_path + ": not a regular file (a socket)").c_str()),
      SimError);
  ::close(fd);

  // NUL bytes: inside the text they read as "unexpected end of input", after it they were
  // ignored.
  const std::string good = marker_trace({});
  for (const std::size_t at : {std::size_t{40}, good.size()}) {
    CAPTURE(at);
    std::string damaged = good;
    damaged.insert(at, std::string(3, '\0'));
    const std::string path = dir.file("nul.json");
    std::ofstream(path, std::ios::binary) << damaged;
    CHECK_THROWS_WITH_AS(
        profile_from_trace(path, {}),
        doctest::Contains(fmt::format("--profile {}: holds a NUL byte at offset {}: a binary or "
                                      "damaged file",
                                      path, at)
                              .c_str()),
        SimError);
  }

  // A marker at ts 1e300 (event 5: step 1's "grad head.proj") sorted after every step, and the
  // last step's list of markers was blamed.
  for (const char* ts : {"1e300", "-5"}) {
    CAPTURE(ts);
    const std::string bad =
        replaced(good, R"("tid":2,"ts":301,)", fmt::format(R"("tid":2,"ts":{},)", ts));
    REQUIRE(bad != good);
    CHECK_THROWS_WITH_AS(
        profile_from_trace_text(bad, "m.json", {}),
        doctest::Contains(fmt::format("m.json: event 5 ('grad head.proj') has \"ts\": {:g} us; a "
                                      "time is a steady clock's reading",
                                      std::stod(ts))
                              .c_str()),
        SimError);
  }
}

// RFC 8259 lets a parser skip a leading byte order mark; plot_trace.py refused one the simulator
// read. Both read it now.
TEST_CASE("trace profile: a trace with a UTF-8 byte order mark is read as without") {
  TempDir dir;
  const std::string path = dir.file("bom.json");
  std::ofstream(path, std::ios::binary) << "\xEF\xBB\xBF" << marker_trace({15, 1000});
  const ComputeProfile with = profile_from_trace(path, {});
  const ComputeProfile without = profile_from_trace_text(marker_trace({15, 1000}), "m.json", {});
  REQUIRE(with.grads.size() == without.grads.size());
  CHECK(with.numel() == without.numel());
  REQUIRE(with.measured.has_value());
  CHECK(with.measured->step_ms == without.measured->step_ms);
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
      doctest::Contains("no numeric \"ts\""), SimError);
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(
          R"({"traceEvents": [{"name": "forward", "ph": "X", "pid": 0, "ts": 0}]})", "t.json", o),
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

  // Updates inside backward (--optimizer-in-backward) are named as such, not as a missing step.
  std::string in_backward = events;
  for (int step = 0; step < 4; ++step) {
    in_backward +=
        fmt::format(R"(,{{"name":"optimizer update","ph":"X","pid":0,"tid":0,"ts":{},"dur":5}})",
                    step * 1000.0 + 90);
  }
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(R"({"traceEvents": [)" + in_backward + "]}", "t.json", o),
      doctest::Contains("traced with --optimizer-in-backward"), SimError);
}

// An outside tester: a trace of a --comm-hook bf16 run was predicted at 4 bytes per element
// without a word. The profile is compute, so another hook is allowed, but said.
TEST_CASE("trace profile: a bf16-hook trace predicted without the hook is said") {
  TempDir dir;
  const std::string trace = dir.file("bf16.json");
  write_two_rank_trace(trace, {"--comm-hook", "bf16"});
  CHECK(profile_from_trace(trace, {.shape = kShape}).comm_hook ==
        std::optional<std::string>("bf16"));
  const std::vector<std::string> args = {"--profile",       trace, "--in",     "16", "--out",   "4",
                                         "--hidden",        "96",  "--layers", "2",  "--nodes", "1",
                                         "--gpus-per-node", "2"};
  const ProcessResult plain = sim(args);
  REQUIRE_MESSAGE(plain.exit_code == 0, plain.output);
  CHECK_MESSAGE(plain.output.find("its all-reduces ran the comm hook 'bf16', but --comm-hook is "
                                  "'allreduce': the buckets are priced at 4 bytes per element") !=
                    std::string::npos,
                plain.output);
  std::vector<std::string> hooked = args;
  hooked.insert(hooked.end(), {"--comm-hook", "bf16"});
  const ProcessResult same = sim(hooked);
  REQUIRE_MESSAGE(same.exit_code == 0, same.output);
  CHECK(same.output.find("ran the comm hook") == std::string::npos);
}

// An outside tester: /dev/zero was read until the machine ran out of memory, a FIFO blocked
// the simulator for ever, a folder was "not valid JSON", and a pid of 2^32 was read as rank 0.
TEST_CASE("trace profile: only a regular file of bounded size is read, pids are ranks") {
  const TraceProfileOptions o{.shape = kShape};
  TempDir dir;
  const std::string fifo = dir.file("fifo"), big = dir.file("big.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
           {"/dev/zero", "a character device"}, {fifo, "a FIFO"}, {dir.path(), "a folder"}}) {
    CAPTURE(path);
    CHECK_THROWS_WITH_AS(
        profile_from_trace(path, o),
        doctest::Contains(("--profile " + path + ": not a regular file (" + kind).c_str()),
        SimError);
  }
  // A sparse file one byte past the bound: refused by its size, before a byte is read.
  { std::ofstream(big) << "{"; }
  std::filesystem::resize_file(big, kMaxInputBytes + 1);
  CHECK_THROWS_WITH_AS(
      profile_from_trace(big, o),
      doctest::Contains(fmt::format("{} bytes, more than the", kMaxInputBytes + 1).c_str()),
      SimError);
  for (const char* pid : {"4294967296", "4294967297", "4611686018427387904", "-1"}) {
    CAPTURE(pid);
    CHECK_THROWS_WITH_AS(
        profile_from_trace_text(fmt::format(R"({{"traceEvents": [{{"name": "forward", "ph": "X",)"
                                            R"("pid": {}, "tid": 0, "ts": 0, "dur": 1}}]}})",
                                            pid),
                                "t.json", o),
        doctest::Contains(fmt::format("has \"pid\" {}, which is no rank", pid).c_str()), SimError);
  }
}

// A second outside tester: plot_trace.py refused these run_config values, the simulator read
// on. The two readers of one file agree now.
TEST_CASE("trace profile: run_config is checked as plot_trace.py checks it") {
  const TraceProfileOptions o{.shape = kShape};
  const auto with_config = [](const std::string& args, int copies = 1) {
    std::string events;
    for (int k = 0; k < copies; ++k) {
      events += fmt::format(R"({{"name":"run_config","ph":"M","pid":0,"args":{{{}}}}},)", args);
    }
    return R"({"traceEvents": [)" + events +
           R"({"name": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 1}]})";
  };
  for (const auto& [args, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"("batch":8,"first_step":0)", "has first_step 0, not a count from 1"},
           {R"("batch":8,"first_step":-5)", "has first_step -5, not a count from 1"},
           {R"("batch":8,"grad_accum":0)", "has grad_accum 0, not a count from 1"},
           {R"("batch":0)", "has batch 0, not a count from 1"},
           {R"("batch":8,"first_step":"x")", "\"first_step\": \"x\", not a whole number"},
           {R"("batch":8,"first_step":5,"last_step":3)", "has last_step 3 before first_step 5"},
           {R"("batch":8,"grad_accum":2)", "a trace of --grad-accum 2 (its run_config)"}}) {
    CAPTURE(args);
    CHECK_THROWS_WITH_AS(profile_from_trace_text(with_config(args), "t.json", o),
                         doctest::Contains(expected.c_str()), SimError);
  }
  CHECK_THROWS_WITH_AS(profile_from_trace_text(with_config(R"("batch":8)", 2), "t.json", o),
                       doctest::Contains("event 1 is a second 'run_config'"), SimError);
}

// nanoddp-train writes T.rankR.partial.json, a rank's own events, when a run stops inside its
// traced steps; the step it stopped in has no optimizer step. It was refused for that, blamed on
// --grad-accum or skipped (NaN) steps: said up front now, for what it is. A real one: a NaN stop
// in step 2 (the loss of --lr 1e30).
TEST_CASE("trace profile: a partial trace of a stopped run is refused for what it is") {
  TempDir dir;
  std::vector<std::string> args = train_args(dir.file("n.json"));
  args.insert(args.end(), {"--optimizer", "sgd", "--lr", "1e30", "--log-every", "1"});
  const ProcessResult run = run_process(args, quick());
  INFO(run.output);
  REQUIRE(run.exit_code != 0);
  const std::string partial = dir.file("n.rank0.partial.json");
  REQUIRE(std::filesystem::is_regular_file(partial));
  const ProcessResult r = sim({"--profile", partial, "--gpus-per-node", "2"});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  const std::string expected =
      partial +
      ": a partial trace (its run_config says \"partial\": true): the events of rank 0 of 1 "
      "alone, written when the run stopped in step 2, which it holds cut short; not a whole run "
      "to profile. Profile the trace of a run that finished its --trace-steps";
  CHECK(r.output.find(expected) != std::string::npos);
  CHECK(r.output.find("optimizer step") == std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);  // one line
  // Up front: before what else its run_config or spans would be refused for.
  const std::string grad_accum =
      R"({"traceEvents": [{"name":"run_config","ph":"M","pid":1,"args":{"batch":8,)"
      R"("grad_accum":2,"first_step":1,"last_step":3,"restart":0,"partial":true,"rank":1,)"
      R"("world_size":4,"stopped_in_step":3}},)"
      R"({"name": "reduce-scatter bucket 0", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]})";
  CHECK_THROWS_WITH_AS(profile_from_trace_text(grad_accum, "g.json", {.rank = 1}),
                       doctest::Contains("g.json: a partial trace (its run_config says "
                                         "\"partial\": true): the events of rank 1 of 4 alone, "
                                         "written when the run stopped in step 3"),
                       SimError);
}

// The same spans with --zero-overlap-gather got through the ZeRO refusal (an outside tester's),
// and the prediction took the gathers for "other" time.
TEST_CASE("trace profile: every ZeRO span is refused, the overlapped all-gather's too") {
  const TraceProfileOptions o{.shape = kShape};
  for (const char* span : {"all-gather bucket 0", "wait for all-gather", "launch all-gathers",
                           "all-gather parameters", "reduce-scatter bucket 1"}) {
    CAPTURE(span);
    CHECK_THROWS_WITH_AS(
        profile_from_trace_text(fmt::format(R"({{"traceEvents": [{{"name": "{}", "ph": "X",)"
                                            R"("pid": 0, "tid": 1, "ts": 0, "dur": 1}}]}})",
                                            span),
                                "t.json", o),
        doctest::Contains(
            fmt::format("a ZeRO trace (nanoddp-train --zero: event 0 is '{}')", span).c_str()),
        SimError);
  }
}

TEST_CASE("trace profile: element counts are whole, bounded and summed without wrapping") {
  const std::string trace = marker_trace({});
  // 2^62 and 2^63 - 1 used to wrap the parameter count (0 or -8 elements, an absurd step).
  for (const char* huge : {R"("4611686018427387904")", "9223372036854775807",
                           R"("99999999999999999999999")", "18446744073709551615"}) {
    CAPTURE(huge);
    const std::string message =
        "('grad head.proj') has \"numel\": " + std::string(huge) + ", more than 2^40";
    CHECK_THROWS_WITH_AS(
        profile_from_trace_text(
            replaced(trace, R"("numel":"1000")", fmt::format(R"("numel":{})", huge)), "m.json", {}),
        doctest::Contains(message.c_str()), SimError);
  }
  // A fraction (or any float) is no element count; nor is text after the digits.
  for (const char* bad : {"8.5", "1000.0", "2e+18", R"("1000x")", R"("-3")", "null"}) {
    CAPTURE(bad);
    const std::string message = std::string("has \"numel\": ") + bad + ", not a whole number";
    CHECK_THROWS_WITH_AS(
        profile_from_trace_text(
            replaced(trace, R"("numel":"1000")", fmt::format(R"("numel":{})", bad)), "m.json", {}),
        doctest::Contains(message.c_str()), SimError);
  }
  // A JSON integer is read as the string nanoddp-train writes.
  CHECK(
      profile_from_trace_text(replaced(trace, R"("numel":"1000")", R"("numel":1000)"), "m.json", {})
          .numel() == 1015);
  // Each marker within the bound, their sum past it: refused, not wrapped.
  const std::string each = std::to_string(std::int64_t{1} << 40);
  const std::string big =
      replaced(replaced(replaced(trace, R"("numel":"1000")", R"("numel":")" + each + "\""),
                        R"("numel":"10")", R"("numel":")" + each + "\""),
               R"("numel":"5")", R"("numel":")" + each + "\"");
  CHECK_THROWS_WITH_AS(profile_from_trace_text(big, "m.json", {}),
                       doctest::Contains("more than 2^40 (1099511627776) gradient elements in all"),
                       SimError);
  // An all-reduce span's elements: the same bound, and not negative.
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(
          replaced(marker_trace({15, 1000}), R"("elements":"1000")", R"("elements":"-1000")"),
          "m.json", {}),
      doctest::Contains("\"elements\": \"-1000\", not a whole number"), SimError);
}

TEST_CASE("trace profile: a span longer than a day, or steps of no time, are no run's") {
  // dur 1e300 us used to print a 300-digit step.
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(replaced(marker_trace({}), R"("dur":100})", R"("dur":1e300})"),
                              "m.json", {}),
      doctest::Contains("('forward') lasts 1e+300 us, more than a day (8.64e+10 us)"), SimError);
  // Spans of sane length, but a step that ends 1e15 us after it starts (below 2^53 us, the
  // bound on any time).
  CHECK_THROWS_WITH_AS(
      profile_from_trace_text(replaced(marker_trace({}), R"("ts":2500,)", R"("ts":1e15,)"),
                              "m.json", {}),
      doctest::Contains("step 3 of rank 0 runs 1e+12 ms"), SimError);
  // Every event at one moment and of no length: step 0 ms, efficiency 0 % on one GPU before.
  nlohmann::json zero = nlohmann::json::parse(marker_trace({15, 1000}));
  for (auto& e : zero["traceEvents"]) {
    e["ts"] = 1.0;
    if (e.contains("dur")) e["dur"] = 0.0;
  }
  CHECK_THROWS_WITH_AS(profile_from_trace_text(zero.dump(), "zero.json", {}),
                       doctest::Contains("the median step of rank 0 lasts 0 ms"), SimError);
}

TEST_CASE(
    "trace profile: the trace records its batch, and a baseline of another batch is refused") {
  TempDir dir;
  const auto traced = [&](const std::string& file, const std::string& batch) {
    std::vector<std::string> args = train_args(dir.file(file));
    const auto at = std::find(args.begin(), args.end(), "--batch");
    REQUIRE(at != args.end());
    *(at + 1) = batch;
    const ProcessResult run = run_process(args, quick());
    REQUIRE_MESSAGE(run.exit_code == 0, run.output);
    return dir.file(file);
  };
  const std::string b16 = traced("b16.json", "16"), b8 = traced("b8.json", "8");
  const ComputeProfile p = profile_from_trace(b16, {});
  REQUIRE(p.batch.has_value());
  CHECK(*p.batch == 16);
  CHECK(p.source.find("batch 16 per rank") != std::string::npos);
  CHECK(p.warnings.empty());
  const auto simulate = [&](const std::string& baseline) {
    return run_process({bin_path("nanoddp-sim"), "--profile", b16, "--baseline-profile", baseline,
                        "--gpus-per-node", "2"});
  };
  // Batch 8 as the baseline of a batch-16 profile was taken silently (another efficiency).
  const ProcessResult other = simulate(b8);
  CAPTURE(other.output);
  CHECK(other.exit_code == 2);
  CHECK(other.output.find("--baseline-profile " + b8 +
                          ": traced at batch 8 per rank, but "
                          "--profile " +
                          b16 + " at batch 16") != std::string::npos);
  const ProcessResult same = simulate(b16);
  CHECK_MESSAGE(same.exit_code == 0, same.output);
  CHECK(same.output.find("cannot be checked") == std::string::npos);
  // A trace from before the record: taken, with a warning that the batch is unchecked.
  nlohmann::json old;
  {
    std::ifstream in(b8);
    old = nlohmann::json::parse(in);
  }
  auto& events = old["traceEvents"];
  events.erase(std::remove_if(events.begin(), events.end(),
                              [](const nlohmann::json& e) { return e["name"] == "run_config"; }),
               events.end());
  const std::string unrecorded = dir.file("old.json");
  std::ofstream(unrecorded) << old.dump();
  const ProcessResult warned = simulate(unrecorded);
  CHECK_MESSAGE(warned.exit_code == 0, warned.output);
  CHECK(warned.output.find("warning: --baseline-profile " + unrecorded +
                           ": the batch of "
                           "--baseline-profile " +
                           unrecorded + " is not recorded") != std::string::npos);
}

TEST_CASE("trace profile: an older 1-rank trace says its shape cannot be checked") {
  // No markers, no all-reduce spans: only the count of "backward linear" spans checks the flags.
  std::string events;
  for (int step = 0; step < 6; ++step) {
    const double t0 = step * 1000.0;
    const auto add = [&](const std::string& name, double ts, double dur) {
      if (!events.empty()) events += ",";
      events += fmt::format(R"({{"name":"{}","ph":"X","pid":0,"tid":0,"ts":{},"dur":{}}})", name,
                            t0 + ts, dur);
    };
    add("forward", 10, 100);
    for (int k = 0; k < 3; ++k) add("backward linear", 110 + 100 * k, 90);
    add("optimizer step", 500, 100);
  }
  const std::string trace = R"({"traceEvents": [)" + events + "]}";
  const ComputeProfile p = profile_from_trace_text(trace, "old.json", {.shape = kShape});
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("--profile old.json: an older trace (no \"grad\" markers, no "
                           "all-reduce spans)") != std::string::npos);
  CHECK(p.warnings[0].find("hidden=96") != std::string::npos);
  // With markers the parameters are the trace's own: nothing to warn about (but 2 kept steps).
  const auto warnings = profile_from_trace_text(marker_trace({}), "m.json", {}).warnings;
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("older trace") == std::string::npos);
  CHECK(warnings[0].find("--profile m.json: 2 step(s) of rank 0 kept after --skip-steps 1") !=
        std::string::npos);
  CHECK(profile_from_trace_text(marker_trace({}), "m.json", {.skip_steps = 0}).warnings.size() ==
        1);
}
