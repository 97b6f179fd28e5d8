// nanoddp-sim refuses nonsense and says what it cannot know: checked parameter counts, bounds on
// the inputs, a GPU-memory check, a warning for a GPU on a fabric it never shipped with, the
// ring/tree band and the NVLink SHARP caveat on every run, and the inputs and provenance as
// structured JSON. All through the real executable.

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "sim/sim_runs.h"
#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

bool has(const ProcessResult& r, const std::string& text) {
  return r.output.find(text) != std::string::npos;
}

nlohmann::json sim_json(std::vector<std::string> args, ProcessResult* out = nullptr) {
  TempDir dir;
  const std::string path = dir.file("sim.json");
  args.push_back("--json");
  args.push_back(path);
  const ProcessResult r = sim(args);
  if (out != nullptr) *out = r;
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE(
    "refusals: a parameter count past 2^63 is an error naming the shape flags, not a "
    "negative count") {
  const ProcessResult r = sim({"--model", "mlp", "--in", "1073741824", "--out", "1073741824",
                               "--hidden", "1073741824", "--layers", "8"});
  CAPTURE(r.output);
  CHECK(r.exit_code == 2);
  CHECK(has(r, "--in 1073741824 --hidden 1073741824 --out 1073741824 --layers 8"));
  CHECK(has(r, "more than 2^63 parameters"));
  CHECK_FALSE(has(r, "efficiency"));
}

TEST_CASE("refusals: --layers past the bound is refused at once, not simulated for minutes") {
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult r = sim({"--model", "mlp", "--hidden", "16", "--layers", "1048576"});
  CAPTURE(r.output);
  CHECK(r.exit_code == 2);
  CHECK(has(r, "--layers"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  // The largest allowed is still quick.
  const auto big = std::chrono::steady_clock::now();
  const ProcessResult ok = sim({"--model", "mlp", "--hidden", "16", "--layers", "4096", "--nodes",
                                "4", "--sweep-nodes", "--sweep-buckets"});
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);
  CHECK(std::chrono::steady_clock::now() - big < std::chrono::seconds(10));
}

TEST_CASE("refusals: absurd network values and worlds exit 2 naming the flag") {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"--launch-us", "1e30"}, "--launch-us 1e+30: more than a second"},
      {{"--intra-lat-us", "2e6"}, "--intra-lat-us 2e+06: more than a second"},
      {{"--nodes", "2", "--inter-lat-us", "1e7"}, "--inter-lat-us 1e+07: more than a second"},
      {{"--intra-bw-gbs", "1e9"},
       "--intra-bw-gbs: '1e9' is out of range: a bandwidth is from "
       "0.001 GB/s (1 MB/s) to 100000 GB/s"},
      // No lower bound used to let 1e-30 GB/s through (a step of 1.6e29 ms); and 1e-300 was
      // told the range of a float, "0, or a magnitude from 1.2e-38", where 0 is refused.
      {{"--intra-bw-gbs", "1e-30"},
       "--intra-bw-gbs: '1e-30' is out of range: a bandwidth is "
       "from 0.001 GB/s (1 MB/s)"},
      {{"--intra-bw-gbs", "1e-300"}, "--intra-bw-gbs: '1e-300' is out of range: a bandwidth"},
      {{"--nodes", "2", "--inter-bw-gbs", "0.0005"}, "--inter-bw-gbs: '0.0005' is out of range"},
      {{"--nodes", "2", "--inter-bw-gbs", "0"}, "--inter-bw-gbs: '0' is out of range"},
      {{"--nodes", "2", "--sweep", "inter-bw-gbs=10,0.0001"},
       "'0.0001' is not a number in [0.001, 100000]"},
      {{"--nodes", "1048576"}, "--nodes 1048576 x --gpus-per-node 8 = 8388608 GPUs: at most 65536"},
      {{"--nodes", "1048576", "--gpus-per-node", "4096"}, "= 4294967296 GPUs"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--model", "mlp"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const ProcessResult r = sim(args);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(has(r, c.message));
  }
  // --busbw goes through the same checks.
  const ProcessResult busbw = sim({"--busbw", "--launch-us", "1e30"});
  CHECK(busbw.exit_code == 2);
  CHECK(has(busbw, "--launch-us"));
}

