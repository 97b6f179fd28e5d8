#pragma once
// The simulator as its tests run it: the real nanoddp-sim with a bounded timeout, and the small
// MLP model most cases describe.

#include <chrono>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace nanoddp::testing {

inline ProcessResult sim(std::vector<std::string> args) {
  args.insert(args.begin(), bin_path("nanoddp-sim"));
  ProcessOptions options;
  options.timeout = std::chrono::seconds(60);
  return run_process(args, options);
}

inline const std::vector<std::string> kSimModel = {"--model", "mlp",      "--hidden",
                                                   "256",     "--layers", "2"};

// kSimModel followed by `extra`.
inline std::vector<std::string> model(std::vector<std::string> extra) {
  std::vector<std::string> args = kSimModel;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace nanoddp::testing
