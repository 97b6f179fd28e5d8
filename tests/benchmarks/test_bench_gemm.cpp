// nanoddp-bench-gemm end to end on small shapes: the rows it promises, in its JSON lines, with
// GFLOP/s consistent with the shapes and times it reports. No timing assertions.

#include <doctest/doctest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

// The smallest run: one square, tiny MLP shapes, one timed call each.
std::vector<std::string> tiny_gemm(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {bin_path("nanoddp-bench-gemm"),
                                   "--sizes",
                                   "8",
                                   "--batch",
                                   "2",
                                   "--hidden",
                                   "8",
                                   "--linears",
                                   "1",
                                   "--repeats",
                                   "1",
                                   "--warmup",
                                   "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace

TEST_CASE("bench-gemm: every shape has an Eigen row and both nanoddp rows, GFLOP/s match") {
  TempDir dir;
  const ProcessResult r = run_process(
      {bin_path("nanoddp-bench-gemm"), "--sizes", "32,48", "--batch", "8", "--hidden", "40",
       "--repeats", "3", "--warmup", "1", "--linears", "3", "--json", dir.file("g.jsonl")});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(dir.file("g.jsonl"));
  std::map<std::string, std::set<std::string>> backends_of_shape;
  std::string text;
  int mlp_steps = 0;
  std::map<std::string, double> step_ms, step_ratio;
  while (std::getline(in, text)) {
    const auto l = nlohmann::json::parse(text);
    CHECK(l.at("benchmark") == "gemm");
    const auto m = l.at("m").get<double>(), n = l.at("n").get<double>(),
               k = l.at("k").get<double>(), gemms = l.at("gemms").get<double>();
    const double ms = l.at("median_ms").get<double>();
    REQUIRE(ms > 0);
    CHECK(l.at("gflops").get<double>() ==
          doctest::Approx(2 * m * n * k * gemms / (ms * 1e-3) * 1e-9).epsilon(1e-9));
    CHECK(l.at("repeats") == 3);
    CHECK(l.at("provenance").at("command").get<std::string>().find("nanoddp-bench-gemm --sizes") !=
          std::string::npos);
    CHECK(l.at("provenance").contains("dirty"));
    CHECK(l.at("machine").contains("cores"));
    const std::string shape =
        l.at("shape").get<std::string>() + " " + std::to_string(static_cast<int>(m)) + "x" +
        std::to_string(static_cast<int>(n)) + "x" + std::to_string(static_cast<int>(k));
    backends_of_shape[shape].insert(l.at("backend").get<std::string>());
    if (l.at("shape") == "mlp-step") {
      ++mlp_steps;
      CHECK(gemms == 3 * 3 - 1);  // per Linear: forward, dW; dX for all but the first
      // By kind: each positive, and the split of the median step, so they add up to the row's
      // time (medians taken per kind did not, on a busy machine).
      const double f = l.at("forward_ms").get<double>(), x = l.at("input_grad_ms").get<double>(),
                   w = l.at("weight_grad_ms").get<double>();
      CHECK(f > 0);
      CHECK(x > 0);
      CHECK(w > 0);
      CHECK(f + x + w == doctest::Approx(ms).epsilon(1e-9));
      CHECK(l.at("isolated_ms").get<double>() > 0);
      CHECK(l.at("ratio_to_isolated").get<double>() ==
            doctest::Approx(l.at("isolated_ms").get<double>() / ms));
      step_ms[l.at("backend").get<std::string>()] = ms;
      step_ratio[l.at("backend").get<std::string>()] = l.at("ratio_to_eigen").get<double>();
    } else {
      CHECK(gemms == 1);
    }
  }
  CHECK(mlp_steps == 2);  // nanoddp-cpu and nanoddp-eigen
  // A step row's "vs eigen" is against the step run with Eigen's GEMM.
  CHECK(step_ratio["nanoddp-eigen"] == doctest::Approx(1.0));
  CHECK(step_ratio["nanoddp-cpu"] ==
        doctest::Approx(step_ms["nanoddp-eigen"] / step_ms["nanoddp-cpu"]));
  CHECK(backends_of_shape["mlp-step 8x40x40"] ==
        std::set<std::string>{"nanoddp-cpu", "nanoddp-eigen"});
  for (const char* shape : {"square 32x32x32", "square 48x48x48", "mlp-forward 8x40x40",
                            "mlp-input-grad 8x40x40", "mlp-weight-grad 40x40x8"}) {
    INFO(shape);
    CHECK(backends_of_shape[shape] ==
          std::set<std::string>{"eigen", "nanoddp-cpu", "nanoddp-eigen"});
  }
}

TEST_CASE("bench-gemm: a bad flag exits 2 and names it") {
  const ProcessResult r = run_process({bin_path("nanoddp-bench-gemm"), "--repeats", "0"});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--repeats") != std::string::npos);
}

TEST_CASE("bench-gemm: a results file that cannot be written is an error naming it") {
  // As bench-allreduce, bench-ddp and the simulator say it (common/results_file.h): before, the
  // rows were lost to a full disk and the run ended with code 0.
  TempDir dir;
  const ProcessResult missing = run_process(tiny_gemm({"--json", dir.file("no/such/g.jsonl")}));
  INFO(missing.output);
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("cannot open the file for writing") != std::string::npos);
  CHECK(missing.output.find("median ms") == std::string::npos);  // refused before measuring
  if (::access("/dev/full", W_OK) != 0) {
    MESSAGE("no writable /dev/full here: the write-failure case is skipped");
    return;
  }
  const ProcessResult full = run_process(tiny_gemm({"--json", "/dev/full"}));
  INFO(full.output);
  CHECK(full.exit_code == 1);
  CHECK(full.output.find("nanoddp-bench-gemm: error: --json /dev/full: writing the results "
                         "failed") != std::string::npos);
}

TEST_CASE("bench-gemm: sizes, widths and threads out of range exit 2 naming the flag and range") {
  // An outside tester's findings: --sizes 0 / -5 wrote zero or negative GFLOP/s with exit 0,
  // --threads 100000 crashed (139), --sizes 100000000 and --hidden 1000000000 ended in an
  // uncaught error (134). Each is refused before anything runs.
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--sizes", "0"}, "--sizes: '0' is out of range: it must be from 1 to 1048576"},
      {{"--sizes", "64,-5"}, "--sizes: '-5' is out of range: it must be from 1 to 1048576"},
      {{"--sizes", "100000000"}, "--sizes: '100000000' is out of range: it must be from 1 to"},
      {{"--hidden", "1000000000"}, "--hidden: '1000000000' is out of range: it must be from 1 to"},
      {{"--threads", "100000"}, "--threads: '100000' is out of range: it must be from 1 to 1024"},
      {{"--linears", "5000"}, "--linears: '5000' is out of range: it must be from 1 to 1000"},
      // Lists as bench-ddp reads them: CLI11's own delimiter dropped the empty item and, given
      // a lone ",", took the next flag for a size (an outside tester's).
      {{"--sizes", "8,,16"},
       "--sizes '8,,16': empty value in the list (expected e.g. --sizes 1,2,4)"},
      {{"--sizes", "8,"}, "--sizes '8,': empty value in the list"},
      {{"--sizes", ",", "--repeats", "1"}, "--sizes ',': empty value in the list"},
      {{"--sizes", "8,010"}, "--sizes: '010' has a leading zero"},
      // Within the range, but not within this machine's memory (about 11 TiB of operands).
      {{"--sizes", "1000000"}, "GiB this machine has available (MemAvailable)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {bin_path("nanoddp-bench-gemm")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const ProcessResult r = run_process(argv);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
    CHECK(r.output.find("median ms") == std::string::npos);  // nothing was measured
  }
}

TEST_CASE("bench-gemm: a size given twice is measured once, and said so") {
  const ProcessResult r =
      run_process({bin_path("nanoddp-bench-gemm"), "--sizes", "8,16,8", "--repeats", "1",
                   "--warmup", "0", "--batch", "2", "--hidden", "8", "--linears", "1"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("note: --sizes 8,16,8: a value is given more than once; each point runs "
                      "once") != std::string::npos);
  std::size_t eights = 0;
  for (std::size_t at = r.output.find("square"); at != std::string::npos;
       at = r.output.find("square", at + 1)) {
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    if (line.find(" 8      8      8 ") != std::string::npos) ++eights;
  }
  CHECK(eights == 3);  // the eigen row and the two nanoddp rows, once each
}

TEST_CASE("bench-gemm: an error from the library is said, exit 1, never terminate()") {
  // Under an address-space limit the first 324 MB operand cannot be allocated although the
  // machine's memory (the check before the run) has room: the allocator's nanoddp::Error ended
  // in std::terminate (exit 134) before.
  // Not under the sanitizers (scripts/test-sanitizers.sh sets their options): their shadow memory
  // does not fit under the limit, and the sanitizer's own report would fail the stage.
  if (std::getenv("ASAN_OPTIONS") != nullptr || std::getenv("TSAN_OPTIONS") != nullptr) {
    MESSAGE("skipped under a sanitizer: the address-space limit leaves no room for its shadow");
    return;
  }
  const ProcessResult r = run_process(
      {"/bin/sh", "-c", "ulimit -v 900000 && exec \"$0\" --sizes 9000 --repeats 1 --warmup 0",
       bin_path("nanoddp-bench-gemm")});
  INFO(r.output);
  if (r.output.find("CPU GEMM threads") == std::string::npos) {
    MESSAGE("the benchmark did not start under the address-space limit here: skipped");
    return;
  }
  CHECK(!r.signaled);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("nanoddp-bench-gemm: error: ") != std::string::npos);
  CHECK(r.output.find("out of memory") != std::string::npos);
}

TEST_CASE("bench-gemm: more threads than cores is a warning, in the JSON too") {
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cores + 1 > 1024) {
    MESSAGE("more than 1023 cores: --threads cannot exceed them");
    return;
  }
  TempDir dir;
  const ProcessResult r = run_process(
      tiny_gemm({"--threads", std::to_string(cores + 1), "--json", dir.file("g.jsonl")}));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning: --threads " + std::to_string(cores + 1)) != std::string::npos);
  std::ifstream in(dir.file("g.jsonl"));
  std::string text;
  REQUIRE(std::getline(in, text));
  const auto l = nlohmann::json::parse(text);
  REQUIRE(l.at("warnings").size() == 1);
  CHECK(l.at("warnings")[0].get<std::string>().find("more GEMM threads than cores") !=
        std::string::npos);
}

