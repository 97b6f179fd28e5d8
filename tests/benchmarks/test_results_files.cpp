// What the benchmarks write is what a paper cites: no secret in it, the user's own command and
// the real output path, a write that failed is an error, an output that is another output is
// refused, usage errors exit 2 before any process group forms, failed points are rows of their
// own, and nccl-tests' table layout (scripts written for all_reduce_perf parse it).

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/world.h"

using namespace nanoddp::testing;
using nlohmann::json;

namespace {

constexpr const char* kSecret = "mysecret123";

ProcessOptions quick(std::map<std::string, std::string> env = {}) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env = std::move(env);
  options.env["NANODDP_TIMEOUT_S"] = "30";
  return options;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  for (std::string f; in >> f;) fields.push_back(f);
  return fields;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kTinyDdp = {"--hidden", "16",      "--layers", "1",        "--batch",
                                           "8",        "--steps", "3",        "--warmup", "1"};
const std::vector<std::string> kTinyAllreduce = {"-b", "1K", "-e", "4K", "-f",
                                                 "4",  "-n", "2",  "-w", "1"};

}  // namespace

TEST_CASE("results files: the store token (and any *TOKEN*/*SECRET*/*KEY*) is never written") {
  TempDir dir;
  const auto env = quick({{"NANODDP_STORE_TOKEN", kSecret}, {"NANODDP_API_KEY", "k3y-value"}});
  // Under nanoddp-run (which hands its workers "<token>/<random>"), bench-allreduce's lines.
  const ProcessResult ar =
      run_process(with({bin_path("nanoddp-run"), "--nproc-per-node", "2",
                        bin_path("nanoddp-bench-allreduce"), "--json", dir.file("a.jsonl")},
                       kTinyAllreduce),
                  env);
  REQUIRE_MESSAGE(ar.exit_code == 0, ar.output);
  // Its --nproc-per-node --repeats mode.
  const ProcessResult rep =
      run_process(with({bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "2", "--repeats",
                        "2", "--json", dir.file("r.jsonl")},
                       kTinyAllreduce),
                  env);
  REQUIRE_MESSAGE(rep.exit_code == 0, rep.output);
  // bench-ddp's JSON and CSV, and the simulator's JSON.
  const ProcessResult ddp =
      run_process(with({bin_path("nanoddp-bench-ddp"), "--world", "1,2", "--json",
                        dir.file("d.jsonl"), "--csv", dir.file("d.csv")},
                       kTinyDdp),
                  env);
  REQUIRE_MESSAGE(ddp.exit_code == 0, ddp.output);
  const ProcessResult sim =
      run_process({bin_path("nanoddp-sim"), "--model", "mlp", "--json", dir.file("s.json")}, env);
  REQUIRE_MESSAGE(sim.exit_code == 0, sim.output);
  for (const char* file : {"a.jsonl", "r.jsonl", "d.jsonl", "d.csv", "s.json"}) {
    const std::string text = slurp(dir.file(file));
    CAPTURE(file);
    REQUIRE(!text.empty());
    CHECK(text.find(kSecret) == std::string::npos);
    CHECK(text.find("k3y-value") == std::string::npos);
    CHECK(text.find("<redacted>") != std::string::npos);
  }
  for (const ProcessResult* r : {&ar, &rep, &ddp, &sim}) {
    CHECK(r->output.find(kSecret) == std::string::npos);
  }
  for (const json& l : read_lines(dir.file("a.jsonl"))) {
    CHECK(l["provenance"]["environment"]["NANODDP_STORE_TOKEN"] == "<redacted>");
    CHECK(l["provenance"]["environment"]["NANODDP_API_KEY"] == "<redacted>");
  }
}

