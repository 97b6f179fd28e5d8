// nanoddp-bench-ddp as a user runs it: the real driver starting real DDP jobs through
// nanoddp-run, its JSON lines parsed and checked key by key. No timing assertions: times are
// only checked to be positive and consistent with each other and with the formulas.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/config.h"
#include "support/subprocess.h"

using namespace nanoddp::testing;
using nlohmann::json;

namespace {

ProcessResult bench(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {bin_path("nanoddp-bench-ddp")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "30";  // a hung collective fails the test, not the CI job
  return run_process(argv, options);
}

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

std::set<std::string> keys_of(const json& object) {
  std::set<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.insert(key);
  return keys;
}

// The MLP's parameters from its shape, counted independently of the library.
std::int64_t mlp_params(std::int64_t in, std::int64_t hidden, std::int64_t layers,
                        std::int64_t out) {
  std::int64_t n = 0, width = in;
  for (std::int64_t i = 0; i < layers; ++i) {
    n += width * hidden + hidden;
    width = hidden;
  }
  return n + width * out + out;
}

// GEMM FLOPs of one step: 6 B in out per Linear, minus the first layer's input gradient.
double mlp_flops(std::int64_t in, std::int64_t hidden, std::int64_t layers, std::int64_t out,
                 std::int64_t batch) {
  const double b = static_cast<double>(batch);
  double flops = 0;
  std::int64_t width = in;
  for (std::int64_t i = 0; i < layers; ++i) {
    flops += 6 * b * static_cast<double>(width * hidden);
    width = hidden;
  }
  flops += 6 * b * static_cast<double>(width * out);
  const std::int64_t first_out = layers > 0 ? hidden : out;
  return flops - 2 * b * static_cast<double>(in * first_out);
}

// Every key of the documented record, and values that make sense for the asked configuration.
void check_record(const json& r, int world, std::int64_t in, std::int64_t hidden,
                  std::int64_t layers, std::int64_t out, std::int64_t batch_per_rank,
                  const std::string& scaling) {
  CAPTURE(r.dump());
  CHECK(keys_of(r) == std::set<std::string>{"bench",
                                            "machine",
                                            "build",
                                            "config",
                                            "baseline",
                                            "steps",
                                            "warmup",
                                            "step_ms_median",
                                            "step_ms_p10",
                                            "step_ms_p90",
                                            "step_ms_ci95_steps",
                                            "step_ms_ci95_launches",
                                            "ci95_launches_note",
                                            "load_average_1m",
                                            "median_step",
                                            "samples_per_s",
                                            "compute_ms",
                                            "allreduce_ms",
                                            "exposed_comm_ms",
                                            "hidden_comm_ms",
                                            "overlap_fraction",
                                            "scaling_efficiency",
                                            "scaling_efficiency_repeats",
                                            "gflops",
                                            "busbw_gbs",
                                            "parameter_bytes",
                                            "gradient_bytes",
                                            "averaged_gradient_bytes",
                                            "optimizer_state_bytes",
                                            "memory_per_rank",
                                            "samples",
                                            "repeats",
                                            "repeat_step_ms_median",
                                            "repeat_samples_per_s",
                                            "warnings",
                                            "provenance"});
  // One baseline per model and batch: a plain process, no DDP.
  CHECK(r["baseline"] == (world == 1));
  CHECK(r["config"]["ddp"] == (world > 1));
  // The breakdown is the median step's own: its parts add up, and it is one of the samples.
  const double median_step = r["median_step"]["step_ms"].get<double>();
  CHECK(r["compute_ms"].get<double>() + r["exposed_comm_ms"].get<double>() ==
        doctest::Approx(median_step).epsilon(1e-12));
  const int repeats = r["repeats"].get<int>();
  REQUIRE(r["samples"].size() == static_cast<std::size_t>(repeats));
  bool found = false;
  for (const auto& launch : r["samples"]) {
    CHECK(launch["step_ms"].size() == r["steps"].get<std::size_t>());
    found = found || launch["step_ms"][r["median_step"]["index"].get<std::size_t>()] == median_step;
  }
  CHECK(found);
  CHECK(r["step_ms_p10"].get<double>() <= r["step_ms_median"].get<double>());
  CHECK(r["step_ms_ci95_steps"][0].get<double>() <= r["step_ms_ci95_steps"][1].get<double>());
  CHECK(r["scaling_efficiency_repeats"].size() == static_cast<std::size_t>(repeats));
  CHECK(r["provenance"]["command"].get<std::string>().find("nanoddp-bench-ddp") !=
        std::string::npos);
  CHECK(r["bench"] == "ddp");

  const json& m = r["machine"];
  CHECK(keys_of(m) == std::set<std::string>{"hostname", "cpu", "cores", "os"});
  CHECK(!m["hostname"].get<std::string>().empty());
  CHECK(!m["cpu"].get<std::string>().empty());
  CHECK(m["cores"].get<int>() >= 1);
  CHECK(!m["os"].get<std::string>().empty());

  const json& b = r["build"];
  CHECK(keys_of(b) == std::set<std::string>{"version", "compiler", "build_type", "cuda", "native"});
  CHECK(b["version"] == NANODDP_VERSION);
  CHECK(!b["compiler"].get<std::string>().empty());
  CHECK(!b["build_type"].get<std::string>().empty());
  CHECK(b["cuda"].get<bool>() == (NANODDP_WITH_CUDA != 0));
  CHECK(b["native"].is_boolean());

  const json& c = r["config"];
  CHECK(keys_of(c) ==
        std::set<std::string>{"world_size",   "nnodes",        "nproc_per_node",
                              "device",       "backend",       "in",
                              "out",          "hidden",        "layers",
                              "activation",   "scaling",       "batch_per_rank",
                              "global_batch", "bucket_cap_mb", "first_bucket_mb",
                              "overlap",      "comm_hook",     "threads",
                              "params",       "buckets",       "optimizer_in_backward",
                              "ddp",          "zero_stage",    "zero_overlap_gather"});
  CHECK(c["world_size"] == world);
  CHECK(c["nnodes"] == 1);
  CHECK(c["nproc_per_node"] == world);
  CHECK(c["device"] == "cpu");
  CHECK(c["backend"].get<std::string>().rfind(world == 1 ? "none" : "gloo", 0) == 0);
  CHECK(c["in"] == in);
  CHECK(c["out"] == out);
  CHECK(c["hidden"] == hidden);
  CHECK(c["layers"] == layers);
  CHECK(c["activation"] == "relu");
  CHECK(c["scaling"] == scaling);
  CHECK(c["batch_per_rank"] == batch_per_rank);
  CHECK(c["global_batch"] == batch_per_rank * world);
  CHECK(c["bucket_cap_mb"].get<double>() > 0);
  CHECK(c["first_bucket_mb"].get<double>() > 0);
  CHECK(c["overlap"].is_boolean());
  CHECK(c["optimizer_in_backward"].is_boolean());
  CHECK(c["comm_hook"] == "allreduce");
  CHECK(c["threads"] == 1);
  const int zero = c["zero_stage"].get<int>();
  CHECK(zero >= 0);
  CHECK(zero <= (world == 1 ? 0 : 2));
  CHECK(c["params"] == mlp_params(in, hidden, layers, out));
  CHECK(c["buckets"].get<int>() >= (world == 1 ? 0 : 1));

  const double step = r["step_ms_median"].get<double>();
  const double allreduce = r["allreduce_ms"].get<double>();
  const double exposed = r["exposed_comm_ms"].get<double>();
  const double hidden_comm = r["hidden_comm_ms"].get<double>();
  CHECK(step > 0);
  CHECK(r["step_ms_p90"].get<double>() >= step);
  CHECK(
      r["samples_per_s"].get<double>() ==
      doctest::Approx(static_cast<double>(batch_per_rank * world) / (step / 1000.0)).epsilon(1e-9));
  CHECK(r["compute_ms"].get<double>() > 0);
  CHECK(r["compute_ms"].get<double>() <= step);
  CHECK(allreduce >= 0);
  if (world > 1) CHECK(allreduce > 0);
  CHECK(exposed >= 0);
  CHECK(hidden_comm >= 0);
  CHECK(std::fabs(hidden_comm + exposed - allreduce) <= 1e-9 * std::max(1.0, allreduce));
  CHECK(r["overlap_fraction"].get<double>() >= 0);
  CHECK(r["overlap_fraction"].get<double>() <= 1);
  const double efficiency = r["scaling_efficiency"].get<double>();
  if (world == 1) {
    CHECK(efficiency == 1.0);
  } else {
    CHECK(efficiency > 0);
  }
  CHECK(r["gflops"].get<double>() ==
        doctest::Approx(mlp_flops(in, hidden, layers, out, batch_per_rank) / (step / 1000.0) / 1e9)
            .epsilon(1e-9));
  const double busbw = r["busbw_gbs"].get<double>();
  if (world == 1) {
    CHECK(busbw == 0.0);
  } else {
    // The gradients' all-reduce (stage 2: reduce-scatter); under ZeRO the parameters' all-gather.
    const double bytes = 4.0 * static_cast<double>(mlp_params(in, hidden, layers, out));
    const double share = (world - 1.0) / world;
    const double bus = bytes * (zero == 2 ? 1.0 : 2.0) * share + (zero > 0 ? bytes * share : 0.0);
    CHECK(busbw == doctest::Approx(bus / (allreduce / 1000.0) / 1e9).epsilon(1e-9));
  }
  // Memory held by rank 0: without ZeRO the whole of each (AdamW: two moments per parameter).
  const std::int64_t numel = mlp_params(in, hidden, layers, out);
  if (zero == 0) {
    CHECK(r["parameter_bytes"] == 4 * numel);
    CHECK(r["gradient_bytes"] == 4 * numel);
    CHECK(r["averaged_gradient_bytes"] == 4 * numel);
    CHECK(r["optimizer_state_bytes"] == 8 * numel);
  }
  // Every rank's, rank 0's first; the shards of all ranks add up to the whole.
  const json& ranks = r["memory_per_rank"];
  REQUIRE(ranks.size() == static_cast<std::size_t>(world));
  std::int64_t state = 0;
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    CHECK(ranks[k]["rank"] == k);
    CHECK(ranks[k]["parameter_bytes"] == 4 * numel);
    state += ranks[k]["optimizer_state_bytes"].get<std::int64_t>();
  }
  CHECK(ranks[0]["optimizer_state_bytes"] == r["optimizer_state_bytes"]);
  CHECK(state == (zero == 0 ? world : 1) * 8 * numel);
}

std::size_t count_rows(const std::string& output) {
  std::size_t rows = 0, start = 0;
  while (start < output.size()) {
    std::size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(start, end - start);
    if (!line.empty() && line[0] != '#' && line.find("ranks") == std::string::npos) ++rows;
    start = end + 1;
  }
  return rows;
}

// The table's header and rows split into columns (whitespace-separated), the header first.
std::vector<std::vector<std::string>> table_rows(const std::string& output) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::vector<std::string> row;
    for (std::string word; words >> word;) row.push_back(word);
    // The header and the rows (a rank count first); not the comments, nor stderr's lines.
    const bool number = !row.empty() && std::all_of(row[0].begin(), row[0].end(), ::isdigit);
    if (number || (!row.empty() && row[0] == "ranks")) rows.push_back(row);
  }
  return rows;
}

}  // namespace

