// nanoddp-train's step makes one host synchronization (engine/host_sync.h): the read of the
// step's health vector (every rank's loss and the gradients' NaN/Inf count, gathered on the
// device, one small all-reduce under DDP). Counted on the CPU as a GPU run would count them;
// the figure is the metrics line's host_syncs_per_step.

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "support/subprocess.h"

using nanoddp::testing::bin_path;
using nanoddp::testing::ProcessResult;
using nanoddp::testing::run_process;
using nanoddp::testing::TempDir;

namespace {

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<std::string> small_run(const std::string& metrics) {
  return {bin_path("nanoddp-train"),
          "--in",
          "16",
          "--out",
          "4",
          "--hidden",
          "32",
          "--layers",
          "2",
          "--batch",
          "8",
          "--steps",
          "6",
          "--log-every",
          "3",
          "--quiet",
          "--metrics",
          metrics};
}

}  // namespace

TEST_CASE("nanoddp-train: one host synchronization per step, one process and two ranks") {
  TempDir dir;
  const std::string one = dir.file("one.jsonl");
  const ProcessResult single = run_process(small_run(one));
  REQUIRE_MESSAGE(single.exit_code == 0, single.output);

  const std::string two = dir.file("two.jsonl");
  std::vector<std::string> launched = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  const std::vector<std::string> args = small_run(two);
  launched.insert(launched.end(), args.begin(), args.end());
  const ProcessResult ddp = run_process(launched);
  REQUIRE_MESSAGE(ddp.exit_code == 0, ddp.output);

  for (const std::string& path : {one, two}) {
    const auto lines = metrics_lines(path);
    REQUIRE(lines.size() == 3);  // steps 1 (always logged), 3 and 6
    for (const nlohmann::json& line : lines) {
      CAPTURE(line.dump());
      REQUIRE(line.contains("host_syncs_per_step"));
      CHECK(line.at("host_syncs_per_step").get<double>() == 1.0);
    }
  }
}

TEST_CASE("nanoddp-train --optimizer-in-backward: its NaN/Inf count is one more read") {
  TempDir dir;
  const std::string path = dir.file("inbwd.jsonl");
  std::vector<std::string> args = small_run(path);
  args.push_back("--optimizer-in-backward");
  const ProcessResult r = run_process(args);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  for (const nlohmann::json& line : metrics_lines(path)) {
    CAPTURE(line.dump());
    CHECK(line.at("host_syncs_per_step").get<double>() == 2.0);
  }
}