TEST_CASE("results files: the user's command, the working directory and the real output path") {
  TempDir dir;
  // Under nanoddp-run: the launcher's command line, the worker's beside it.
  const std::string json_path = dir.file("a.jsonl");
  const ProcessResult ar =
      run_process(with({bin_path("nanoddp-run"), "--nproc-per-node", "2",
                        bin_path("nanoddp-bench-allreduce"), "--json", json_path},
                       kTinyAllreduce),
                  quick());
  REQUIRE_MESSAGE(ar.exit_code == 0, ar.output);
  for (const json& l : read_lines(json_path)) {
    const auto& p = l["provenance"];
    CHECK(p["command"].get<std::string>().rfind(bin_path("nanoddp-run") + " --nproc-per-node 2",
                                                0) == 0);
    CHECK(p["worker_command"].get<std::string>().rfind(bin_path("nanoddp-bench-allreduce"), 0) ==
          0);
    CHECK(!p["cwd"].get<std::string>().empty());
    CHECK(p["json"] == json_path);
  }
  // --repeats: the command typed (not a launch's scratch file), the file the lines are in.
  const ProcessResult rep =
      run_process(with({bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "2", "--repeats",
                        "2", "--json", dir.file("r.jsonl")},
                       kTinyAllreduce),
                  quick());
  REQUIRE_MESSAGE(rep.exit_code == 0, rep.output);
  std::set<std::string> commands;
  for (const json& l : read_lines(dir.file("r.jsonl"))) {
    commands.insert(l["provenance"]["command"].get<std::string>());
    CHECK(l["provenance"]["json"] == dir.file("r.jsonl"));
    CHECK(l["provenance"]["worker_command"].get<std::string>().find("launch-") !=
          std::string::npos);
  }
  REQUIRE(commands.size() == 1);
  CHECK(commands.begin()->find("--repeats 2 --json " + dir.file("r.jsonl")) != std::string::npos);
  // bench-ddp: the driver's own command, its directory, both outputs.
  const ProcessResult ddp =
      run_process(with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--json",
                        dir.file("d.jsonl"), "--csv", dir.file("d.csv")},
                       kTinyDdp),
                  quick());
  REQUIRE_MESSAGE(ddp.exit_code == 0, ddp.output);
  const json d = read_lines(dir.file("d.jsonl")).at(0);
  CHECK(d["provenance"]["command"].get<std::string>().rfind(bin_path("nanoddp-bench-ddp"), 0) == 0);
  CHECK(d["provenance"]["csv"] == dir.file("d.csv"));
  CHECK(d["provenance"].contains("cwd"));
}

TEST_CASE(
    "results files: an output that is another output is refused, a failed write is an error") {
  TempDir dir;
  const std::string same = dir.file("same");
  const std::string link = dir.file("link");
  std::ofstream(same) << "keep\n";
  REQUIRE(::symlink(same.c_str(), link.c_str()) == 0);
  for (const std::string& csv : {same, link}) {
    const ProcessResult r = run_process(
        with({bin_path("nanoddp-bench-ddp"), "--json", same, "--csv", csv}, kTinyDdp), quick());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("are the same file") != std::string::npos);
    CHECK(slurp(same) == "keep\n");
  }
  if (::access("/dev/full", W_OK) != 0) {
    MESSAGE("no writable /dev/full here: the write-failure cases are skipped");
    return;
  }
  const ProcessResult ddp = run_process(
      with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--json", "/dev/full"}, kTinyDdp),
      quick());
  CHECK(ddp.exit_code == 1);
  CHECK(ddp.output.find("--json /dev/full: writing the results failed") != std::string::npos);
  const ProcessResult csv = run_process(
      with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--csv", "/dev/full"}, kTinyDdp),
      quick());
  CHECK(csv.exit_code == 1);
  CHECK(csv.output.find("--csv /dev/full: writing the results failed") != std::string::npos);
  const ProcessResult ar = run_process(
      with({bin_path("nanoddp-bench-allreduce"), "--json", "/dev/full"}, kTinyAllreduce), quick());
  CHECK(ar.exit_code == 1);
  CHECK(ar.output.find("--json /dev/full: writing the results failed") != std::string::npos);
  const ProcessResult rep =
      run_process(with({bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "1", "--repeats",
                        "2", "--json", "/dev/full"},
                       kTinyAllreduce),
                  quick());
  CHECK(rep.exit_code == 1);
  CHECK(rep.output.find("--json /dev/full: writing the results failed") != std::string::npos);
}

TEST_CASE("results files: an empty --json (or --csv) path is refused, exit 2, naming the flag") {
  // `--json "$OUT"` with OUT unset: before, every tool ran, wrote nothing and exited 0.
  struct Case {
    std::string flag;
    std::vector<std::string> argv;
  };
  const std::vector<Case> cases = {
      {"--json", with({bin_path("nanoddp-bench-allreduce"), "--json", ""}, kTinyAllreduce)},
      {"--json", with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--json", ""}, kTinyDdp)},
      {"--csv", with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--csv", ""}, kTinyDdp)},
      {"--json", {bin_path("nanoddp-bench-gemm"), "--sizes", "8", "--json", ""}},
      {"--json", {bin_path("nanoddp-sim"), "--model", "mlp", "--gpu", "h100", "--json", ""}}};
  for (const Case& c : cases) {
    const ProcessResult r = run_process(c.argv, quick());
    INFO(c.argv[0] << " " << c.flag);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.flag + ": an empty path") != std::string::npos);
  }
}

