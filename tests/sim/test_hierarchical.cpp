// The hierarchical all-reduce's model (comm/hierarchical_allreduce.cpp, phase by phase), the
// shared-memory contention factor and the measured-cores rule, worked out by hand; the
// topology refusals and a fitted prediction through the real executable.

#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "benchmarks/sim/error.h"
#include "benchmarks/sim/network_model.h"
#include "benchmarks/sim/step_model.h"
#include "sim/sim_runs.h"
#include "support/subprocess.h"

using namespace nanoddp::sim;
using namespace nanoddp::testing;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Within a host (2 ranks): 2 steps of 5 us, 10 GB/s -> within(s) = 0.010 + s / 1e7 ms.
Fabric shm_fabric() {
  return {.name = "shm",
          .intra_bw_gbs = 10.0,
          .intra_lat_us = 5.0,
          .inter_bw_gbs = 10.0,
          .inter_lat_us = 5.0};
}
// Among 2 leaders: 2 steps of 20 us, 1 GB/s -> across(s) = 0.040 + s / 1e6 ms.
Fabric tcp_fabric() {
  return {.name = "tcp",
          .intra_bw_gbs = 1.0,
          .intra_lat_us = 20.0,
          .inter_bw_gbs = 1.0,
          .inter_lat_us = 20.0};
}
double within(double s) {
  return 0.010 + s / 1e7;
}
double across(double s) {
  return 0.040 + s / 1e6;
}

const Cluster kTwoByTwo{.nodes = 2, .gpus_per_node = 2};

ComputeProfile one_rank_profile() {
  ComputeProfile p;
  p.source = "hand-made";
  p.grads.push_back({"bias", 1, 1.0});
  p.grads.push_back({"weight", 262143, 0.0});  // 1 MiB of float32 in all
  p.forward_ms = 2.0;
  p.optimizer_ms = 0.5;
  p.other_ms = 0.25;
  p.measured = MeasuredStep{.world_size = 1};
  return p;
}

// nanoddp-bench-allreduce rows on exactly the line T(S) = a_us + S / bytes_per_us.
void write_fit(const std::string& path, int ranks, double a_us, double bytes_per_us) {
  std::ofstream out(path);
  for (double s = 256 * 1024; s <= 16 * kMiB; s *= 2) {
    out << nlohmann::json{{"benchmark", "allreduce"},
                          {"ranks", ranks},
                          {"bytes", s},
                          {"time_us", a_us + s / bytes_per_us}}
               .dump()
        << "\n";
  }
}

}  // namespace

TEST_CASE("hierarchical: one piece is within + across + status + back, by hand") {
  // 1 MiB: one 4 MiB piece; the broadcast back is one 1 MiB sub-piece.
  const HierarchicalTime t = hierarchical_allreduce(kTwoByTwo, shm_fabric(), tcp_fabric(), kMiB);
  CHECK(t.pieces == 1);
  CHECK(t.within_ms == doctest::Approx(within(kMiB)).epsilon(1e-12));
  CHECK(t.across_ms == doctest::Approx(across(kMiB)).epsilon(1e-12));
  CHECK(t.status_ms == doctest::Approx(within(4)).epsilon(1e-12));
  CHECK(t.back_ms == doctest::Approx(within(kMiB)).epsilon(1e-12));
  CHECK(t.ms ==
        doctest::Approx(within(kMiB) + across(kMiB) + within(4) + within(kMiB)).epsilon(1e-12));
  // The same fabric for both levels through allreduce_time().
  const Fabric f = shm_fabric();
  CHECK(allreduce_time(kTwoByTwo, f, Algorithm::kHierarchical, kMiB).ms ==
        doctest::Approx(hierarchical_allreduce(kTwoByTwo, f, f, kMiB).ms).epsilon(1e-12));
  CHECK(allreduce_time(kTwoByTwo, f, Algorithm::kHierarchical, kMiB).algorithm ==
        Algorithm::kHierarchical);
}

