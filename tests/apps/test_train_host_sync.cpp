// nanoddp-train's host synchronizations (engine/host_sync.h): a step that is not logged makes
// none; a logged one reads the health of the steps since the last read (every rank's loss and
// the gradients' NaN/Inf count, gathered on the device, one small all-reduce per step under
// DDP) in one copy. Counted on the CPU as a GPU run would count them; the figure is the metrics
// line's host_syncs_per_step (over the steps since the last line).

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <utility>
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

// The host synchronizations of a metrics line's window.
double window_syncs(const nlohmann::json& line) {
  return line.at("host_syncs_per_step").get<double>() * line.at("steps_in_window").get<double>();
}

TEST_CASE("nanoddp-train: one host synchronization per logged step, none in between") {
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
      CHECK(window_syncs(line) == doctest::Approx(1.0));
    }
    CHECK(lines.back().at("steps_in_window") == 3);
  }
}

TEST_CASE("nanoddp-train: --skip-nonfinite reads every step, --optimizer-in-backward twice") {
  // --skip-nonfinite decides each step on the spot; the optimizer in backward counts its
  // NaN/Inf values on the host (one read) before the health is read.
  for (const auto& [flag, per_step] : {std::pair<std::string, double>{"--skip-nonfinite", 1.0},
                                       {"--optimizer-in-backward", 2.0}}) {
    CAPTURE(flag);
    TempDir dir;
    const std::string path = dir.file("m.jsonl");
    std::vector<std::string> args = small_run(path);
    args.push_back(flag);
    const ProcessResult r = run_process(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    for (const nlohmann::json& line : metrics_lines(path)) {
      CAPTURE(line.dump());
      CHECK(line.at("host_syncs_per_step").get<double>() == per_step);
    }
  }
}