TEST_CASE("results files: two outputs are compared by the file they resolve to, before writing") {
  // A tester's finding: "--json x.jsonl --csv ./x.jsonl" (and a symlink to a file not written
  // yet) passed the check while the file did not exist, and the CSV overwrote the JSON lines.
  TempDir dir;
  ProcessOptions in_dir = quick();
  in_dir.working_directory = dir.path();
  REQUIRE(::symlink("y.jsonl", dir.file("ylink").c_str()) == 0);
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"x.jsonl", "./x.jsonl"}, {"x.jsonl", "sub/../x.jsonl"}, {"y.jsonl", "ylink"}};
  std::filesystem::create_directory(dir.file("sub"));
  for (const auto& [json_path, csv_path] : pairs) {
    CAPTURE(csv_path);
    const ProcessResult r = run_process(with({bin_path("nanoddp-bench-ddp"), "--world", "1",
                                              "--quiet", "--json", json_path, "--csv", csv_path},
                                             kTinyDdp),
                                        in_dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("are the same file") != std::string::npos);
    CHECK(!std::filesystem::exists(dir.file(json_path)));  // refused before anything is written
  }
  // nanoddp-train's outputs through the same helper (common/output_files.h).
  const std::vector<std::pair<std::string, std::string>> train_pairs = {
      {"--trace", "./m.csv"}, {"--trace", "ylink"}, {"--save", "./m.csv"}};
  for (const auto& [flag, path] : train_pairs) {
    CAPTURE(flag);
    CAPTURE(path);
    const std::string metrics = path == "ylink" ? "y.jsonl" : "m.csv";
    const ProcessResult r =
        run_process({bin_path("nanoddp-train"), "--hidden", "8", "--layers", "1", "--steps", "1",
                     "--quiet", "--metrics", metrics, flag, path},
                    in_dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("name the same file") != std::string::npos);
    CHECK(!std::filesystem::exists(dir.file(metrics)));
  }
}

TEST_CASE("results files: bench-allreduce's driver refuses a bad value before it launches") {
  // --nproc-per-node: the values are checked by the driver (exit 2, once), not by every rank of
  // a job that was started for nothing.
  ProcessOptions options = quick();
  options.timeout = std::chrono::seconds(25);
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--repeats", "3", "--collective", "foo"}, "--collective foo: expected allreduce"},
      {{"--collective", "allgather", "--op", "sum"}, "an allgather reduces nothing"},
      {{"--collective", "reduce_scatter", "--raw"}, "--raw and --vs-raw measure gloo::allreduce"},
      {{"--op", "prod"}, "--op prod"},
      // CLI11's range check, in words (it printed DBL_MAX's 309 digits).
      {{"-r", "0"}, "--rounds: '0' is out of range: it must be more than 0"},
      {{"-w", "-1"}, "--warmup_iters: '-1' is out of range: it must not be negative"},
      {{"-f", "1"}, "--stepfactor: '1' is out of range: it must be from 1.01 to 1000000"},
      {{"--repeats", "0"}, "--repeats: '0' is out of range: it must be from 1 to 1000"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_process(
        with({bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "2", "-b", "8", "-e", "8"},
             c.args),
        options);
    INFO(r.output);
    CHECK(!r.timed_out);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
    CHECK(r.output.find("# launch") == std::string::npos);  // nothing was launched
    CHECK(r.output.find("nanoddp-run") == std::string::npos);
    CHECK(r.output.find("179769313") == std::string::npos);
  }
}

TEST_CASE("results files: bench-allreduce records the load around each size, as bench-ddp does") {
  TempDir dir;
  const ProcessResult r = run_process(with({bin_path("nanoddp-bench-allreduce"), "--nproc-per-node",
                                            "2", "--json", dir.file("a.jsonl")},
                                           kTinyAllreduce),
                                      quick());
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(!lines.empty());
  for (const json& line : lines) {
    // [at the start, at the end of the size]; the warning exactly when bench-ddp's rule says:
    // above the cores at the start, or above the cores plus this node's ranks at the end.
    const json& load = line.at("load_average_1m");
    REQUIRE(load.size() == 2);
    const double start = load[0].get<double>(), end = load[1].get<double>();
    const int cores = line.at("machine").at("cores").get<int>();
    bool warned = false;
    for (const auto& w : line.at("warnings")) {
      warned = warned || w.get<std::string>().rfind("load average", 0) == 0;
    }
    CAPTURE(load.dump());
    CHECK(warned == (start > cores || end > cores + 2));
  }
}