TEST_CASE("hierarchical: two pieces pipeline the leaders' ring behind the host, by hand") {
  // 6 MiB: pieces of 4 and 2 MiB. The worker reduces both within the host (w0, w1); the ring
  // carries piece 0 from w0 and piece 1 once both it and piece 0 are done (x0, x1); status and
  // back (4 and 2 sub-pieces of 1 MiB) follow on the worker, each after its piece's ring.
  const double w0 = within(4 * kMiB);
  const double w1 = w0 + within(2 * kMiB);
  const double x0 = w0 + across(4 * kMiB);
  const double x1 = std::max(w1, x0) + across(2 * kMiB);
  const double t0 = std::max(w1, x0) + within(4) + 4 * within(kMiB);
  const double t1 = std::max(t0, x1) + within(4) + 2 * within(kMiB);
  const HierarchicalTime t =
      hierarchical_allreduce(kTwoByTwo, shm_fabric(), tcp_fabric(), 6 * kMiB);
  CHECK(t.pieces == 2);
  CHECK(t.ms == doctest::Approx(t1).epsilon(1e-12));
  CHECK(t.across_ms == doctest::Approx(across(4 * kMiB) + across(2 * kMiB)).epsilon(1e-12));
  CHECK(t.back_ms == doctest::Approx(6 * within(kMiB)).epsilon(1e-12));
  // The pipeline hides part of the phases: shorter than running them one after another.
  CHECK(t.ms < t.within_ms + t.across_ms + t.status_ms + t.back_ms);
}

TEST_CASE("hierarchical: nanoddp's topology rules (several hosts, several ranks each)") {
  for (const Cluster c :
       {Cluster{.nodes = 1, .gpus_per_node = 4}, Cluster{.nodes = 4, .gpus_per_node = 1}}) {
    CHECK_THROWS_WITH_AS(hierarchical_allreduce(c, shm_fabric(), tcp_fabric(), kMiB),
                         doctest::Contains("--algo hier"), SimError);
  }
  CHECK(parse_algorithm("hier") == Algorithm::kHierarchical);
  CHECK(std::string(algorithm_name(Algorithm::kHierarchical)) == "hier");
}

TEST_CASE("hierarchical: the step model uses the leaders' fabric for step 2, bf16 hook included") {
  StepOptions o{.cluster = kTwoByTwo,
                .fabric = shm_fabric(),
                .algorithm = Algorithm::kHierarchical,
                .bucket_cap_mb = 25.0,
                .first_bucket_mb = 25.0};
  o.inter_fabric = tcp_fabric();
  const StepPrediction p = predict_step(one_rank_profile(), o);
  REQUIRE(p.buckets.size() == 1);
  CHECK(p.collectives[0].ms ==
        doctest::Approx(within(kMiB) + across(kMiB) + within(4) + within(kMiB)).epsilon(1e-12));
  // The bf16 hook: half the bytes through every phase (the buffer is bf16 on the host and
  // across).
  StepOptions bf16 = o;
  bf16.grad_bytes = 2;
  const double half = kMiB / 2;
  CHECK(predict_step(one_rank_profile(), bf16).collectives[0].ms ==
        doctest::Approx(within(half) + across(half) + within(4) + within(half)).epsilon(1e-12));
  // The sync all-reduce (2n floats = 32 bytes) takes the same path.
  CHECK(p.sync_ms ==
        doctest::Approx(within(32) + across(32) + within(4) + within(32)).epsilon(1e-12));
}