TEST_CASE("bench-ddp: a weak-scaling sweep writes one complete JSON line per point") {
  TempDir dir;
  const std::string path = dir.file("ddp.jsonl");
  const ProcessResult r =
      bench({"--world",         "1,2",      "--in",     "24", "--hidden",          "32",
             "--layers",        "2",        "--out",    "8",  "--batch",           "16",
             "--steps",         "5",        "--warmup", "2",  "--first-bucket-mb", "0.001",
             "--bucket-cap-mb", "0.002,25", "--json",   path});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  CHECK(r.output.find("median of 5 steps") != std::string::npos);
  CHECK(r.output.find("slowest rank per step") != std::string::npos);
  CHECK(count_rows(r.output) == 3);  // the shared baseline, then the two DDP points

  const std::vector<json> lines = read_lines(path);
  REQUIRE(lines.size() == 3);
  // The world size varies fastest: (0.002 MiB: 1, 2), (25 MiB: [1 = the same baseline], 2).
  const std::vector<std::pair<int, double>> expected = {{1, 0.002}, {2, 0.002}, {2, 25}};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(i);
    check_record(lines[i], expected[i].first, 24, 32, 2, 8, 16, "weak");
    if (expected[i].first > 1) {
      CHECK(lines[i]["config"]["bucket_cap_mb"].get<double>() == expected[i].second);
    }
    CHECK(lines[i]["steps"] == 5);
    CHECK(lines[i]["warmup"] == 2);
  }
  // Both DDP points are compared with the one baseline.
  const double base = lines[0]["samples_per_s"].get<double>();
  for (std::size_t i : {1, 2}) {
    CHECK(lines[i]["scaling_efficiency"].get<double>() ==
          doctest::Approx(lines[i]["samples_per_s"].get<double>() / (2 * base)).epsilon(1e-12));
  }
  // A 2 KiB bucket cap cuts the 12 KiB of gradients into more buckets than a 25 MiB one.
  CHECK(lines[1]["config"]["buckets"].get<int>() > lines[2]["config"]["buckets"].get<int>());
}