TEST_CASE("results files: bench-allreduce under nanoddp-run: usage errors exit 2 at once") {
  // NANODDP_TIMEOUT_S is 30 and the test's limit 25 s: an error found only after the process
  // group formed (and a peer timed out) fails here.
  ProcessOptions options = quick();
  options.timeout = std::chrono::seconds(25);
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--json", "/sys/nanoddp-no-such-dir/x.jsonl"}, "--json /sys/nanoddp-no-such-dir/x.jsonl"},
      {{"-b", "-8"}, "-8"},
      {{"-b", "0x10"}, "0x10"},
      {{"--op", "prod"}, "--op prod"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_process(with({bin_path("nanoddp-run"), "--nproc-per-node", "2",
                                              bin_path("nanoddp-bench-allreduce")},
                                             c.args),
                                        options);
    INFO(r.output);
    CHECK(!r.timed_out);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
  }
}

TEST_CASE("results files: bench-allreduce's table is nccl-tests' layout, without a rank label") {
  const ProcessResult r =
      run_process(with({bin_path("nanoddp-bench-allreduce"), "--nproc-per-node", "2", "-r", "2"},
                       kTinyAllreduce),
                  quick());
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(r.output.find("[rank 0]") == std::string::npos);
  int rows = 0, headers = 0;
  for (const std::string& line : lines_of(r.output)) {
    const auto f = fields_of(line);
    // (The table's header: not the "over N launches" summary's.)
    if (line.rfind("# ", 0) == 0 && f.size() >= 14 && f[1] == "size") {
      ++headers;
      // size count type redop root, then time algbw busbw #wrong twice, as all_reduce_perf.
      CHECK(f[2] == "count");
      CHECK(f[3] == "type");
      CHECK(f[4] == "redop");
      CHECK(f[5] == "root");
      CHECK(f[6] == "time(us)");
      CHECK(f[9] == "#wrong");
      CHECK(f[10] == "time(us)");
      CHECK(f[13] == "#wrong");
    }
    if (line.empty() || line[0] == '#' || f.size() < 13) continue;
    ++rows;
    CHECK(f[2] == "float");
    CHECK(f[3] == "sum");
    CHECK(f[4] == "-1");
    CHECK(f[8] == "0");     // #wrong out of place
    CHECK(f[12] == "0");    // in place
    CHECK(f.size() == 17);  // + min, max per column set (-r 2)
  }
  CHECK(headers == 1);
  CHECK(rows == 2);
}

TEST_CASE("results files: --vs-raw over nanoddp's TCP ring says it compares two rings") {
  // An outside tester's: the process group's all-reduce no longer runs Gloo's ring over TCP, so
  // --vs-raw's ratio is ring against ring, not the engine's overhead, and both were called "TCP
  // ring".
  TempDir dir;
  for (const char* own : {"1", "0"}) {
    const ProcessResult r =
        run_process(with({bin_path("nanoddp-run"), "--nproc-per-node", "2",
                          bin_path("nanoddp-bench-allreduce"), "--vs-raw", "--json", dir.file(own)},
                         kTinyAllreduce),
                    quick({{"NANODDP_SHM", "0"}, {"NANODDP_TCP_RING", own}}));
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    const auto lines = read_lines(dir.file(own));
    REQUIRE(!lines.empty());
    const bool own_ring = std::string(own) == "1";
    CHECK((r.output.find("# warning: --vs-raw: the process group all-reduces around nanoddp's "
                         "TCP ring") != std::string::npos) == own_ring);
    CHECK(r.output.find("# raw: ring allreduce as used by gloo::allreduce; transport: Gloo's TCP "
                        "ring (") != std::string::npos);
    CHECK(lines[0]["algorithm"].get<std::string>().find(
              own_ring ? "transport: TCP ring (" : "transport: Gloo's TCP ring (") !=
          std::string::npos);
    if (own_ring) {
      REQUIRE(!lines[0]["warnings"].empty());
      CHECK(lines[0]["warnings"][0].get<std::string>().find("NANODDP_TCP_RING=0") !=
            std::string::npos);
    }
  }
}