TEST_CASE("contention: compute runs F times slower on a node of several ranks, by hand") {
  const ComputeProfile profile = one_rank_profile();
  StepOptions o{.cluster = {.nodes = 1, .gpus_per_node = 2}, .fabric = shm_fabric()};
  o.sync_allreduce = false;
  o.overlap = false;
  const StepPrediction plain = predict_step(profile, o);
  o.mem_contention = 1.5;
  const StepPrediction slow = predict_step(profile, o);
  CHECK(slow.forward_ms == doctest::Approx(3.0));
  CHECK(slow.backward_ms == doctest::Approx(1.5));
  CHECK(slow.optimizer_ms == doctest::Approx(0.75));
  CHECK(slow.other_ms == doctest::Approx(0.375));
  CHECK(slow.step_ms - plain.step_ms == doctest::Approx(0.5 * (2.0 + 1.0 + 0.5 + 0.25)));
  // The communication is not slowed, and the 1-rank baseline is one process alone.
  CHECK(slow.comm_ms == doctest::Approx(plain.comm_ms));
  CHECK(slow.single_gpu_step_ms == doctest::Approx(plain.single_gpu_step_ms));
  // With --cores the factor multiplies the fair share: 3 ranks on 2 cores, F = 1.5.
  o.cluster.gpus_per_node = 3;
  o.cores = 2;
  const ReplayRates r = sharing_rates(profile, o);
  CHECK(r.compute_alone == doctest::Approx(2.0 / 3 / 1.5));
  CHECK(r.compute_shared == doctest::Approx(1.0 / 3 / 1.5));
  // One rank per node shares no memory: no effect.
  o.cluster = {.nodes = 2, .gpus_per_node = 1};
  o.cores = 0;
  CHECK(sharing_rates(profile, o).compute_alone == 1.0);
  // The optimizer's own factor replaces F for the optimizer step only.
  StepOptions opt = o;
  opt.cluster = {.nodes = 1, .gpus_per_node = 2};
  opt.cores = 0;
  opt.opt_contention = 2.0;
  const StepPrediction streamed = predict_step(profile, opt);
  CHECK(streamed.optimizer_ms == doctest::Approx(1.0));
  CHECK(streamed.forward_ms == doctest::Approx(3.0));
  opt.mem_contention = 1.0;
  CHECK(predict_step(profile, opt).forward_ms == doctest::Approx(2.0));
  CHECK(predict_step(profile, opt).optimizer_ms == doctest::Approx(1.0));
  // A profile traced on several ranks already holds the contention: refused.
  ComputeProfile traced = profile;
  traced.measured = MeasuredStep{.world_size = 2};
  o.cluster = {.nodes = 1, .gpus_per_node = 2};
  CHECK_THROWS_WITH_AS(predict_step(traced, o), doctest::Contains("already ran beside"), SimError);
  o.mem_contention = 0.5;
  CHECK_THROWS_WITH_AS(predict_step(profile, o), doctest::Contains("--mem-contention"), SimError);
}

TEST_CASE("measured cores: inputs measured on the whole host, nodes of half its cores") {
  // 2 namespaced nodes of 2 ranks on one 2-core host: each node has 1 core. The profile (1
  // rank) and the fits (2 ranks) were measured on the 2 cores: compute alone at share(1 core,
  // 2) / share(2 cores, 1) = 1/2, collectives alone at share(1, 2) / share(2, 2) = 1/2.
  StepOptions o{.cluster = kTwoByTwo, .fabric = shm_fabric(), .cores = 1, .network_ranks = 2};
  o.measured_cores = 2;
  const ReplayRates r = sharing_rates(one_rank_profile(), o);
  CHECK(r.compute_alone == doctest::Approx(0.5));
  CHECK(r.compute_shared == doctest::Approx(0.25));
  CHECK(r.comm_alone == doctest::Approx(0.5));
  CHECK(r.comm_shared == doctest::Approx(0.25));
  // The hierarchical all-reduce keeps one more communication thread per node busy: the leaders'
  // ring beside its worker (2 x 2 measured runs: buckets 3.2x their fits alone, 6.5x beside
  // backward, where 2 threads per node predicted 2x and 4x). Alone: share(1, 3) = 1/3; beside
  // backward, 2 compute + 3 communication threads: 1/5, for both.
  o.algorithm = Algorithm::kHierarchical;
  const ReplayRates h = sharing_rates(one_rank_profile(), o);
  CHECK(comm_threads(o) == 3);
  CHECK(h.compute_alone == doctest::Approx(0.5));
  CHECK(h.compute_shared == doctest::Approx(0.2));
  CHECK(h.comm_alone == doctest::Approx(1.0 / 3));
  CHECK(h.comm_shared == doctest::Approx(0.2));
  o.algorithm = StepOptions{}.algorithm;
  CHECK(comm_threads(o) == 2);
  // Measured on the node's own core, the fit already ran at half a core: as fitted.
  o.measured_cores = 0;
  CHECK(sharing_rates(one_rank_profile(), o).comm_alone == doctest::Approx(1.0));
  o.cores = 0;
  o.measured_cores = 2;
  CHECK_THROWS_WITH_AS(predict_step(one_rank_profile(), o), doctest::Contains("--cores"), SimError);
}