TEST_CASE("bench-ddp: strong scaling splits the global batch, with a baseline not in --world") {
  TempDir dir;
  const std::string path = dir.file("strong.jsonl");
  const ProcessResult r =
      bench({"--world", "2", "--scaling", "strong", "--batch", "8", "--hidden", "16", "--layers",
             "1", "--steps", "3", "--warmup", "1", "--overlap", "off", "--json", path, "--quiet"});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  CHECK(r.output.empty());  // --quiet
  const std::vector<json> lines = read_lines(path);
  REQUIRE(lines.size() == 2);  // the baseline (not in --world, written too), then the point
  CHECK(lines[0]["baseline"] == true);
  CHECK(lines[0]["config"]["global_batch"] == 8);  // one process: the whole global batch
  check_record(lines[1], 2, 16, 16, 1, 16, 4, "strong");
  CHECK(lines[1]["config"]["global_batch"] == 8);
  CHECK(lines[1]["config"]["overlap"] == false);
  // Overlap off: nothing is hidden behind backward.
  CHECK(lines[1]["overlap_fraction"] == 0.0);
  CHECK(lines[1]["hidden_comm_ms"] == 0.0);
  CHECK(lines[1]["exposed_comm_ms"] == lines[1]["allreduce_ms"]);
  for (const auto& launch : lines[1]["samples"])
    CHECK(launch["exposed_comm_ms"] == launch["allreduce_ms"]);
}