TEST_CASE("bench-gemm: every row has the spread of its timed calls, as the other benchmarks") {
  // Only median_ms was reported: no min, p10, p90, max, and the table did not say how many calls.
  TempDir dir;
  const ProcessResult r = run_process({bin_path("nanoddp-bench-gemm"), "--sizes", "16", "--batch",
                                       "4", "--hidden", "16", "--linears", "2", "--repeats", "5",
                                       "--warmup", "2", "--json", dir.file("g.jsonl")});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("per row 5 timed call(s) after 2 warm-up call(s)") != std::string::npos);
  for (const char* column : {"min ms", "p10 ms", "p90 ms", "max ms"}) {
    CHECK_MESSAGE(r.output.find(column) != std::string::npos, column);
  }
  std::ifstream in(dir.file("g.jsonl"));
  int lines = 0;
  for (std::string text; std::getline(in, text); ++lines) {
    const auto l = nlohmann::json::parse(text);
    CAPTURE(text);
    const double lo = l.at("min_ms"), p10 = l.at("p10_ms"), median = l.at("median_ms"),
                 p90 = l.at("p90_ms"), hi = l.at("max_ms");
    CHECK(lo > 0);
    CHECK(lo <= p10);
    CHECK(p10 <= median * (1 + 1e-12));
    CHECK(median <= p90 * (1 + 1e-12));
    CHECK(p90 <= hi);
    CHECK(l.at("repeats") == 5);
    CHECK(l.at("warmup") == 2);
  }
  CHECK(lines >= 14);  // 3 CPU rows per shape x 4 shapes, and 2 mlp-step rows
}
