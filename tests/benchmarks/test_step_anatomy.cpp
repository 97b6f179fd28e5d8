// benchmarks/step-anatomy.sh on tiny settings: it runs nanoddp-bench-gemm and four nanoddp-train
// configurations and prints one row per configuration. The figures are not asserted (shared
// machine); their presence and consistency are.
#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

std::string anatomy_script() {
  const char* source = std::getenv("NANODDP_SOURCE_DIR");
  REQUIRE_MESSAGE(source != nullptr, "NANODDP_SOURCE_DIR is not set (run the tests with ctest)");
  return std::string(source) + "/benchmarks/step-anatomy.sh";
}

ProcessResult anatomy(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {anatomy_script()};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  const char* bin_dir = std::getenv("NANODDP_BIN_DIR");
  REQUIRE_MESSAGE(bin_dir != nullptr, "NANODDP_BIN_DIR is not set (run the tests with ctest)");
  options.env["NANODDP_BIN_DIR"] = bin_dir;
  return run_process(argv, options);
}

}  // namespace

TEST_CASE("step-anatomy.sh: one row per optimizer and mode, phases within the step") {
  const ProcessResult r =
      anatomy({"--hidden", "48", "--batch", "8", "--layers", "2", "--steps", "20"});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  CHECK(r.output.find("GEMMs of one step:") != std::string::npos);
  // optimizer, mode, forward, backward, optimizer, step, x warm, x cold, data
  const std::regex row(
      R"((sgd|adamw)\s+(after|in-backward)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)x\s+([0-9.]+)x\s+([0-9.]+))");
  int rows = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    ++rows;
    CAPTURE(line);
    const double forward = std::stod(m[3]), backward = std::stod(m[4]), optimizer = std::stod(m[5]),
                 step = std::stod(m[6]);
    CHECK(step > 0);
    // Medians of each phase need not add up exactly, but none can exceed the step by much.
    CHECK(forward <= step * 1.01);
    CHECK(backward <= step * 1.01);
    // With the optimizer in backward nothing is left to do after it but the NaN/Inf check.
    if (m[2] == "in-backward") CHECK(optimizer < 0.5 * step);
    CHECK(std::stod(m[7]) > 0);
  }
  CHECK(rows == 4);
}

TEST_CASE("step-anatomy.sh: a bad argument is refused with exit code 2") {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--hidden", "wide"}, std::vector<std::string>{"--frobnicate"},
        std::vector<std::string>{"--steps", "5"}}) {
    const ProcessResult r = anatomy(args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("step-anatomy.sh:") != std::string::npos);
  }
}

TEST_CASE("step-anatomy.sh: a flag without its value, or given twice, is refused with exit 2") {
  // Before: "--hidden" last died with bash's "$2: unbound variable", and "--hidden 32 --hidden
  // 64" measured 64 without a word.
  const ProcessResult bare = anatomy({"--batch", "8", "--hidden"});
  INFO(bare.output);
  CHECK(bare.exit_code == 2);
  CHECK(bare.output.find("step-anatomy.sh: --hidden needs a value") != std::string::npos);
  CHECK(bare.output.find("unbound variable") == std::string::npos);
  const ProcessResult twice = anatomy({"--hidden", "32", "--batch", "8", "--hidden", "64"});
  INFO(twice.output);
  CHECK(twice.exit_code == 2);
  CHECK(twice.output.find("step-anatomy.sh: --hidden is given twice") != std::string::npos);
  CHECK(twice.output.find("GEMMs of one step") == std::string::npos);  // nothing ran
}

// A second tester's: --hidden 0 was refused as bench-gemm's --sizes, a flag nobody typed; and
// --help printed a line of the script.
TEST_CASE("step-anatomy.sh: a size out of range is refused by its own name, and --help is clean") {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--hidden", "0"}, {"--layers", "1000"}, {"--batch", "99999999999"}}) {
    const ProcessResult r = anatomy({flag, value});
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("step-anatomy.sh: " + flag + " " + value + " is out of range") !=
          std::string::npos);
    CHECK(r.output.find("--sizes") == std::string::npos);
  }
  const ProcessResult help = anatomy({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("set -euo") == std::string::npos);
}