TEST_CASE("refusals: more GPUs than the described range is a warning in the table and the JSON") {
  ProcessResult r;
  const nlohmann::json j = sim_json({"--model", "mlp", "--nodes", "1024"}, &r);
  CHECK(has(r, "warning: 8192 GPUs: past the 8 to 4096 GPUs"));
  REQUIRE(j["warnings"].size() == 1);
  CHECK(j["warnings"][0].get<std::string>().find("8192 GPUs") != std::string::npos);
  CHECK(sim_json({"--model", "mlp", "--nodes", "512"})["warnings"].empty());
}

TEST_CASE(
    "refusals: a model that does not fit the GPU is refused, one that nearly fills it is "
    "warned about") {
  // 7 hidden-to-hidden Linears of 47000^2: 15.5 billion parameters, 16 bytes each with AdamW
  // (parameter, gradient, two moments) = 247 GB, on an 80 GB H100.
  const ProcessResult big =
      sim({"--model", "mlp", "--gpu", "h100", "--hidden", "47000", "--layers", "8"});
  CAPTURE(big.output);
  CHECK(big.exit_code == 2);
  CHECK(has(big, "--gpu h100: the model does not fit its 80 GB"));
  CHECK(has(big, "optimizer state"));
  // Nor on a 141 GB H200.
  CHECK(sim({"--model", "mlp", "--gpu", "h200", "--hidden", "47000", "--layers", "8"}).exit_code ==
        2);

  // 7 x 26000^2 = 4.7e9 parameters x 16 bytes = 75.7 GB of 80: fits, above 90 %.
  ProcessResult near;
  const nlohmann::json j =
      sim_json({"--model", "mlp", "--gpu", "h100", "--hidden", "26000", "--layers", "8"}, &near);
  CHECK(has(near, "warning: the model fills"));
  CHECK(j["memory"]["total_bytes"].get<double>() < j["memory"]["gpu_bytes"].get<double>());
  CHECK(j["memory"]["total_bytes"].get<double>() > 0.9 * j["memory"]["gpu_bytes"].get<double>());
  CHECK(j["memory"]["optimizer_state_bytes"].get<double>() ==
        doctest::Approx(2 * j["memory"]["parameters_bytes"].get<double>()));
  // SGD keeps no state: the same model leaves room.
  const nlohmann::json sgd = sim_json({"--model", "mlp", "--gpu", "h100", "--hidden", "26000",
                                       "--layers", "8", "--optimizer", "sgd"});
  CHECK(sgd["memory"]["optimizer_state_bytes"] == 0.0);
  CHECK(sgd["warnings"].empty());
}

TEST_CASE("refusals: a GPU on a fabric it never shipped with is warned about") {
  ProcessResult r;
  const nlohmann::json j =
      sim_json({"--model", "mlp", "--gpu", "h100", "--fabric", "nvlink3-ib200"}, &r);
  CHECK(has(r, "warning: --gpu h100 on --fabric nvlink3-ib200: no system shipped that pairing"));
  CHECK(j["warnings"].size() == 1);
  CHECK(sim_json({"--model", "mlp", "--gpu", "a100", "--fabric", "nvlink3-ib200"})["warnings"]
            .empty());
  CHECK(sim_json({"--model", "mlp", "--gpu", "h200"})["warnings"].empty());
}