TEST_CASE("bench-ddp: --optimizer-in-backward on,off sweeps both ways of stepping") {
  TempDir dir;
  const std::string path = dir.file("inbwd.jsonl");
  const ProcessResult r = bench({"--world",
                                 "1,2",
                                 "--hidden",
                                 "16",
                                 "--layers",
                                 "2",
                                 "--batch",
                                 "8",
                                 "--steps",
                                 "3",
                                 "--warmup",
                                 "1",
                                 "--bucket-cap-mb",
                                 "0.001",
                                 "--first-bucket-mb",
                                 "0.001",
                                 "--optimizer-in-backward",
                                 "on,off",
                                 "--json",
                                 path});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  // The optim column of each row (a search for "after" matched the legend's "after 1 warm-up").
  const auto rows = table_rows(r.output);
  REQUIRE(rows.size() == 4);  // the header and three rows
  const auto optim = std::find(rows[0].begin(), rows[0].end(), std::string("optim"));
  REQUIRE(optim != rows[0].end());
  const auto at = static_cast<std::size_t>(optim - rows[0].begin());
  CHECK(rows[1][at] == "plain");
  CHECK(rows[2][at] == "inbwd");
  CHECK(rows[3][at] == "after");
  const std::vector<json> lines = read_lines(path);
  REQUIRE(lines.size() == 3);
  // The plain baseline (no DDP, the optimizer after backward) is shared by on and off.
  const std::vector<std::pair<int, bool>> expected = {{1, false}, {2, true}, {2, false}};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(i);
    CHECK(lines[i]["config"]["world_size"] == expected[i].first);
    CHECK(lines[i]["config"]["optimizer_in_backward"] == expected[i].second);
    CHECK(lines[i]["step_ms_median"].get<double>() > 0);
  }
  CHECK(lines[0]["baseline"] == true);
  CHECK(lines[0]["scaling_efficiency"].get<double>() == 1.0);
}

