// nanoddp-sim as a user runs it: the table, --json, --busbw, and exit code 2 with a message that
// names the flag for bad input.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/sim_runs.h"
#include "support/subprocess.h"

using namespace nanoddp::testing;

TEST_CASE("cli: the FLOP model on 4 nodes prints the step, the sweeps and the best cap") {
  const ProcessResult r =
      sim({"--model", "mlp", "--gpu", "h100", "--hidden", "8192", "--layers", "8", "--batch", "32",
           "--nodes", "4", "--gpus-per-node", "8", "--sweep-buckets", "--sweep-nodes"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  for (const char* expected :
       {"4 node(s) x 8 GPU(s) = 32 rank(s)", "exposed comm", "overlap", "scaling efficiency",
        "bucket-cap sweep", "best bucket cap:", "scaling (8 GPU(s) per node"}) {
    CHECK_MESSAGE(r.output.find(expected) != std::string::npos, expected, "\n", r.output);
  }
}

TEST_CASE("cli: --json holds the same figures, consistent with each other") {
  TempDir dir;
  const std::string path = dir.file("sim.json");
  const ProcessResult r =
      sim({"--model", "mlp", "--hidden", "4096", "--layers", "4", "--nodes", "2", "--gpus-per-node",
           "8", "--fabric", "nvlink3-ib200", "--sweep-buckets", "--json", path});
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  CHECK(j["cluster"]["world_size"] == 16);
  CHECK(j["fabric"]["name"] == "nvlink3-ib200");
  const auto& step = j["step"];
  const double sum = step["forward_ms"].get<double>() + step["backward_ms"].get<double>() +
                     step["exposed_comm_ms"].get<double>() + step["sync_ms"].get<double>() +
                     step["optimizer_ms"].get<double>() + step["other_ms"].get<double>();
  CHECK(step["step_ms"].get<double>() == doctest::Approx(sum));
  double comm = 0;
  for (const auto& b : j["buckets"]) comm += b["allreduce_ms"].get<double>();
  CHECK(step["comm_ms"].get<double>() == doctest::Approx(comm));
  CHECK(j["sweep"].size() >= 11);
  double best = 1e300;
  for (const auto& row : j["sweep"]) best = std::min(best, row["step_ms"].get<double>());
  bool named = false;
  for (const auto& row : j["sweep"]) {
    if (row["bucket_cap_mb"] == j["best_bucket_cap_mb"]) named = row["step_ms"] == best;
  }
  CHECK(named);

  // "-" writes the JSON alone to stdout.
  const ProcessResult only = sim({"--model", "mlp", "--nodes", "1", "--json", "-"});
  REQUIRE(only.exit_code == 0);
  CHECK(nlohmann::json::parse(only.output)["cluster"]["world_size"] == 8);
}

TEST_CASE("cli: --optimizer-in-backward on reports itself and never predicts a slower step") {
  auto step = [](const std::string& mode) {
    const ProcessResult r =
        sim({"--model", "mlp", "--hidden", "8192", "--layers", "4", "--batch", "16", "--nodes", "4",
             "--gpus-per-node", "8", "--optimizer-in-backward", mode, "--json", "-"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    return nlohmann::json::parse(r.output);
  };
  const nlohmann::json after = step("off"), in_backward = step("on");
  CHECK(after["options"]["optimizer_in_backward"] == false);
  CHECK(in_backward["options"]["optimizer_in_backward"] == true);
  // The same compute and communication; only how much of it waits differs.
  CHECK(in_backward["step"]["optimizer_ms"] == after["step"]["optimizer_ms"]);
  CHECK(in_backward["step"]["comm_ms"] == after["step"]["comm_ms"]);
  CHECK(in_backward["step"]["exposed_comm_ms"].get<double>() <=
        after["step"]["exposed_comm_ms"].get<double>());
  CHECK(in_backward["step"]["step_ms"].get<double>() <= after["step"]["step_ms"].get<double>());
}

TEST_CASE("cli: --busbw prints the network model alone") {
  const ProcessResult r = sim({"--busbw", "--nodes", "1", "--gpus-per-node", "8", "--busbw-min",
                               "8M", "--busbw-max", "8G", "--json", "-"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const nlohmann::json rows = nlohmann::json::parse(r.output);
  REQUIRE(rows.size() == 11);  // 8 MiB .. 8 GiB, doubling
  CHECK(rows.front()["bytes"] == 8.0 * 1024 * 1024);
  for (const auto& row : rows)
    CHECK(row["provenance"]["command"].get<std::string>().find("--busbw") != std::string::npos);
  // busbw grows with the size towards the fabric's 370 GB/s and never above.
  for (std::size_t i = 1; i < rows.size(); ++i) {
    CHECK(rows[i]["ring_busbw_gbs"].get<double>() > rows[i - 1]["ring_busbw_gbs"].get<double>());
    CHECK(rows[i]["ring_busbw_gbs"].get<double>() < 370.0);
  }
}

TEST_CASE("cli: --busbw on one GPU and a fit of out-of-place rows only say why they cannot be") {
  // An outside tester's findings: --busbw --gpus-per-node 1 printed a table of 0.0 us and 0.0
  // GB/s without a note, and a file of out-of-place rows only was "no rows".
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--busbw", "--gpus-per-node", "1"},
        std::vector<std::string>{"--busbw", "--nodes", "1", "--gpus-per-node", "1", "--json",
                                 "-"}}) {
    const ProcessResult r = sim(args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("one rank runs no all-reduce") != std::string::npos);
    CHECK(r.output.find("0.0") == std::string::npos);  // no table
  }
  TempDir dir;
  const std::string fit = dir.file("oop.jsonl");
  {
    std::ofstream out(fit);
    for (const int bytes : {1 << 20, 1 << 22}) {
      out << nlohmann::json{{"benchmark", "allreduce"},
                            {"mode", "nanoddp"},
                            {"placement", "out-of-place"},
                            {"ranks", 2},
                            {"bytes", bytes},
                            {"time_us", bytes / 1000.0}}
                 .dump()
          << "\n";
    }
  }
  const ProcessResult r = sim(model({"--gpus-per-node", "2", "--fit-allreduce", fit}));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("no in-place rows: only \"placement\": \"in-place\" rows are fitted") !=
        std::string::npos);
  CHECK(r.output.find("2 row(s) are out of place") != std::string::npos);
}

TEST_CASE("cli: bad input exits 2 and names the flag") {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{}, "give one compute profile"},
      {{"--model", "mlp", "--profile", "t.json"}, "give one compute profile"},
      {{"--model", "cnn"}, "--model"},
      {{"--model", "mlp", "--gpu", "b200"}, "--gpu b200: unknown GPU"},
      {{"--model", "mlp", "--fabric", "ethernet"}, "--fabric ethernet: unknown fabric"},
      {{"--model", "mlp", "--nodes", "0"}, "--nodes"},
      {{"--model", "mlp", "--algo", "nvls"}, "--algo"},
      {{"--model", "mlp", "--bucket-cap-mb", "0"}, "--bucket-cap-mb"},
      {{"--model", "mlp", "--intra-bw-gbs", "-5"},
       "--intra-bw-gbs: '-5' is out of range: a bandwidth is from 0.001"},
      {{"--model", "mlp", "--overlap", "maybe"}, "--overlap"},
      {{"--model", "mlp", "--rank", "1"}, "--rank applies to --profile only"},
      {{"--profile", "t.json", "--gpu", "h100"}, "--gpu applies to --model mlp only"},
      {{"--profile", "/nonexistent/t.json"}, "cannot open the file"},
      {{"--model", "mlp", "--fit-allreduce", "/nonexistent.jsonl"}, "cannot open the file"},
      {{"--model", "mlp", "--fit-allreduce", "x.jsonl", "--fabric", "nvlink4-ib400"}, "give one"},
      {{"--busbw", "--busbw-min", "8X"}, "--busbw-min 8X: not a size"},
      {{"--model", "mlp", "--fit-allreduce", "x.jsonl", "--sweep-nodes"},
       "--sweep-nodes needs a named fabric"},
      {{"--model", "mlp", "--no-such-flag"}, "--no-such-flag"},
      {{"--model", "mlp", "--cores", "2"}, "--cores models CPU ranks sharing cores"},
      {{"--model", "mlp", "--cores", "-1"}, "--cores"},
      {{"--model", "mlp", "--peers", "traced"}, "--peers applies to --profile only"},
      {{"--profile", "t.json", "--peers", "maybe"}, "--peers"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = sim(c.args);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.message) != std::string::npos);
  }
}

