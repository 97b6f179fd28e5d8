// nanoddp-sim reads its flags as every other nanoddp program does and refuses what would make a
// figure meaningless: numbers in other bases, scale factors and sizes past stated bounds, more
// GPUs per node than a named fabric's node, an output that is one of its inputs, and an
// efficiency against a W-rank profile's own step (the baseline is one plain process).

#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim/sim_runs.h"
#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("input checks: numbers are decimal, as in nanoddp-bench-ddp (no octal, hex, spaces)") {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--model", "mlp", "--hidden", "010"}, "leading zero"},
      {{"--model", "mlp", "--hidden", "0x10"}, "'0x10' is not an integer"},
      {{"--model", "mlp", "--hidden", " 16"}, "' 16'"},
      {{"--model", "mlp", "--layers", "01"}, "leading zero"},
      {{"--model", "mlp", "--sweep", "hidden=010,32"}, "'010'"},
      {{"--model", "mlp", "--sweep", "hidden=0x10"}, "'0x10'"},
      {{"--model", "mlp", "--sweep", "inter-bw-gbs=0x10"}, "'0x10'"},
      {{"--busbw", "--busbw-max", "0x10M"}, "0x10M"},
      {{"--busbw", "--busbw-min", " 8M"}, "--busbw-min"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = sim(c.args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
  }
  // The same --hidden reads the same in both tools: 16 is 16.
  const ProcessResult ok = sim({"--model", "mlp", "--hidden", "16", "--json", "-"});
  REQUIRE_MESSAGE(ok.exit_code == 0, ok.output);
  CHECK(nlohmann::json::parse(ok.output)["inputs"]["shape"]["hidden"] == 16);
}

TEST_CASE("input checks: scale factors and --busbw sizes have stated bounds") {
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {model({"--compute-scale", "1e308"}), "--compute-scale"},
           {model({"--compute-scale", "1e4"}), "--compute-scale"},
           {model({"--compute-scale", "1e-4"}), "--compute-scale"},
           {model({"--overlap-slowdown", "1e308"}), "--overlap-slowdown"},
           {model({"--overlap-slowdown", "101"}), "--overlap-slowdown"},
           {{"--busbw", "--busbw-max", "99999999999999999999999"}, "--busbw-max"},
           {{"--busbw", "--busbw-max", "18446744073709551615"}, "at most 1T"},
           {{"--busbw", "--busbw-max", "2T"}, "at most 1T"}}) {
    const ProcessResult r = sim(args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(expected) != std::string::npos);
  }
  CHECK(sim(model({"--compute-scale", "1000", "--overlap-slowdown", "100"})).exit_code == 0);
  // No row above --busbw-max, even at the bound.
  const ProcessResult rows =
      sim({"--busbw", "--busbw-min", "256G", "--busbw-max", "1T", "--json", "-"});
  REQUIRE_MESSAGE(rows.exit_code == 0, rows.output);
  const auto json = nlohmann::json::parse(rows.output);
  REQUIRE(json.size() == 3);  // 256G, 512G, 1T
  for (const auto& row : json) CHECK(row["bytes"].get<double>() <= 1099511627776.0);
  const ProcessResult odd =
      sim({"--busbw", "--busbw-min", "3", "--busbw-max", "1000", "--json", "-"});
  REQUIRE_MESSAGE(odd.exit_code == 0, odd.output);
  for (const auto& row : nlohmann::json::parse(odd.output)) CHECK(row["bytes"] <= 1000);
}

