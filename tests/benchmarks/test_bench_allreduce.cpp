// nanoddp-bench-allreduce end to end: real processes under real Gloo, every row's result
// checked against its closed form (-c 1), the JSON lines parsed field by field. No timing
// assertions: the figures are what the benchmark is for, the test only checks they are sane.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
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
  REQUIRE(lines.size() == 6);  // per size: out of place, then in place
  std::vector<std::int64_t> bytes;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    check_line(l, "nanoddp", 3);
    CHECK(l.at("placement") == (i % 2 == 0 ? "out-of-place" : "in-place"));
    CHECK(l.at("op") == "avg");
    CHECK(l.at("wrong") == 0);  // every element of every rank matched the closed form
    if (i % 2 == 0) bytes.push_back(l.at("bytes").get<std::int64_t>());
  }
  CHECK(bytes == std::vector<std::int64_t>{8, 4096, 2097152});
  CHECK(results[0].output.find("busbw(GB/s)") != std::string::npos);
}

TEST_CASE(
    "bench-allreduce: --collective reduce_scatter and allgather, 3 ranks over shared memory and "
    "TCP: nccl-tests' columns, every result correct") {
  struct Case {
    std::string collective;
    std::string dtype;
    std::map<std::string, std::string> env;
  };
  const std::vector<Case> cases = {{"reduce_scatter", "float", {}},
                                   {"reduce_scatter", "bf16", {{"NANODDP_SHM", "0"}}},
                                   {"allgather", "bf16", {}},
                                   {"allgather", "float", {{"NANODDP_SHM", "0"}}}};
  for (const Case& c : cases) {
    CAPTURE(c.collective);
    CAPTURE(c.dtype);
    TempDir dir;
    std::vector<std::string> argv = {bin_path("nanoddp-bench-allreduce"),
                                     "--collective",
                                     c.collective,
                                     "--dtype",
                                     c.dtype,
                                     "--json",
                                     dir.file("a.jsonl")};
    if (c.collective == "reduce_scatter") argv.insert(argv.end(), {"--op", "avg"});
    argv.insert(argv.end(), kSizes.begin(), kSizes.end());
    const auto results = run_world(argv, 3, quick(c.env));
    INFO(describe(results));
    for (const auto& r : results) REQUIRE(r.exit_code == 0);
    const std::string& out = results[0].output;
    CHECK(out.find("# nanoddp-bench-allreduce --collective " + c.collective + ": backend " +
                   (c.env.empty() ? "gloo+shm " : "gloo ")) != std::string::npos);
    CHECK(out.find(c.collective == "allgather"
                       ? "as nccl-tests' all_gather_perf"
                       : "as nccl-tests' reduce_scatter_perf") != std::string::npos);
    CHECK(out.find("busbw = algbw * (n-1)/n") != std::string::npos);
    CHECK(out.find("# Out of bounds values : 0 OK") != std::string::npos);
    const auto lines = read_lines(dir.file("a.jsonl"));
    // 8 B holds no element per rank (12 B with float32 and 3 ranks, 6 B with bf16).
    const std::int64_t elem = c.dtype == "float" ? 4 : 2;
    const std::vector<std::int64_t> expected_bytes =
        c.dtype == "float" ? std::vector<std::int64_t>{4092, 2097144}
                           : std::vector<std::int64_t>{6, 4092, 2097150};
    REQUIRE(lines.size() == 2 * expected_bytes.size());
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const auto& l = lines[i];
      CHECK(l.at("benchmark") == c.collective);
      CHECK(l.at("placement") == (i % 2 == 0 ? "out-of-place" : "in-place"));
      CHECK(l.at("op") == (c.collective == "allgather" ? "none" : "avg"));
      CHECK(l.at("wrong") == 0);
      CHECK(l.at("bytes") == expected_bytes[i / 2]);
      // size = the whole buffer; count = elements per rank.
      CHECK(l.at("bytes").get<std::int64_t>() == 3 * elem * l.at("count").get<std::int64_t>());
      const double algbw = l.at("algbw_gbps").get<double>();
      CHECK(algbw == doctest::Approx(static_cast<double>(l.at("bytes").get<std::int64_t>()) /
                                     l.at("time_us").get<double>() / 1e3)
                         .epsilon(1e-9));
      CHECK(l.at("busbw_gbps").get<double>() == doctest::Approx(algbw * 2.0 / 3.0).epsilon(1e-9));
      CHECK(l.at("algorithm").get<std::string>().find("process group " + c.collective) !=
            std::string::npos);
    }
    // The row as nccl-tests prints it: size count type redop root.
    const std::string row = fmt::format("{:>10} {:>12} {:>8} {:>6} {:>7}", expected_bytes.back(),
                                        expected_bytes.back() / 3 / elem, c.dtype,
                                        c.collective == "allgather" ? "none" : "avg", -1);
    CHECK(out.find(row) != std::string::npos);
  }
  // No size holds one element per rank: refused, naming the world size.
  const auto none = run_world(
      {bin_path("nanoddp-bench-allreduce"), "--collective", "allgather", "-b", "8", "-e", "8"}, 3,
      quick());
  for (const auto& r : none) {
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("-b 8 -e 8: no size holds one float element per rank (3 ranks: 12 "
                        "bytes)") != std::string::npos);
  }
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
  REQUIRE(lines.size() == 9);  // per size: the engine out of place and in place, then raw's
  for (std::size_t i = 0; i < lines.size(); i += 3) {
    check_line(lines[i], "nanoddp", 2);
    check_line(lines[i + 1], "nanoddp", 2);
    check_line(lines[i + 2], "raw", 2);
    CHECK(lines[i + 2].at("placement") == "in-place");
    CHECK(lines[i].at("bytes") == lines[i + 2].at("bytes"));
    CHECK(lines[i].at("wrong") == 0);
    CHECK(lines[i + 1].at("wrong") == 0);
    CHECK(lines[i + 2].at("wrong") == 0);  // raw Gloo's result is checked too
    CHECK(lines[i].at("rounds") == 2);
  }
  CHECK(lines[0]
            .at("algorithm")
            .get<std::string>()
            .find("process group allreduce; transport: "
                  "TCP ring") != std::string::npos);
  CHECK(lines[2]
            .at("algorithm")
            .get<std::string>()
            .find("as used by gloo::allreduce; "
                  "transport: Gloo's TCP ring") != std::string::npos);
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
  REQUIRE(lines.size() == 6);
  for (const auto& l : lines) {
    check_line(l, "raw", 2);
    CHECK(l.at("wrong") == 0);  // out of place: Gloo wrote every element of the receive buffer
  }
  CHECK(results[0].output.find("gloo::allreduce from a send buffer into a receive buffer") !=
        std::string::npos);
}

