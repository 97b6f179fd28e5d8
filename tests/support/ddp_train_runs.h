#pragma once
// The nanoddp-train runs the DDP and ZeRO tests share: one small model in several buckets
// (seconds per run; buckets of 725 and 312 elements leave left-over elements on 2 and 3 ranks),
// a bounded timeout, and the check that every rank of a run succeeded.

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/world.h"

namespace nanoddp::testing {

inline std::vector<std::string> train_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {bin_path("nanoddp-train"),
                                   "--in",
                                   "12",
                                   "--out",
                                   "5",
                                   "--hidden",
                                   "24",
                                   "--layers",
                                   "2",
                                   "--dataset-size",
                                   "4096",
                                   "--quiet",
                                   "--first-bucket-mb",
                                   "0.001",
                                   "--bucket-cap-mb",
                                   "0.002"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

inline ProcessOptions quick(const std::map<std::string, std::string>& env = {}) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(90);
  options.env["NANODDP_TIMEOUT_S"] = "30";
  for (const auto& [key, value] : env) options.env[key] = value;
  return options;
}

inline void require_success(const std::vector<ProcessResult>& results) {
  INFO(describe(results));
  for (const auto& r : results) REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
}

}  // namespace nanoddp::testing