TEST_CASE("bench-ddp: --zero 0,1,2 shards the optimizer state, then the averaged gradients") {
  TempDir dir;
  const std::string path = dir.file("zero.jsonl");
  // Every parameter's size is even (64 x 64 weights, 64 biases), so every bucket's is too and
  // rank 0's chunk of each is exactly half of it (zero.h): the shards are half of the whole.
  // 8 layers of 64 x 64 + 64, one bucket each: stage 2's two bucket buffers are a quarter of
  // the gradients.
  const ProcessResult r = bench({"--world",         "2",     "--hidden",          "64",
                                 "--layers",        "7",     "--batch",           "8",
                                 "--steps",         "3",     "--warmup",          "1",
                                 "--bucket-cap-mb", "0.01",  "--first-bucket-mb", "0.01",
                                 "--zero",          "0,1,2", "--comm-hook",       "allreduce,bf16",
                                 "--json",          path});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  const std::vector<json> lines = read_lines(path);
  // The shared baseline, then per hook the three stages (the world size varies fastest).
  REQUIRE(lines.size() == 7);
  const std::int64_t n = mlp_params(64, 64, 7, 64);
  CHECK(n == 8 * (64 * 64 + 64));
  CHECK(lines[0]["baseline"] == true);
  CHECK(lines[0]["optimizer_state_bytes"] == 8 * n);
  for (std::size_t i = 1; i <= 3; ++i) {
    CAPTURE(i);
    CHECK(lines[i]["config"]["comm_hook"] == "allreduce");
    CHECK(lines[i]["config"]["zero_stage"] == static_cast<int>(i - 1));
    CHECK(lines[i]["config"]["buckets"].get<int>() == 8);
    check_record(lines[i], 2, 64, 64, 7, 64, 8, "weak");
  }
  const json& z0 = lines[1];
  const json& z1 = lines[2];
  const json& z2 = lines[3];
  // Stage 1: half the optimizer state; stage 2 also half the averaged gradients, and instead of
  // the flat gradient buffer at most two buckets' buffers (2 of 8: n / 4 elements) at a time.
  CHECK(z0["optimizer_state_bytes"] == 8 * n);
  CHECK(z1["optimizer_state_bytes"] == 4 * n);
  CHECK(z2["optimizer_state_bytes"] == 4 * n);
  CHECK(z0["averaged_gradient_bytes"] == 4 * n);
  CHECK(z1["averaged_gradient_bytes"] == 4 * n);
  CHECK(z2["averaged_gradient_bytes"] == 2 * n);
  CHECK(z0["gradient_bytes"] == 4 * n);
  CHECK(z1["gradient_bytes"] == 4 * n);
  CHECK(z2["gradient_bytes"] == 4 * (n / 4) + 2 * n);
  // The parameter all-gather runs in place: no staging buffer on top of the parameters.
  CHECK(z0["parameter_bytes"] == 4 * n);
  CHECK(z1["parameter_bytes"] == 4 * n);
  CHECK(z2["parameter_bytes"] == 4 * n);
  // The bf16 hook is accepted under ZeRO (the library compresses the reduce-scatter): stage 2
  // also holds the bf16 copies of the two buckets and of its shard (2 bytes per element).
  for (std::size_t i = 4; i <= 6; ++i) {
    CAPTURE(i);
    CHECK(lines[i]["config"]["comm_hook"] == "bf16");
    CHECK(lines[i]["config"]["zero_stage"] == static_cast<int>(i - 4));
    CHECK(lines[i]["step_ms_median"].get<double>() > 0);
  }
  CHECK(lines[5]["optimizer_state_bytes"] == 4 * n);
  CHECK(lines[6]["averaged_gradient_bytes"] == 2 * n);
  CHECK(lines[6]["gradient_bytes"] == 4 * (n / 4) + 2 * (n / 4) + 2 * n + n);

  // The table: a zero column and the memory in MiB with two decimals, rank 0's.
  const auto rows = table_rows(r.output);
  REQUIRE(rows.size() == 8);  // the header and seven rows
  const auto column = [&](const std::string& name) {
    const auto it = std::find(rows[0].begin(), rows[0].end(), name);
    REQUIRE(it != rows[0].end());
    return static_cast<std::size_t>(it - rows[0].begin());
  };
  const std::size_t zero = column("zero"), optst = column("optst"), avggrad = column("avggrad");
  const auto mib = [](std::int64_t bytes) {
    return fmt::format("{:.2f}", static_cast<double>(bytes) / (1024.0 * 1024.0));
  };
  CHECK(rows[1][zero] == "-");  // the baseline: no DDP
  for (std::size_t i = 1; i <= 3; ++i) {
    CAPTURE(i);
    REQUIRE(rows[i + 1].size() > optst);
    CHECK(rows[i + 1][zero] == std::to_string(i - 1));
    CHECK(rows[i + 1][optst] == mib(lines[i]["optimizer_state_bytes"].get<std::int64_t>()));
    CHECK(rows[i + 1][avggrad] == mib(lines[i]["averaged_gradient_bytes"].get<std::int64_t>()));
  }
  CHECK(rows[2][optst] != rows[3][optst]);  // 0.25 against 0.13 MiB: visible at two decimals
}