TEST_CASE(
    "bench-allreduce: nccl-tests' column sets, rank-averaged rounds, min/max and the "
    "average bus bandwidth footer") {
  TempDir dir;
  const std::vector<std::string> argv = {bin_path("nanoddp-bench-allreduce"),
                                         "-b",
                                         "1K",
                                         "-e",
                                         "64K",
                                         "-f",
                                         "8",
                                         "-n",
                                         "2",
                                         "-w",
                                         "1",
                                         "-r",
                                         "3",
                                         "--json",
                                         dir.file("a.jsonl")};
  const auto results = run_world(argv, 2, quick());
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  const std::string& out = results[0].output;
  CHECK(out.find("out-of-place") != std::string::npos);
  CHECK(out.find("in-place") != std::string::npos);
  CHECK(out.find("averaged over the ranks, median round") != std::string::npos);
  CHECK(out.find("# Out of bounds values : 0 OK") != std::string::npos);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(lines.size() == 6);  // 1K, 8K, 64K x two placements
  double busbw_sum = 0;
  for (const auto& l : lines) {
    const auto rounds = l.at("round_time_us").get<std::vector<double>>();
    REQUIRE(rounds.size() == 3);
    CHECK(l.at("time_us_min").get<double>() == *std::min_element(rounds.begin(), rounds.end()));
    CHECK(l.at("time_us_max").get<double>() == *std::max_element(rounds.begin(), rounds.end()));
    std::vector<double> sorted = rounds;
    std::sort(sorted.begin(), sorted.end());
    CHECK(l.at("time_us").get<double>() == sorted[1]);  // the median round
    CHECK(l.at("time").get<std::string>().find("mean over ranks") != std::string::npos);
    CHECK(l.at("iters") == 2);
    CHECK(l.at("warmup") == 1);
    busbw_sum += l.at("busbw_gbps").get<double>();
    // Provenance on every line.
    const auto& p = l.at("provenance");
    CHECK(p.at("command").get<std::string>().find("nanoddp-bench-allreduce -b 1K") !=
          std::string::npos);
    CHECK(p.at("utc").get<std::string>().size() == 20);
    CHECK(p.at("environment").contains("NANODDP_TIMEOUT_S"));
    CHECK(l.at("machine").contains("cores"));
  }
  // "# Avg bus bandwidth    : X": the mean busbw over both column sets of every row.
  const auto at = out.find("# Avg bus bandwidth    : ");
  REQUIRE(at != std::string::npos);
  const double avg = std::stod(out.substr(at + 25));
  CHECK(avg == doctest::Approx(busbw_sum / 6).epsilon(1e-4));
}