TEST_CASE("results files: --vs-raw over shared memory says it compares two transports") {
  TempDir dir;
  const ProcessResult r = run_process(
      with({bin_path("nanoddp-run"), "--nproc-per-node", "2", bin_path("nanoddp-bench-allreduce"),
            "--vs-raw", "--json", dir.file("a.jsonl")},
           kTinyAllreduce),
      quick({{"NANODDP_SHM", "1"}}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto lines = read_lines(dir.file("a.jsonl"));
  REQUIRE(!lines.empty());
  const bool shm =
      lines[0]["algorithm"].get<std::string>().find("shared memory") != std::string::npos;
  if (!shm) {
    MESSAGE("shared memory unavailable here: the process group ran TCP too");
    return;
  }
  CHECK(r.output.find("# warning: --vs-raw: the process group reduces through shared memory") !=
        std::string::npos);
  for (const json& l : lines) {
    // The transports' warning first; on a loaded machine the load's may follow (and only it).
    REQUIRE(!l["warnings"].empty());
    CHECK(l["warnings"][0].get<std::string>().find("NANODDP_SHM=0") != std::string::npos);
    for (std::size_t i = 1; i < l["warnings"].size(); ++i) {
      CHECK(l["warnings"][i].get<std::string>().rfind("load average", 0) == 0);
    }
  }
}

TEST_CASE("results files: bench-ddp: an empty list is refused, failed points are rows too") {
  const ProcessResult empty =
      run_process(with({bin_path("nanoddp-bench-ddp"), "--world", ""}, kTinyDdp), quick());
  CHECK(empty.exit_code == 2);
  CHECK(empty.output.find("--world '': an empty list") != std::string::npos);
  const ProcessResult octal =
      run_process({bin_path("nanoddp-bench-ddp"), "--hidden", "010"}, quick());
  CHECK(octal.exit_code == 2);
  CHECK(octal.output.find("leading zero") != std::string::npos);

  // A baseline that overruns --timeout: its row and the point that needed it are in both files.
  TempDir dir;
  const ProcessResult r =
      run_process({bin_path("nanoddp-bench-ddp"), "--world", "1,2", "--hidden", "512", "--layers",
                   "4", "--steps", "1000000", "--timeout", "1", "--json", dir.file("d.jsonl"),
                   "--csv", dir.file("d.csv")},
                  quick());
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("# FAILED") != std::string::npos);
  const auto lines = read_lines(dir.file("d.jsonl"));
  REQUIRE(lines.size() == 2);  // the baseline, then world 2 (not run without it)
  CHECK(lines[0]["baseline"] == true);
  CHECK(lines[0]["error"].get<std::string>().find("baseline") != std::string::npos);
  CHECK(lines[1]["config"]["world_size"] == 2);
  CHECK(lines[1]["error"].get<std::string>().find("not run") != std::string::npos);
  const auto csv = lines_of(slurp(dir.file("d.csv")));
  REQUIRE(csv.size() == 3);
  CHECK(csv[0].find(",error,") != std::string::npos);
  CHECK(csv[2].find("not run: its plain 1-process baseline failed") != std::string::npos);
}

TEST_CASE("results files: bench-ddp's confidence intervals: one meaning per column, CSV = JSON") {
  TempDir dir;
  const ProcessResult r =
      run_process(with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--repeats", "2", "--json",
                        dir.file("d.jsonl"), "--csv", dir.file("d.csv")},
                       kTinyDdp),
                  quick());
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const json l = read_lines(dir.file("d.jsonl")).at(0);
  CHECK(!l.contains("step_ms_ci95"));
  CHECK(l["step_ms_ci95_steps"].size() == 2);
  // Two launches: no interval over launches (it would only be their min and max), and why.
  CHECK(l["step_ms_ci95_launches"].is_null());
  CHECK(l["ci95_launches_note"].get<std::string>().find("--repeats 6 or more") !=
        std::string::npos);
  CHECK(l["load_average_1m"].size() == 2);
  const auto csv = lines_of(slurp(dir.file("d.csv")));
  REQUIRE(csv.size() == 2);
  for (const char* column :
       {"step_ms_ci95_steps_lo", "step_ms_ci95_steps_hi", "step_ms_ci95_launches_lo",
        "step_ms_ci95_launches_hi", "ci95_launches_note", "load_average_1m_start", ",cwd,",
        ",environment"}) {
    CHECK_MESSAGE(csv[0].find(column) != std::string::npos, column);
  }
  CHECK(csv[1].find("--repeats 6 or more") != std::string::npos);
  CHECK(csv[1].find("NANODDP_TIMEOUT_S") != std::string::npos);  // the environment column
}