TEST_CASE(
    "bench-ddp: --zero-overlap-gather off,on sweeps the gather after the step and in forward") {
  TempDir dir;
  const std::string path = dir.file("ov.jsonl");
  const ProcessResult r = bench({"--world",
                                 "2",
                                 "--hidden",
                                 "64",
                                 "--layers",
                                 "3",
                                 "--batch",
                                 "8",
                                 "--steps",
                                 "4",
                                 "--warmup",
                                 "1",
                                 "--bucket-cap-mb",
                                 "0.01",
                                 "--first-bucket-mb",
                                 "0.01",
                                 "--zero",
                                 "0,1",
                                 "--zero-overlap-gather",
                                 "off,on",
                                 "--json",
                                 path});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  const std::vector<json> lines = read_lines(path);
  // The baseline, stage 0 (no all-gather: run off only), stage 1 off, stage 1 on.
  REQUIRE(lines.size() == 4);
  CHECK(lines[1]["config"]["zero_stage"] == 0);
  CHECK(lines[1]["config"]["zero_overlap_gather"] == false);
  CHECK(lines[2]["config"]["zero_stage"] == 1);
  CHECK(lines[2]["config"]["zero_overlap_gather"] == false);
  CHECK(lines[3]["config"]["zero_stage"] == 1);
  CHECK(lines[3]["config"]["zero_overlap_gather"] == true);
  for (std::size_t i = 1; i < 4; ++i) check_record(lines[i], 2, 64, 64, 3, 64, 8, "weak");
  CHECK(lines[3]["optimizer_state_bytes"] == lines[2]["optimizer_state_bytes"]);
  const auto rows = table_rows(r.output);
  REQUIRE(rows.size() == 5);
  const auto it = std::find(rows[0].begin(), rows[0].end(), std::string("zero"));
  REQUIRE(it != rows[0].end());
  const auto zero = static_cast<std::size_t>(it - rows[0].begin());
  CHECK(rows[3][zero] == "1");
  CHECK(rows[4][zero] == "1+ov");

  const ProcessResult alone = bench({"--world", "2", "--hidden", "16", "--layers", "1", "--steps",
                                     "2", "--zero-overlap-gather", "on"});
  CHECK(alone.exit_code == 2);
  CHECK(alone.output.find("--zero-overlap-gather on overlaps ZeRO's parameter all-gather") !=
        std::string::npos);
  // With "on" alone a --zero 0 point still runs, off (an outside tester found it dropped).
  const std::string on_path = dir.file("on.jsonl");
  const ProcessResult on =
      bench({"--world", "2", "--hidden", "16", "--layers", "1", "--steps", "2", "--warmup", "1",
             "--zero", "0,1", "--zero-overlap-gather", "on", "--json", on_path});
  INFO(on.output);
  REQUIRE(on.exit_code == 0);
  const std::vector<json> on_lines = read_lines(on_path);
  REQUIRE(on_lines.size() == 3);  // the baseline, zero 0 (off), zero 1 (on)
  CHECK(on_lines[1]["config"]["zero_stage"] == 0);
  CHECK(on_lines[1]["config"]["zero_overlap_gather"] == false);
  CHECK(on_lines[2]["config"]["zero_overlap_gather"] == true);
}