TEST_CASE("bench-allreduce: no row is larger than -e, a range without one element is refused") {
  TempDir dir;
  const auto results = run_world({bin_path("nanoddp-bench-allreduce"), "-b", "2", "-e", "6", "-f",
                                  "2", "-n", "1", "-w", "0", "--json", dir.file("a.jsonl")},
                                 2, quick());
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(lines.size() == 2);  // 2 B holds no float; 4 B holds one; 8 B is past -e
  for (const auto& l : lines) CHECK(l.at("bytes") == 4);
  // The 2-byte size was skipped: said once, by rank 0, not silently.
  CHECK(results[0].output.find("sizes are whole elements (4 bytes): 0 size(s) rounded down, 1 "
                               "skipped") != std::string::npos);

  const ProcessResult none =
      run_process({bin_path("nanoddp-bench-allreduce"), "-b", "2", "-e", "2"}, quick());
  CHECK(none.exit_code == 2);
  CHECK(none.output.find("-b 2 -e 2: no size holds one float element (4 bytes)") !=
        std::string::npos);
}

TEST_CASE(
    "bench-allreduce: --backend nccl without a GPU is a usage error, before anything launches") {
  // With --nproc-per-node 2 it started two ranks that each failed on it (exit 1); as documented,
  // the driver says it once, at once (exit 2).
  for (const std::vector<std::string>& launch :
       {std::vector<std::string>{}, std::vector<std::string>{"--nproc-per-node", "2"}}) {
    std::vector<std::string> argv = {
        bin_path("nanoddp-bench-allreduce"), "--backend", "nccl", "-b", "8", "-e", "64"};
    argv.insert(argv.end(), launch.begin(), launch.end());
    const ProcessResult r = run_process(argv, quick());
    INFO(r.output);
    if (r.output.find("needs a CUDA GPU") == std::string::npos && r.exit_code == 0) {
      MESSAGE("a GPU is present: nothing to check here");
      return;
    }
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("--backend nccl needs a CUDA GPU per rank") != std::string::npos);
    CHECK(r.output.find("use --backend gloo") != std::string::npos);
    CHECK(r.output.find("--device") == std::string::npos);  // a flag this program does not have
    CHECK(r.output.find("# launch 1 of") == std::string::npos);
    CHECK(r.output.find("[rank") == std::string::npos);
  }
}

TEST_CASE("bench-allreduce: sizes take the T suffix, up to 1T as documented") {
  // "-e 1T" was "not a size" while the docs and "-e 1025G" ("more than 1T") said 1T was the
  // limit. The check after the sizes' (--raw is Gloo's) proves 1T was read; nothing is allocated.
  const ProcessResult one = run_process(
      {bin_path("nanoddp-bench-allreduce"), "-b", "1T", "-e", "1t", "--raw", "--backend", "nccl"},
      quick());
  INFO(one.output);
  CHECK(one.exit_code == 2);
  CHECK(one.output.find("--raw and --vs-raw are for the gloo backend only") != std::string::npos);
  for (const char* size : {"2T", "1025G", "1.5T"}) {
    CAPTURE(size);
    const ProcessResult over =
        run_process({bin_path("nanoddp-bench-allreduce"), "-e", size}, quick());
    INFO(over.output);
    CHECK(over.exit_code == 2);
    CHECK(over.output.find(std::string("-e/--maxbytes: '") + size + "' is more than 1T") !=
          std::string::npos);
  }
  const ProcessResult low =
      run_process({bin_path("nanoddp-bench-allreduce"), "-b", "2T", "-e", "1K"}, quick());
  INFO(low.output);
  CHECK(low.exit_code == 2);
  CHECK(low.output.find("-b/--minbytes: '2T' is more than 1T") != std::string::npos);
}

TEST_CASE("bench-allreduce: sizes past this machine's memory are refused before any rank runs") {
  // -e 1T passed every check and then failed in the rank, out of memory (an outside tester's).
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"--nproc-per-node", "2"}}) {
    std::vector<std::string> argv = {bin_path("nanoddp-bench-allreduce"), "-b", "1T", "-e", "1T"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const ProcessResult r = run_process(argv, quick());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("-e 1T: ") != std::string::npos);
    CHECK(r.output.find("each hold two buffers of the largest size") != std::string::npos);
    CHECK(r.output.find("this machine has available (MemAvailable); give a smaller -e") !=
          std::string::npos);
    CHECK(r.output.find("# launch 1 of") == std::string::npos);  // nothing was started
    CHECK(r.output.find("[rank") == std::string::npos);
  }
}

