// benchmarks/rendezvous-scale.sh on small sizes: N launchers of one elastic job on loopback. The
// figures are not asserted (shared machine); that every size ran, and that they are
// consistent with each other, is.
#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

ProcessResult scale(const std::vector<std::string>& args) {
  const char* source = std::getenv("NANODDP_SOURCE_DIR");
  const char* bin_dir = std::getenv("NANODDP_BIN_DIR");
  REQUIRE_MESSAGE((source != nullptr && bin_dir != nullptr),
                  "NANODDP_SOURCE_DIR or NANODDP_BIN_DIR is not set (run the tests with ctest)");
  std::string script = source;
  script += "/benchmarks/rendezvous-scale.sh";
  std::vector<std::string> argv = {script};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_BIN_DIR"] = bin_dir;
  options.env.emplace("NANODDP_SCALE_WINDOW_S", "1");  // not operator[]: GCC 12 warns falsely
  return run_process(argv, options);
}

}  // namespace

TEST_CASE("rendezvous-scale.sh: one JSON line and one table row per size") {
  const ProcessResult r = scale({"2", "5"});
  INFO(r.output);
  REQUIRE((!r.timed_out && !r.signaled && r.exit_code == 0));
  const std::regex json(
      R"re(\{"n": ([0-9]+), "form_s": ([0-9.]+), "server_cpu_per_s": ([0-9.]+), "launchers_cpu_per_s": ([0-9.]+), "store_bytes_per_s": ([0-9]+), "total_s": ([0-9.]+)\})re");
  const std::regex row(
      R"(^\| ([0-9]+) \| ([0-9.]+) s \| ([0-9.]+) % of a core \| ([0-9.]+) % \| ([0-9.]+) KB/s \|$)");
  std::vector<int> sizes, rows;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, json)) {
      CAPTURE(line);
      sizes.push_back(std::stoi(m[1]));
      const double server = std::stod(m[3]), all = std::stod(m[4]);
      CHECK(server <= all + 1e-9);                // the store's launcher is one of them
      CHECK(std::stod(m[5]) > 0);                 // the store's launcher served requests
      CHECK(std::stod(m[6]) >= std::stod(m[2]));  // formed before it ended
    } else if (std::regex_search(line, m, row)) {
      rows.push_back(std::stoi(m[1]));
    }
  }
  CHECK(sizes == std::vector<int>{2, 5});
  CHECK(rows == std::vector<int>{2, 5});
}

TEST_CASE("rendezvous-scale.sh: a size that is not a positive integer is refused, naming it") {
  for (const char* bad : {"0", "x", "-3"}) {
    CAPTURE(bad);
    const ProcessResult r = scale({bad});
    CHECK(r.exit_code == 2);
    std::string named = "not '";
    named += bad;
    named += '\'';
    CHECK(r.output.find(named) != std::string::npos);
  }
}