TEST_CASE("measured cores: the leaders' fit ran one rank per host, at a core of its own") {
  // --cores 1 on 2 x 2 (an outside tester's case): the intra fit ran 2 ranks on the core
  // (share 1/2), the leaders' fit 1 rank per host (share 1). Simulated, a collective alone runs
  // 3 threads on the core (1/3): the within phases 1.5x their fit, the leaders' ring 3x its fit.
  // One rate for the whole all-reduce gave the ring 1.5x: twice too fast.
  StepOptions o{.cluster = kTwoByTwo,
                .fabric = shm_fabric(),
                .algorithm = Algorithm::kHierarchical,
                .bucket_cap_mb = 25.0,
                .first_bucket_mb = 25.0,
                .overlap = false,
                .sync_allreduce = false,
                .cores = 1,
                .network_ranks = 2};
  o.inter_fabric = tcp_fabric();
  o.inter_network_ranks = 1;
  CHECK(across_scale(o) == doctest::Approx(2.0));
  const StepPrediction p = predict_step(one_rank_profile(), o);
  REQUIRE(p.buckets.size() == 1);
  // One piece: the phases add up; the all-reduce runs alone after backward (overlap off).
  const double fit_within = within(kMiB) + within(4) + within(kMiB);
  CHECK(p.exposed_comm_ms == doctest::Approx(1.5 * fit_within + 3.0 * across(kMiB)).epsilon(1e-9));
  CHECK(p.collectives[0].ms == doctest::Approx(fit_within + 2.0 * across(kMiB)).epsilon(1e-12));
  // Both fits on cores enough for their threads (2 cores measured): one share, no scale.
  o.measured_cores = 2;
  CHECK(across_scale(o) == doctest::Approx(1.0));
  // A named leaders' fabric is not CPU work: its time is not scaled either.
  o.measured_cores = 0;
  o.inter_network_ranks = 0;
  CHECK(across_scale(o) == doctest::Approx(1.0));
  o.inter_network_ranks = -1;
  CHECK_THROWS_WITH_AS(predict_step(one_rank_profile(), o),
                       doctest::Contains("inter_network_ranks"), SimError);
}

TEST_CASE("hierarchical cli: a fitted 2 x 2 prediction is the phases of the two lines") {
  TempDir dir;
  // Shared memory on 2 ranks: T = 10 us + S / 1000 bytes/us (1 GB/s, read as a 2-rank ring);
  // TCP between 2 leaders: T = 100 us + S / 100 bytes/us.
  const std::string intra = dir.file("shm-2.jsonl"), inter = dir.file("tcp-2.jsonl");
  write_fit(intra, 2, 10.0, 1000.0);
  write_fit(inter, 2, 100.0, 100.0);
  const std::string out = dir.file("sim.json");
  // 4 x Linear(256) at 1 MiB first bucket: the buckets are whatever the Reducer's rule cuts;
  // each one's all-reduce must be the phases of its bytes.
  const ProcessResult r =
      sim({"--model",         "mlp", "--hidden", "256",  "--layers",    "3",   "--nodes",     "2",
           "--gpus-per-node", "2",   "--algo",   "hier", "--fit-intra", intra, "--fit-inter", inter,
           "--fit-min-bytes", "1",   "--json",   out});
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto w = [](double s) { return (10.0 + s / 1000.0) / 1000.0; };
  const auto x = [](double s) { return (100.0 + s / 100.0) / 1000.0; };
  REQUIRE(!j["buckets"].empty());
  for (const auto& b : j["buckets"]) {
    const double s = b["bytes"].get<double>();
    REQUIRE(s <= kMiB);  // one piece, one broadcast sub-piece
    CHECK(b["algo"] == "hier");
    CHECK(b["allreduce_ms"].get<double>() ==
          doctest::Approx(w(s) + x(s) + w(4) + w(s)).epsilon(1e-6));
  }
  CHECK(j["inter_fabric"]["name"] == "fitted");
  CHECK(j["options"]["inter_network_ranks"] == 1);
  CHECK(j["rates"]["comm_threads"] == 3);
  // On one core per node: the intra fit ran 2 threads there, the leaders' fit 1; the simulated
  // all-reduce runs 3. Each level's rate is against its own fit, printed and in the JSON.
  // --cores needs a CPU profile: a 1-rank trace of the same model.
  const std::string trace = dir.file("one.json");
  ProcessOptions train_options;
  train_options.timeout = std::chrono::seconds(120);
  const ProcessResult train =
      run_process({bin_path("nanoddp-train"), "--hidden", "256", "--layers", "3", "--steps", "4",
                   "--trace", trace, "--trace-steps", "4", "--quiet"},
                  train_options);
  REQUIRE_MESSAGE(train.exit_code == 0, train.output);
  const ProcessResult one_core =
      sim({"--profile",       trace, "--hidden", "256",  "--layers",    "3",   "--nodes",     "2",
           "--gpus-per-node", "2",   "--algo",   "hier", "--fit-intra", intra, "--fit-inter", inter,
           "--fit-min-bytes", "1",   "--cores",  "1",    "--json",      out});
  REQUIRE_MESSAGE(one_core.exit_code == 0, one_core.output);
  CHECK_MESSAGE(one_core.output.find("the leaders' ring: x0.333 alone, x0.2 beside backward") !=
                    std::string::npos,
                one_core.output);
  std::ifstream again(out);
  const nlohmann::json k = nlohmann::json::parse(again);
  CHECK(k["rates"]["comm_alone"].get<double>() == doctest::Approx(2.0 / 3));
  CHECK(k["rates"]["across_alone"].get<double>() == doctest::Approx(1.0 / 3));
  CHECK(k["rates"]["across_shared"].get<double>() == doctest::Approx(0.2));
  for (const auto& b : k["buckets"]) {
    const double s = b["bytes"].get<double>();
    CHECK(b["allreduce_ms"].get<double>() ==
          doctest::Approx(w(s) + 2 * x(s) + w(4) + w(s)).epsilon(1e-6));
  }
}