TEST_CASE("input checks: more GPUs per node than a named fabric's node is refused") {
  for (const char* gpus : {"16", "72", "4096"}) {
    const ProcessResult r = sim(model({"--gpus-per-node", gpus, "--fabric", "nvlink4-ib400"}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("its systems have 8 GPUs per node") != std::string::npos);
    CHECK(r.output.find("--intra-bw-gbs") != std::string::npos);
  }
  CHECK(sim(model({"--gpus-per-node", "8", "--nodes", "2"})).exit_code == 0);
  // A node the user describes: taken as given.
  CHECK(sim(model({"--gpus-per-node", "72", "--intra-bw-gbs", "900", "--intra-lat-us", "3"}))
            .exit_code == 0);
  CHECK(sim({"--busbw", "--gpus-per-node", "16", "--fabric", "nvlink3-ib200"}).exit_code == 2);
}

TEST_CASE("input checks: --json that is an input (any name for it) is refused, input intact") {
  TempDir dir;
  const std::string fit = dir.file("a.jsonl");
  // A real measurement to fit: 2 ranks of nanoddp-bench-allreduce.
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "60";
  const ProcessResult bench = run_process(
      {bin_path("nanoddp-run"), "--nproc-per-node", "2", bin_path("nanoddp-bench-allreduce"), "-b",
       "64K", "-e", "4M", "-f", "4", "-n", "2", "-w", "1", "--json", fit},
      options);
  REQUIRE_MESSAGE(bench.exit_code == 0, bench.output);
  const std::string before = slurp(fit);
  REQUIRE(!before.empty());
  const std::string link = dir.file("link.jsonl");
  const std::string hard = dir.file("hard.jsonl");
  REQUIRE(::symlink(fit.c_str(), link.c_str()) == 0);
  REQUIRE(::link(fit.c_str(), hard.c_str()) == 0);
  for (const std::string& out : {fit, link, hard}) {
    const ProcessResult r =
        sim(model({"--gpus-per-node", "2", "--fit-allreduce", fit, "--json", out}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("it would be overwritten") != std::string::npos);
    CHECK(slurp(fit) == before);
  }
  const ProcessResult fine =
      sim(model({"--gpus-per-node", "2", "--fit-allreduce", fit, "--json", dir.file("o.json")}));
  CHECK_MESSAGE(fine.exit_code == 0, fine.output);

  // A results file that cannot be written is an error naming it.
  if (::access("/dev/full", W_OK) == 0) {
    const ProcessResult full = sim(model({"--json", "/dev/full"}));
    // As every benchmark says it (common/results_file.h): exit code 1, the run itself was fine.
    CHECK(full.exit_code == 1);
    CHECK(full.output.find("nanoddp-sim: error: --json /dev/full: writing the results failed") !=
          std::string::npos);
  }
}

TEST_CASE(
    "input checks: a W-rank profile is no baseline, --baseline-profile gives the 1-process one") {
  TempDir dir;
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "60";
  const std::vector<std::string> train = {
      bin_path("nanoddp-train"), "--hidden", "64",     "--layers", "2", "--steps", "6",
      "--trace-steps",           "6",        "--quiet"};
  std::vector<std::string> one = train, two = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  one.insert(one.end(), {"--trace", dir.file("one.json")});
  two.insert(two.end(), train.begin(), train.end());
  two.insert(two.end(), {"--trace", dir.file("two.json")});
  REQUIRE(run_process(one, options).exit_code == 0);
  REQUIRE(run_process(two, options).exit_code == 0);
  const std::vector<std::string> cluster = {"--nodes", "1", "--gpus-per-node", "2"};

  // Alone: no efficiency (n/a, null), a warning that says why and what to give.
  std::vector<std::string> alone = {"--profile", dir.file("two.json")};
  alone.insert(alone.end(), cluster.begin(), cluster.end());
  const ProcessResult table = sim(alone);
  REQUIRE_MESSAGE(table.exit_code == 0, table.output);
  CHECK(table.output.find("scaling efficiency n/a") != std::string::npos);
  CHECK(table.output.find("give --baseline-profile") != std::string::npos);
  alone.insert(alone.end(), {"--json", "-"});
  const ProcessResult j = sim(alone);
  REQUIRE_MESSAGE(j.exit_code == 0, j.output);
  // The warning goes to stderr, before the JSON on stdout.
  CHECK(j.output.find("nanoddp-sim: warning: no scaling efficiency") != std::string::npos);
  const auto out = nlohmann::json::parse(j.output.substr(j.output.find('{')));
  CHECK(out["step"]["scaling_efficiency"].is_null());
  CHECK(out["algorithm_band"]["ring_efficiency"].is_null());
  CHECK(out["step"]["baseline"].get<std::string>().rfind("none:", 0) == 0);
  // A sweep's efficiencies need the baseline too.
  std::vector<std::string> sweep = {"--profile", dir.file("two.json"), "--sweep-nodes"};
  sweep.insert(sweep.end(), cluster.begin(), cluster.end());
  CHECK(sim(sweep).exit_code == 2);

  // With the 1-rank trace as the baseline: efficiency = its plain step / the predicted step.
  std::vector<std::string> based = {
      "--profile", dir.file("two.json"), "--baseline-profile", dir.file("one.json"), "--json", "-"};
  based.insert(based.end(), cluster.begin(), cluster.end());
  const ProcessResult b = sim(based);
  REQUIRE_MESSAGE(b.exit_code == 0, b.output);
  const auto bj = nlohmann::json::parse(b.output);
  const auto& step = bj["step"];
  CHECK(step["scaling_efficiency"].get<double>() ==
        doctest::Approx(step["single_gpu_step_ms"].get<double>() / step["step_ms"].get<double>()));
  CHECK(step["baseline"].get<std::string>().find("1-rank trace") != std::string::npos);
  // The 1-rank trace's own plain step is the baseline, the same as a 1-rank --profile's.
  std::vector<std::string> single = {"--profile", dir.file("one.json"), "--json", "-"};
  single.insert(single.end(), cluster.begin(), cluster.end());
  const ProcessResult s = sim(single);
  REQUIRE_MESSAGE(s.exit_code == 0, s.output);
  CHECK(
      step["single_gpu_step_ms"].get<double>() ==
      doctest::Approx(nlohmann::json::parse(s.output)["step"]["single_gpu_step_ms"].get<double>()));
  // A multi-rank trace is no baseline either.
  std::vector<std::string> wrong = {"--profile", dir.file("two.json"), "--baseline-profile",
                                    dir.file("two.json")};
  wrong.insert(wrong.end(), cluster.begin(), cluster.end());
  const ProcessResult w = sim(wrong);
  CHECK(w.exit_code == 2);
  CHECK(w.output.find("the baseline is one plain process") != std::string::npos);
}

TEST_CASE(
    "input checks: overlap off reads 0 % overlap, with or without the optimizer in backward") {
  for (const char* in_backward : {"off", "on"}) {
    const ProcessResult r = sim(model({"--nodes", "2", "--overlap", "off",
                                       "--optimizer-in-backward", in_backward, "--json", "-"}));
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    CHECK(nlohmann::json::parse(r.output)["step"]["overlap_fraction"].get<double>() == 0.0);
    const ProcessResult t =
        sim(model({"--nodes", "2", "--overlap", "off", "--optimizer-in-backward", in_backward}));
    CHECK(t.output.find("overlap 0.0 % of the communication ran during backward (overlap off") !=
          std::string::npos);
    CHECK(t.output.find("hidden behind backward and the updates") == std::string::npos);
  }
}

TEST_CASE(
    "input checks: --fit-allreduce refuses nanoddp-bench-allreduce rows of another collective") {
  // nanoddp-bench-allreduce --collective reduce_scatter|allgather writes rows of the same shape
  // (ranks, bytes, time_us): fitted, they would pass for an all-reduce's cost.
  char name[] = "/tmp/nanoddp-sim-fit-XXXXXX";
  const int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(name);
    for (int k = 0; k < 4; ++k) {
      out << nlohmann::json{{"benchmark", "reduce_scatter"},
                            {"placement", "in-place"},
                            {"ranks", 2},
                            {"bytes", 1 << (20 + k)},
                            {"time_us", 100.0 * (k + 1)}}
                 .dump()
          << "\n";
    }
  }
  const ProcessResult r = sim(model({"--fit-allreduce", name}));
  ::unlink(name);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("measured \"reduce_scatter\", not allreduce") != std::string::npos);
  CHECK(r.output.find("line 1") != std::string::npos);
}