TEST_CASE(
    "refusals: every run on a named fabric prints the ring/tree band and the NVLink SHARP caveat") {
  ProcessResult r;
  const nlohmann::json j =
      sim_json({"--model", "mlp", "--hidden", "4096", "--layers", "4", "--nodes", "128"}, &r);
  CHECK(has(r, "algorithm band       ring"));
  CHECK(has(r, "caveat: NVLink SHARP (NVLS) and CollNet are not modelled"));
  const auto& band = j["algorithm_band"];
  const double ring = band["ring_efficiency"].get<double>();
  const double tree = band["tree_efficiency"].get<double>();
  CHECK(ring != doctest::Approx(tree));
  // auto takes the faster algorithm per bucket: never worse than either forced.
  CHECK(j["step"]["scaling_efficiency"].get<double>() >= std::max(ring, tree) - 1e-9);
  REQUIRE(j["caveats"].size() == 1);
  CHECK(j["caveats"][0].get<std::string>().find("NVLink SHARP") != std::string::npos);

  // The sweep carries the band per row.
  const nlohmann::json s = sim_json(
      {"--model", "mlp", "--hidden", "4096", "--layers", "4", "--nodes", "4", "--sweep-nodes"});
  for (const auto& row : s["scaling"]) {
    CHECK(row.contains("ring_efficiency"));
    CHECK(row.contains("tree_efficiency"));
  }
  CHECK(s["scaling"].back()["ring_efficiency"] == s["algorithm_band"]["ring_efficiency"]);

  const ProcessResult busbw = sim({"--busbw", "--gpus-per-node", "8"});
  CHECK(busbw.exit_code == 0);
  CHECK(has(busbw, "caveat: NVLink SHARP"));
  const ProcessResult trace_less = sim({"--model", "mlp", "--gpus-per-node", "1"});
  CHECK(has(trace_less, "caveat: NVLink SHARP"));
}

TEST_CASE("refusals: the JSON stores the inputs as structured fields and the provenance") {
  const nlohmann::json j =
      sim_json({"--model", "mlp", "--gpu", "a100", "--hidden", "512", "--layers", "3", "--batch",
                "16", "--nodes", "2", "--fabric", "nvlink3-ib200", "--launch-us", "7"});
  const auto& in = j["inputs"];
  CHECK(in["model"]["gpu"] == "a100");
  CHECK(in["model"]["batch_per_gpu"] == 16);
  CHECK(in["shape"]["hidden"] == 512);
  CHECK(in["shape"]["layers"] == 3);
  CHECK(in["cluster"]["nodes"] == 2);
  CHECK(in["network"]["fabric"] == "nvlink3-ib200");
  CHECK(in["network"]["launch_us"] == 7.0);
  CHECK(in["network"]["intra_bw_gbs"].is_null());
  CHECK(in["ddp"]["bucket_cap_mb"] == 25.0);
  const auto& p = j["provenance"];
  CHECK(p["command"].get<std::string>().find("nanoddp-sim --model mlp --gpu a100") !=
        std::string::npos);
  CHECK(std::regex_match(p["utc"].get<std::string>(),
                         std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  CHECK(std::regex_match(p["commit"].get<std::string>(), std::regex("[0-9a-f]{40}|unknown")));
  CHECK(p["load_average"].size() == 3);
  CHECK(p["environment"].is_object());
}

TEST_CASE("refusals: a fitted CPU transport gets neither the ring/tree band nor the NVLS caveat") {
  // One measured transport (shared memory, a TCP ring) has no tree to choose and no NVLink:
  // both used to be printed (and put in the JSON) for it.
  TempDir dir;
  const std::string fit = dir.file("fit.jsonl");
  {
    std::ofstream out(fit);
    for (const double bytes : {65536.0, 262144.0, 1048576.0, 4194304.0}) {
      out << nlohmann::json{{"ranks", 2}, {"bytes", bytes}, {"time_us", 20.0 + bytes / 3000.0}}
                 .dump()
          << "\n";
    }
  }
  ProcessResult r;
  const nlohmann::json j =
      sim_json({"--model", "mlp", "--gpus-per-node", "2", "--fit-allreduce", fit}, &r);
  CHECK_FALSE(has(r, "algorithm band"));
  CHECK_FALSE(has(r, "caveat:"));
  CHECK(j["algorithm_band"].is_null());
  CHECK(j["caveats"].empty());
  const ProcessResult busbw = sim({"--busbw", "--gpus-per-node", "2", "--fit-allreduce", fit});
  REQUIRE_MESSAGE(busbw.exit_code == 0, busbw.output);
  CHECK_FALSE(has(busbw, "caveat:"));
  // A named fabric keeps both (the case above).
  ProcessResult named;
  sim_json({"--model", "mlp", "--gpus-per-node", "2"}, &named);
  CHECK(has(named, "algorithm band"));
  CHECK(has(named, "caveat: NVLink SHARP"));
}
