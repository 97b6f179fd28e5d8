#pragma once
// The nanoddp-train runs the DDP and ZeRO tests share: one small model in several buckets
// (seconds per run; buckets of 725 and 312 elements leave left-over elements on 2 and 3 ranks),
// a bounded timeout, and the check that every rank of a run succeeded.

#include <doctest/doctest.h>

#include <chrono>
#include <future>
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

// Two ranks of one job started by hand, each with its own argv (run_world gives every rank the
// same one): how the tests give one rank a different flag.
inline std::vector<ProcessResult> two_ranks_with(const std::vector<std::string>& argv0,
                                                 const std::vector<std::string>& argv1) {
  const int port = free_port();
  auto rank = [&](int r, const std::vector<std::string>& argv) {
    ProcessOptions o = quick();
    o.env = {{"RANK", std::to_string(r)},
             {"WORLD_SIZE", "2"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(port)},
             {"NANODDP_TIMEOUT_S", "20"}};
    return std::async(std::launch::async, [=] { return run_process(argv, o); });
  };
  auto a = rank(0, argv0);
  auto b = rank(1, argv1);
  return {a.get(), b.get()};
}

}  // namespace nanoddp::testing