TEST_CASE("hierarchical cli: topology and input refusals name the flag") {
  TempDir dir;
  const std::string shm2 = dir.file("shm-2.jsonl"), tcp4 = dir.file("tcp-4.jsonl");
  write_fit(shm2, 2, 10.0, 1000.0);
  write_fit(tcp4, 4, 100.0, 100.0);
  const std::vector<std::string> m = {"--model", "mlp", "--hidden", "256", "--layers", "2"};
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"--nodes", "1", "--gpus-per-node", "4", "--algo", "hier"}, "--nodes >= 2"},
      {{"--nodes", "4", "--gpus-per-node", "1", "--algo", "hier"}, "--gpus-per-node >= 2"},
      {{"--nodes", "2", "--gpus-per-node", "2", "--fit-intra", shm2, "--fit-inter", shm2},
       "describe the two levels of --algo hier"},
      {{"--nodes", "2", "--gpus-per-node", "2", "--algo", "hier", "--fit-intra", shm2},
       "give both --fit-intra"},
      {{"--nodes", "2", "--gpus-per-node", "2", "--algo", "hier", "--fit-allreduce", shm2},
       "a one-level fit describes the flat transport"},
      {{"--nodes", "2", "--gpus-per-node", "2", "--algo", "hier", "--fit-intra", shm2,
        "--fit-inter", shm2, "--fabric", "nvlink4-ib400"},
       "give one"},
      {{"--nodes", "2", "--gpus-per-node", "2", "--algo", "hier", "--sweep-nodes"},
       "--sweep-nodes with --algo hier"},
      // The leaders' fit must hold one rank per host: 2 here, not 4.
      {{"--nodes", "2", "--gpus-per-node", "2", "--algo", "hier", "--fit-intra", shm2,
        "--fit-inter", tcp4},
       "measured with 4 ranks"},
      {{"--mem-contention", "1.2"}, "--mem-contention models CPU ranks"},
      {{"--opt-contention", "1.2"}, "--opt-contention models CPU ranks"},
      {{"--measured-cores", "2"}, "--measured-cores needs --cores"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = m;
    args.insert(args.end(), c.args.begin(), c.args.end());
    const ProcessResult r = sim(args);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.message) != std::string::npos);
  }
  // Out of range, refused by the flag's own check.
  const ProcessResult low = sim({"--profile", "t.json", "--mem-contention", "0.5"});
  CHECK(low.exit_code == 2);
  CHECK(low.output.find("--mem-contention") != std::string::npos);
}