TEST_CASE("bench-ddp: --zero at --world 1 is said: the 1-rank point is the plain baseline") {
  // A tester's finding: --zero 1,2 --world 1 gave one row (zero_stage 0) and no word that the
  // stages asked were not measured.
  TempDir dir;
  const std::string path = dir.file("z.jsonl");
  const ProcessResult r = bench({"--world", "1", "--hidden", "16", "--layers", "1", "--batch", "8",
                                 "--steps", "2", "--warmup", "1", "--zero", "1,2", "--json", path});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  const std::string said = "--zero 1,2 at --world 1: one rank has no DDP and nothing to shard";
  CHECK(r.output.find("nanoddp-bench-ddp: note: " + said) != std::string::npos);
  CHECK(r.output.find("no-zero@1") != std::string::npos);  // the table's flag
  const std::vector<json> lines = read_lines(path);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["baseline"] == true);
  bool noted = false;
  for (const auto& w : lines[0]["warnings"]) {
    noted = noted || w.get<std::string>().rfind(said, 0) == 0;
  }
  CHECK(noted);
  // Without a ZeRO stage asked, or without world 1, nothing is said.
  const ProcessResult plain = bench({"--world", "1", "--hidden", "16", "--layers", "1", "--batch",
                                     "8", "--steps", "2", "--warmup", "1", "--zero", "0"});
  CHECK(plain.exit_code == 0);
  CHECK(plain.output.find("at --world 1") == std::string::npos);
}

TEST_CASE("bench-ddp: a job that overruns --timeout is stopped and named") {
  const ProcessResult r = bench({"--world", "1", "--hidden", "16", "--layers", "1", "--steps",
                                 "100000000", "--warmup", "0", "--timeout", "1"});
  INFO(r.output);
  REQUIRE(!r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("timed out after 1 s") != std::string::npos);
  CHECK(r.output.find("point: --world 1 (x 1 node(s)) --plain") != std::string::npos);
  CHECK(r.output.find("--steps 100000000") != std::string::npos);
}