TEST_CASE("cli: --cores and --peers on a two-rank trace") {
  TempDir dir;
  const std::string trace = dir.file("two.json");
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "60";
  const ProcessResult train = run_process(
      {bin_path("nanoddp-run"), "--nproc-per-node", "2", bin_path("nanoddp-train"), "--hidden",
       "64", "--layers", "2", "--steps", "6", "--trace", trace, "--trace-steps", "6", "--quiet"},
      options);
  REQUIRE_MESSAGE(train.exit_code == 0, train.output);

  const ProcessResult r = sim({"--profile", trace, "--hidden", "64", "--layers", "2", "--nodes",
                               "1", "--gpus-per-node", "2", "--cores", "1", "--peers", "traced"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  for (const char* expected :
       {"1 CPU core(s) per node shared by 2 compute + 2 communication threads",
        "waits for the slowest traced rank", "all ready"}) {
    CHECK_MESSAGE(r.output.find(expected) != std::string::npos, expected, "\n", r.output);
  }
  const ProcessResult j =
      sim({"--profile", trace, "--hidden", "64", "--layers", "2", "--nodes", "1", "--gpus-per-node",
           "2", "--cores", "1", "--peers", "traced", "--json", "-"});
  REQUIRE_MESSAGE(j.exit_code == 0, j.output);
  // A 2-rank profile is no scaling baseline: said on stderr (before the JSON on stdout).
  CHECK(j.output.find("nanoddp-sim: warning: no scaling efficiency") != std::string::npos);
  const nlohmann::json out = nlohmann::json::parse(j.output.substr(j.output.find('{')));
  CHECK(out["step"]["scaling_efficiency"].is_null());
  CHECK(out["options"]["cores"] == 1);
  CHECK(out["options"]["peers"] == "traced");
  // Traced on these 2 ranks: compute as traced; a named fabric's collectives get share(2) = 1/2
  // of the core alone and share(4) = 1/4 beside backward.
  CHECK(out["rates"]["compute_alone"].get<double>() == doctest::Approx(1.0));
  CHECK(out["rates"]["comm_alone"].get<double>() == doctest::Approx(0.5));
  CHECK(out["rates"]["comm_shared"].get<double>() == doctest::Approx(0.25));
  CHECK(out["profile"]["peers_ready_ms"].size() == 6);
  // The traced steps' spread beside their median (an outside researcher found medians only).
  const auto& measured = out["profile"]["measured"];
  CHECK(measured["steps"].get<int>() >= 1);
  CHECK(measured["step_p10_ms"].get<double>() <= measured["step_ms"].get<double>());
  CHECK(measured["step_ms"].get<double>() <= measured["step_p90_ms"].get<double>());
  CHECK(r.output.find(fmt::format("median of {} steps (p10 ", measured["steps"].get<int>())) !=
        std::string::npos);
  for (const auto& b : out["buckets"]) {
    CHECK(b["start_ms"].get<double>() >= b["peers_ready_ms"].get<double>() - 1e-9);
  }

  // The trace's "grad" markers carry the model: no shape flags needed; one that disagrees
  // (--in defaults to 32, the run's) is a usage error naming the markers and the flags.
  const ProcessResult bare = sim({"--profile", trace, "--nodes", "1", "--gpus-per-node", "2"});
  REQUIRE_MESSAGE(bare.exit_code == 0, bare.output);
  CHECK(bare.output.find("6 parameters (6792 elements) from the trace's \"grad\" markers") !=
        std::string::npos);
  const ProcessResult wrong = sim({"--profile", trace, "--hidden", "65"});
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.output.find("markers (rank 0, step 2) list 6 parameters, 6792 elements") !=
        std::string::npos);
  CHECK(wrong.output.find("--in 32 --out 8 --hidden 65 --layers 2 mean") != std::string::npos);

  // The slowest rank of a 2-rank run says nothing about 4 ranks.
  const ProcessResult four = sim({"--profile", trace, "--hidden", "64", "--layers", "2", "--nodes",
                                  "1", "--gpus-per-node", "4", "--peers", "traced"});
  CHECK(four.exit_code == 2);
  CHECK(four.output.find("the trace holds 2 ranks but the cluster has 4") != std::string::npos);
}

TEST_CASE("cli: --scaling strong splits the global batch and compares with all of it on one GPU") {
  TempDir dir;
  const auto run = [&](std::vector<std::string> args) {
    const std::string path = dir.file("s.json");
    args.insert(args.end(), {"--json", path});
    const ProcessResult r = sim(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json strong =
      run({"--model", "mlp", "--hidden", "4096", "--layers", "4", "--scaling", "strong", "--batch",
           "512", "--nodes", "4", "--sweep-nodes"});
  // The per-GPU batch is the global batch over the 32 GPUs: the same step as weak with 16.
  const nlohmann::json weak =
      run({"--model", "mlp", "--hidden", "4096", "--layers", "4", "--batch", "16", "--nodes", "4"});
  CHECK(strong["step"]["scaling"] == "strong");
  CHECK(weak["step"]["scaling"] == "weak");
  CHECK(strong["inputs"]["model"]["global_batch"] == 512);
  CHECK(strong["step"]["step_ms"].get<double>() ==
        doctest::Approx(weak["step"]["step_ms"].get<double>()));
  // T1 runs the whole batch: longer than the weak baseline's 16 samples.
  const double t1 = strong["step"]["single_gpu_step_ms"].get<double>();
  CHECK(t1 > weak["step"]["single_gpu_step_ms"].get<double>());
  CHECK(strong["step"]["scaling_efficiency"].get<double>() ==
        doctest::Approx(t1 / (32 * strong["step"]["step_ms"].get<double>())));
  // Every sweep row: the same T1 over its own world's step.
  REQUIRE(strong["scaling"].size() == 3);
  for (const auto& row : strong["scaling"]) {
    CHECK(row["scaling_efficiency"].get<double>() ==
          doctest::Approx(t1 / (row["world_size"].get<double>() * row["step_ms"].get<double>())));
  }
  // A global batch the GPUs cannot split evenly is refused, naming --batch.
  const ProcessResult bad =
      sim({"--model", "mlp", "--scaling", "strong", "--batch", "100", "--nodes", "4"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--batch 100 --scaling strong") != std::string::npos);
  const ProcessResult trace = sim({"--profile", "t.json", "--scaling", "strong"});
  CHECK(trace.exit_code == 2);
  CHECK(trace.output.find("--scaling applies to --model mlp only") != std::string::npos);
}

TEST_CASE("cli: --sweep predicts the step for each value of one flag, each as its own run would") {
  TempDir dir;
  const auto run = [&](std::vector<std::string> args) {
    const std::string path = dir.file("s.json");
    args.insert(args.end(), {"--json", path});
    const ProcessResult r = sim(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const std::vector<std::string> base = {"--model", "mlp", "--layers", "4", "--nodes", "16"};
  auto args = base;
  args.insert(args.end(), {"--hidden", "4096", "--sweep", "hidden=1024,16384"});
  const nlohmann::json j = run(args);
  REQUIRE(j["parameter_sweep"]["flag"] == "--hidden");
  const auto& rows = j["parameter_sweep"]["rows"];
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["value"] == 1024.0);
  CHECK(rows[1]["parameters"].get<double>() > rows[0]["parameters"].get<double>());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto single = base;
    single.insert(single.end(), {"--hidden", i == 0 ? "1024" : "16384"});
    const nlohmann::json one = run(single);
    CHECK(rows[i]["step_ms"].get<double>() ==
          doctest::Approx(one["step"]["step_ms"].get<double>()));
    CHECK(rows[i]["scaling_efficiency"].get<double>() ==
          doctest::Approx(one["step"]["scaling_efficiency"].get<double>()));
    CHECK(rows[i]["memory_bytes"].get<double>() ==
          doctest::Approx(one["memory"]["total_bytes"].get<double>()));
  }
  // More network bandwidth never makes the step slower.
  const nlohmann::json bw = run({"--model", "mlp", "--hidden", "4096", "--layers", "4", "--nodes",
                                 "2", "--sweep", "inter-bw-gbs=6,12,25,50"});
  const auto& bw_rows = bw["parameter_sweep"]["rows"];
  REQUIRE(bw_rows.size() == 4);
  for (std::size_t i = 1; i < bw_rows.size(); ++i) {
    CHECK(bw_rows[i]["step_ms"].get<double>() <= bw_rows[i - 1]["step_ms"].get<double>());
  }
  CHECK(bw_rows[0]["step_ms"].get<double>() > bw_rows[3]["step_ms"].get<double>());

  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"--model", "mlp", "--sweep", "width=3"}, "--sweep width=3: expected NAME=v1,v2"},
      {{"--model", "mlp", "--sweep", "hidden=12,x"}, "'x' is not an integer"},
      {{"--model", "mlp", "--sweep", "batch=1.5"}, "'1.5' is not an integer"},
      {{"--model", "mlp", "--sweep", "inter-bw-gbs=0"}, "'0' is not a number"},
      {{"--profile", "t.json", "--sweep", "hidden=64"}, "a --profile trace fixes the model"},
      {{"--model", "mlp", "--fit-allreduce", "x.jsonl", "--sweep", "intra-bw-gbs=100"},
       "--fit-allreduce fixes the network"},
      {{"--model", "mlp", "--layers", "8", "--sweep", "hidden=1024,60000"},
       "--sweep at --hidden 60000: --gpu h100: the model does not fit"},
      {{"--busbw", "--sweep", "hidden=64"}, "drop --busbw"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = sim(c.args);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.message) != std::string::npos);
  }
}
