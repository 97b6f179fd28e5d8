// nanoddp-bench-allreduce end to end: real processes under real Gloo, every row's result
// checked against its closed form (-c 1), the JSON lines parsed field by field. No timing
// assertions: the figures are what the benchmark is for, the test only checks they are sane.

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/world.h"

using namespace nanoddp::testing;

namespace {

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

ProcessOptions quick(std::map<std::string, std::string> env = {}) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(90);
  options.env = std::move(env);
  options.env["NANODDP_TIMEOUT_S"] = "30";
  return options;
}

// Sizes 8 B, 4 KiB, 2 MiB: one element pair, a partial ring chunk, several chunks.
const std::vector<std::string> kSizes = {"-b", "8", "-e", "2M", "-f", "512", "-n", "3", "-w", "1"};

void check_line(const nlohmann::json& l, const std::string& mode, int ranks) {
  CHECK(l.at("benchmark") == "allreduce");
  CHECK(l.at("backend") == "gloo");
  CHECK(l.at("mode") == mode);
  CHECK(l.at("ranks") == ranks);
  CHECK(l.at("bytes").get<std::int64_t>() == 4 * l.at("count").get<std::int64_t>());
  CHECK(l.at("time_us").get<double>() > 0);
  const double algbw = l.at("algbw_gbps").get<double>();
  const double expected_algbw =
      static_cast<double>(l.at("bytes").get<std::int64_t>()) / l.at("time_us").get<double>() / 1e3;
  CHECK(algbw == doctest::Approx(expected_algbw).epsilon(1e-9));
  CHECK(l.at("busbw_gbps").get<double>() ==
        doctest::Approx(algbw * 2.0 * (ranks - 1) / ranks).epsilon(1e-9));
}

}  // namespace

TEST_CASE("bench-allreduce: 3 ranks through the process group, every result correct") {
  TempDir dir;
  std::vector<std::string> argv = {bin_path("nanoddp-bench-allreduce"), "--op", "avg", "--json",
                                   dir.file("a.jsonl")};
  argv.insert(argv.end(), kSizes.begin(), kSizes.end());
  const auto results = run_world(argv, 3, quick());
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(lines.size() == 3);
  std::vector<std::int64_t> bytes;
  for (const auto& l : lines) {
    check_line(l, "nanoddp", 3);
    CHECK(l.at("op") == "avg");
    CHECK(l.at("wrong") == 0);  // every element of every rank matched the closed form
    bytes.push_back(l.at("bytes").get<std::int64_t>());
  }
  CHECK(bytes == std::vector<std::int64_t>{8, 4096, 2097152});
  CHECK(results[0].output.find("busbw(GB/s)") != std::string::npos);
}

TEST_CASE("bench-allreduce: --vs-raw measures the engine and raw Gloo in one run") {
  TempDir dir;
  std::vector<std::string> argv = {
      bin_path("nanoddp-bench-allreduce"), "--vs-raw", "-r", "2", "--json", dir.file("a.jsonl")};
  argv.insert(argv.end(), kSizes.begin(), kSizes.end());
  // Over TCP on both sides, the comparison the flag is for.
  const auto results = run_world(argv, 2, quick({{"NANODDP_SHM", "0"}}));
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(lines.size() == 6);  // per size: the engine's line, then raw's
  for (std::size_t i = 0; i < lines.size(); i += 2) {
    check_line(lines[i], "nanoddp", 2);
    check_line(lines[i + 1], "raw", 2);
    CHECK(lines[i].at("bytes") == lines[i + 1].at("bytes"));
    CHECK(lines[i].at("wrong") == 0);
    CHECK(lines[i + 1].at("wrong") == 0);  // raw Gloo's result is checked too
    CHECK(lines[i].at("rounds") == 2);
  }
  CHECK(lines[0]
            .at("algorithm")
            .get<std::string>()
            .find("process group allreduce; transport: "
                  "TCP ring") != std::string::npos);
  CHECK(lines[1]
            .at("algorithm")
            .get<std::string>()
            .find("as used by gloo::allreduce; "
                  "transport: TCP ring") != std::string::npos);
  CHECK(results[0].output.find("busbw/raw") != std::string::npos);
}

TEST_CASE("bench-allreduce: --raw runs straight on Gloo and its results are correct") {
  TempDir dir;
  std::vector<std::string> argv = {
      bin_path("nanoddp-bench-allreduce"), "--raw", "--op", "max", "--json", dir.file("a.jsonl")};
  argv.insert(argv.end(), kSizes.begin(), kSizes.end());
  const auto results = run_world(argv, 2, quick());
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(lines.size() == 3);
  for (const auto& l : lines) {
    check_line(l, "raw", 2);
    CHECK(l.at("wrong") == 0);
  }
}

TEST_CASE("bench-allreduce: bad flags exit 2 with a message naming them") {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--bogus"}, "--bogus"},        {{"-b", "1M", "-e", "1K"}, "minbytes"},
      {{"-b", "12Q"}, "12Q"},          {{"--raw", "--vs-raw"}, "--vs-raw"},
      {{"--op", "prod"}, "--op prod"}, {{"-n", "0"}, "--iters"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {bin_path("nanoddp-bench-allreduce")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const ProcessResult r = run_process(argv, quick());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
  }
}