TEST_CASE("bench-ddp: bad flags exit 2 with a message naming the flag") {
  struct Case {
    std::vector<std::string> flags;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"--no-such-flag"}, "--no-such-flag"},
      {{"--world", "0"}, "--world"},
      {{"--world", "1,x"}, "--world"},
      {{"--scaling", "strong", "--world", "1,3", "--batch", "8"}, "--batch 8"},
      {{"--overlap", "sometimes"}, "--overlap"},
      {{"--optimizer-in-backward", "maybe"}, "--optimizer-in-backward"},
      {{"--bucket-cap-mb", "-1"}, "--bucket-cap-mb"},
      {{"--nnodes", "2"}, "--master-addr"},
      {{"--json", "/nonexistent-dir/x.jsonl"}, "--json"},
      {{"--csv", "/nonexistent-dir/x.csv"}, "--csv /nonexistent-dir/x.csv"},
      {{"--repeats", "0"}, "--repeats"},
      {{"--zero", "3"}, "--zero: 3 is out of range [0, 2]"},
      {{"--zero", ""}, "--zero ''"},
      {{"--zero", "0,1", "--optimizer-in-backward", "off,on"},
       "--zero 0,1 cannot be combined with --optimizer-in-backward on"},
      // An outside tester's: a model twice the machine's memory ran until its timeout.
      {{"--world", "2", "--hidden", "1048576", "--layers", "2", "--batch", "4"},
       "--hidden 1048576 --layers 2 --batch 4 at --world 2: the parameters, gradients, optimizer "
       "state and activations need about"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = bench(c.flags);
    CAPTURE(c.names);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.names) != std::string::npos);
  }
  // --help lists the sweep flags, but not the worker's.
  const ProcessResult help = bench({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("--bucket-cap-mb") != std::string::npos);
  CHECK(help.output.find("--worker") == std::string::npos);
}

TEST_CASE("bench-ddp: --repeats launches each point again: spread, CSV, provenance and flags") {
  TempDir dir;
  const std::string path = dir.file("rep.jsonl");
  const std::string csv = dir.file("rep.csv");
  // More GEMM threads than this machine has cores: flagged on the baseline's row.
  const int threads = static_cast<int>(std::thread::hardware_concurrency()) + 1;
  const ProcessResult r = bench({"--world",   "1,2,2", "--hidden",  "16",
                                 "--layers",  "1",     "--batch",   "8",
                                 "--steps",   "3",     "--warmup",  "1",
                                 "--repeats", "2",     "--threads", std::to_string(threads) + ",1",
                                 "--json",    path,    "--csv",     csv});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  // --world 3,2,2: the duplicate is measured once, and said so.
  CHECK(r.output.find("--world 1,2,2: a value is given more than once") != std::string::npos);
  CHECK(r.output.find("ranks>cores") != std::string::npos);
  CHECK(r.output.find("commit ") != std::string::npos);
  const std::vector<json> lines = read_lines(path);
  // threads N: baseline, world 2; threads 1: baseline, world 2.
  REQUIRE(lines.size() == 4);
  for (const json& l : lines) {
    CAPTURE(l.dump());
    CHECK(l["repeats"] == 2);
    CHECK(l["samples"].size() == 2);
    CHECK(l["repeat_step_ms_median"].size() == 2);
    CHECK(l["step_ms_ci95_launches"].is_null());  // 2 launches: too few for an interval
    CHECK(l["provenance"]["utc"].get<std::string>().size() == 20);
    CHECK(l["provenance"]["load_average"].size() == 3);
  }
  CHECK(lines[0]["config"]["threads"] == threads);
  // (A busy machine adds a "load average" warning to any row: not what is checked here.)
  const auto own_warnings = [](const json& l) {
    std::vector<std::string> out;
    for (const auto& w : l["warnings"]) {
      if (w.get<std::string>().rfind("load average", 0) != 0) out.push_back(w);
    }
    return out;
  };
  REQUIRE(own_warnings(lines[0]).size() == 1);
  CHECK(own_warnings(lines[0])[0].find("more threads than cores") != std::string::npos);
  CHECK(own_warnings(lines[2]).empty());  // 1 thread, 1 rank
  check_record(lines[3], 2, 16, 16, 1, 16, 8, "weak");

  // The CSV: a header and one row per JSON line, with the provenance columns.
  std::ifstream in(csv);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(line);
  REQUIRE(rows.size() == 5);
  CHECK(rows[0].rfind("world_size,nnodes,", 0) == 0);
  CHECK(rows[0].find(",commit,dirty,utc,load_average_1m,command") != std::string::npos);
  CHECK(rows[1].find(lines[0]["provenance"]["commit"].get<std::string>()) != std::string::npos);
}