TEST_CASE("bench-allreduce: a rank refused under nanoddp-run is not restarted") {
  // A value no rank can read is bad input (exit 2): the launcher does not restart it. It was
  // exit 1, and --max-restarts 2 ran the job three times (an outside tester's).
  const ProcessResult r = run_process(
      {bin_path("nanoddp-run"), "--nproc-per-node", "2", "--max-restarts", "2",
       bin_path("nanoddp-bench-allreduce"), "-b", "8", "-e", "1K", "-n", "1", "-w", "0"},
      [] {
        ProcessOptions o = quick();
        o.env["NANODDP_TIMEOUT_S"] = "abc";
        return o;
      }());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("NANODDP_TIMEOUT_S=abc is not a positive number") != std::string::npos);
  CHECK(r.output.find("not restarting") != std::string::npos);
  CHECK(r.output.find("attempt 2") == std::string::npos);
}

TEST_CASE("bench-allreduce: bad flags exit 2 with a message naming them") {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--bogus"}, "--bogus"},
      {{"-b", "1M", "-e", "1K"}, "minbytes"},
      {{"-b", "12Q"}, "12Q"},
      {{"--raw", "--vs-raw"}, "--vs-raw"},
      {{"--op", "prod"}, "--op prod"},
      {{"-n", "0"}, "--iters"},
      {{"--collective", "alltoall"}, "--collective alltoall: expected allreduce, reduce_scatter"},
      {{"--op", "reduce_scatter"}, "the collective is --collective reduce_scatter"},
      {{"--collective", "allgather", "--op", "max"}, "an allgather reduces nothing"},
      {{"--collective", "reduce_scatter", "--raw"}, "--raw and --vs-raw measure gloo::allreduce"},
      {{"--collective", "allgather", "--vs-raw"}, "--raw and --vs-raw measure gloo::allreduce"},
      // An outside tester's: a fraction of a byte measured the whole bytes below it, and "+8",
      // "08" and "64E0" were sizes; "--json= --vs-raw" wrote the results to a file named
      // "--vs-raw" and measured without the comparison (exit 0).
      {{"-b", "4.9", "-e", "1K"}, "-b/--minbytes: '4.9' is not a whole number of bytes"},
      {{"-b", "+8", "-e", "1K"}, "-b/--minbytes: '+8' is not a size"},
      {{"-e", "08"}, "-e/--maxbytes: '08' is not a size"},
      {{"-e", "64E0"}, "-e/--maxbytes: '64E0' is not a size"},
      {{"-b", "8", "-e", "64", "--json=", "--vs-raw"}, "--json=: no value after the '='"},
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

TEST_CASE(
    "bench-allreduce: --nproc-per-node W --repeats N runs N separate launches and "
    "summarises them") {
  TempDir dir;
  const ProcessResult r = run_process(
      {bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "2", "--repeats", "2", "-b", "1K",
       "-e", "4K", "-f", "4", "-n", "2", "-w", "1", "--json", dir.file("a.jsonl")},
      quick());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("# launch 1 of 2") != std::string::npos);
  CHECK(r.output.find("# launch 2 of 2") != std::string::npos);
  CHECK(r.output.find("# over 2 launches") != std::string::npos);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(lines.size() == 8);  // 2 launches x 2 sizes x 2 column sets
  std::set<std::string> commands;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    check_line(lines[i], "nanoddp", 2);
    CHECK(lines[i].at("launch") == (i < 4 ? 1 : 2));
    CHECK(lines[i].at("launches") == 2);
    CHECK(lines[i].at("wrong") == 0);
    commands.insert(lines[i].at("provenance").at("worker_command").get<std::string>());
  }
  // The jobs got the measurement's flags, not the launcher's.
  REQUIRE(commands.size() == 2);  // each launch its own --json file
  for (const std::string& c : commands) {
    CHECK(c.find("--repeats") == std::string::npos);
    CHECK(c.find("--nproc-per-node") == std::string::npos);
  }

  // --repeats alone, and the launcher mode under a launcher, are usage errors.
  const ProcessResult alone =
      run_process({bin_path("nanoddp-bench-allreduce"), "--repeats", "3"}, quick());
  CHECK(alone.exit_code == 2);
  CHECK(alone.output.find("give --nproc-per-node W too") != std::string::npos);
  const auto nested = run_world(
      {bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "2", "--repeats", "2"}, 2, quick());
  for (const auto& n : nested) {
    CHECK(n.exit_code == 2);
    CHECK(n.output.find("run it without a launcher") != std::string::npos);
  }
}