TEST_CASE("results files: bench-ddp's CSV holds the machine and build columns its JSON has") {
  // The README says the CSV holds the JSON's columns flat; the machine (host, CPU, cores, OS)
  // and the build (compiler, build type, -march=native) were missing.
  TempDir dir;
  const ProcessResult r = run_process(with({bin_path("nanoddp-bench-ddp"), "--world", "1", "--json",
                                            dir.file("d.jsonl"), "--csv", dir.file("d.csv")},
                                           kTinyDdp),
                                      quick());
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const json l = read_lines(dir.file("d.jsonl")).at(0);
  const auto csv = lines_of(slurp(dir.file("d.csv")));
  REQUIRE(csv.size() == 2);
  // Split on commas outside quotes; "" inside quotes is one quote.
  const auto cells = [](const std::string& line) {
    std::vector<std::string> out(1);
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (c == '"' && quoted && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = !quoted;
      } else if (c == ',' && !quoted) {
        out.emplace_back();
      } else {
        out.back() += c;
      }
    }
    return out;
  };
  const std::vector<std::string> header = cells(csv[0]), row = cells(csv[1]);
  REQUIRE(header.size() == row.size());
  const auto column = [&](const std::string& name) -> std::string {
    const auto at = std::find(header.begin(), header.end(), name);
    return at == header.end() ? "<missing>" : row[static_cast<std::size_t>(at - header.begin())];
  };
  for (const char* object : {"machine", "build"}) {
    REQUIRE(l.contains(object));
    for (const auto& [key, value] : l[object].items()) {
      const std::string name =
          key.rfind(std::string(object) + "_", 0) == 0 ? key : std::string(object) + "_" + key;
      CAPTURE(name);
      CHECK(column(name) == (value.is_string() ? value.get<std::string>() : value.dump()));
    }
  }
  for (const char* name : {"machine_hostname", "machine_cpu", "machine_cores", "machine_os",
                           "build_compiler", "build_type", "build_native"}) {
    CHECK_MESSAGE(column(name) != "<missing>", name);
  }
}

TEST_CASE("results files: every benchmark's JSON carries the same build block") {
  // bench-ddp recorded {version, compiler, build_type, cuda, native}; bench-allreduce and the
  // simulator recorded none, bench-gemm only the compiler. One helper (common::build_info) now.
  TempDir dir;
  std::vector<json> builds;
  const ProcessResult ar = run_process(
      with({bin_path("nanoddp-bench-allreduce"), "--json", dir.file("a.jsonl")}, kTinyAllreduce),
      quick());
  REQUIRE_MESSAGE(ar.exit_code == 0, ar.output);
  for (const json& l : read_lines(dir.file("a.jsonl"))) builds.push_back(l.at("build"));
  const ProcessResult gemm = run_process(
      {bin_path("nanoddp-bench-gemm"), "--sizes", "8", "--batch", "2", "--hidden", "8", "--linears",
       "1", "--repeats", "1", "--warmup", "0", "--json", dir.file("g.jsonl")},
      quick());
  REQUIRE_MESSAGE(gemm.exit_code == 0, gemm.output);
  for (const json& l : read_lines(dir.file("g.jsonl"))) builds.push_back(l.at("build"));
  const ProcessResult sim = run_process(
      {bin_path("nanoddp-sim"), "--model", "mlp", "--gpu", "h100", "--json", dir.file("s.json")},
      quick());
  REQUIRE_MESSAGE(sim.exit_code == 0, sim.output);
  builds.push_back(json::parse(slurp(dir.file("s.json"))).at("build"));
  const ProcessResult busbw = run_process(
      {bin_path("nanoddp-sim"), "--busbw", "--gpus-per-node", "8", "--json", dir.file("b.json")},
      quick());
  REQUIRE_MESSAGE(busbw.exit_code == 0, busbw.output);
  for (const json& row : json::parse(slurp(dir.file("b.json")))) builds.push_back(row.at("build"));
  REQUIRE(builds.size() > 4);
  for (const json& b : builds) {
    CHECK(b == builds.front());
    for (const char* key : {"version", "compiler", "build_type", "cuda", "native"}) {
      CHECK_MESSAGE(b.contains(key), key);
    }
  }
}
