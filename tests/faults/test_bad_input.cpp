// Bad input to a real nanoddp-train: flags, environments, ports, data files, checkpoints and
// checkpoint directories. Each case checks the exit code and that the message names the
// culprit; docs/reliability.md's bad-input table points at these cases (and at older ones).

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <tuple>

#include "faults/faults_util.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/npy.h"
#include "nanoddp/nn/safetensors.h"
#include "support/saved_parameters.h"
#include "support/small_disk.h"

using namespace nanoddp::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

ProcessOptions with_timeout_env(std::map<std::string, std::string> env = {}) {
  ProcessOptions o;
  o.env = std::move(env);
  o.env.emplace("NANODDP_TIMEOUT_S", "5");
  o.timeout = 60s;
  return o;
}

// Two ranks by hand, each with its own argv and environment additions.
std::vector<ProcessResult> two_ranks(const std::vector<std::string>& argv0,
                                     const std::vector<std::string>& argv1,
                                     std::map<std::string, std::string> env0 = {},
                                     std::map<std::string, std::string> env1 = {}) {
  const std::string port = std::to_string(free_port());
  auto start = [&](int rank, const std::vector<std::string>& argv,
                   std::map<std::string, std::string> env) {
    ProcessOptions o = with_timeout_env();
    o.env["RANK"] = std::to_string(rank);
    o.env["WORLD_SIZE"] = "2";
    o.env["MASTER_ADDR"] = "127.0.0.1";
    o.env["MASTER_PORT"] = port;
    for (const auto& [k, v] : env) o.env[k] = v;
    return std::async(std::launch::async, [argv, o] { return run_process(argv, o); });
  };
  auto a = start(0, argv0, std::move(env0));
  auto b = start(1, argv1, std::move(env1));
  return {a.get(), b.get()};
}

// Ranks by hand, one per environment (each names its RANK and WORLD_SIZE) with its own argv,
// one port.
std::vector<ProcessResult> ranks_by_hand(
    const std::vector<std::vector<std::string>>& argvs,
    const std::vector<std::map<std::string, std::string>>& envs) {
  const std::string port = std::to_string(free_port());
  std::vector<std::future<ProcessResult>> running;
  for (std::size_t i = 0; i < envs.size(); ++i) {
    const auto& env = envs[i];
    const auto& argv = argvs[i];
    ProcessOptions o = with_timeout_env();
    o.env["MASTER_ADDR"] = "127.0.0.1";
    o.env["MASTER_PORT"] = port;
    o.env["NANODDP_TIMEOUT_S"] = "60";  // waiting it out would show
    for (const auto& [k, v] : env) o.env[k] = v;
    running.push_back(std::async(std::launch::async, [argv, o] { return run_process(argv, o); }));
  }
  std::vector<ProcessResult> results;
  for (auto& r : running) results.push_back(r.get());
  return results;
}

// The same argv on every rank.
std::vector<ProcessResult> ranks_by_hand(
    const std::vector<std::string>& argv,
    const std::vector<std::map<std::string, std::string>>& envs) {
  return ranks_by_hand(std::vector<std::vector<std::string>>(envs.size(), argv), envs);
}

// Every rank ended well before its timeout, with exit 2 (a usage error) and `message`.
void check_all_refused(const std::vector<ProcessResult>& results, Clock::time_point start,
                       const std::string& message) {
  INFO(describe(results));
  CHECK(seconds_since(start) < 15.0);
  for (const auto& r : results) {
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, message));
  }
}

// A little .npy file written byte for byte (dtype and order as given).
void write_raw_npy(const std::string& path, const std::string& descr, bool fortran,
                   const std::string& data, const std::string& shape) {
  std::string header = "{'descr': '" + descr +
                       "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': " + shape + ", }";
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  std::ofstream(path, std::ios::binary) << out << header << data;
}

std::vector<std::string> npy_train(const std::string& x, const std::string& y) {
  return {bin_path("nanoddp-train"),
          "--data",
          x,
          "--targets",
          y,
          "--layers",
          "0",
          "--batch",
          "4",
          "--steps",
          "2",
          "--quiet"};
}

// 16 x 4 inputs and 16 x 2 targets, finite.
void write_good_npy(const TempDir& dir) {
  std::vector<float> x(16 * 4, 0.5f), y(16 * 2, 0.25f);
  const std::vector<std::int64_t> xs{16, 4}, ys{16, 2};
  nanoddp::nn::write_npy(dir.file("x.npy"), xs, x.data());
  nanoddp::nn::write_npy(dir.file("y.npy"), ys, y.data());
}

}  // namespace

TEST_CASE("bad input: --backend nccl with --device cpu is refused (exit 2)") {
  const ProcessResult r =
      run_process(train_argv({"--backend", "nccl", "--device", "cpu", "--steps", "1"}));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--backend nccl needs --device cuda"));
}

TEST_CASE("bad input: WORLD_SIZE differing between ranks is an error on both, not a hang") {
  const auto start = Clock::now();
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  const auto results = two_ranks(argv, argv, {}, {{"WORLD_SIZE", "3"}});
  check_all_refused(results, start, "the ranks disagree on the world size");
  CHECK(contains(results[0].output, "WORLD_SIZE is 2 on rank 0 but 3 on rank 1"));
  CHECK(contains(results[1].output, "WORLD_SIZE is 3 on rank 1 but 2 on rank 0"));
}

TEST_CASE("bad input: a rank 0 with the larger WORLD_SIZE fails at once too, not at its timeout") {
  // Rank 0 waits for a third rank that never comes; before the first-come world size and the
  // "setup_failed" key, it waited its whole NANODDP_TIMEOUT_S (here 60 s) to say so.
  const auto start = Clock::now();
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  const auto results = two_ranks(argv, argv, {{"WORLD_SIZE", "3"}, {"NANODDP_TIMEOUT_S", "60"}},
                                 {{"NANODDP_TIMEOUT_S", "60"}});
  check_all_refused(results, start, "the ranks disagree on the world size");
  CHECK(contains(results[0].output, "WORLD_SIZE is 3 on rank 0 but 2 on rank 1"));
  CHECK(contains(results[1].output, "WORLD_SIZE is 2 on rank 1 but 3 on rank 0"));
}

// An outside tester: with 3 ranks where one that is not rank 0 disagrees, the others waited out
// their timeout (inside Gloo's connection set-up, which nothing interrupts), or exited 1 saying
// a rank "never joined". Now no rank starts the group before the world has checked in and
// agrees.
TEST_CASE("bad input: one of three ranks with another WORLD_SIZE stops all three at once") {
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  for (const char* odd : {"4", "2"}) {
    CAPTURE(odd);
    const auto start = Clock::now();
    const auto results = ranks_by_hand(argv, {{{"RANK", "0"}, {"WORLD_SIZE", "3"}},
                                              {{"RANK", "1"}, {"WORLD_SIZE", odd}},
                                              {{"RANK", "2"}, {"WORLD_SIZE", "3"}}});
    check_all_refused(results, start, "the ranks disagree on the world size");
    CHECK(contains(results[1].output, fmt::format("WORLD_SIZE is {} on rank 1", odd)));
  }
}

// An outside tester: a RANK given to two processes was never found; the extra one failed after
// the timeout blaming rank 0, which was alive. It is now refused as a usage error, by name.
TEST_CASE("bad input: a RANK given twice is refused, naming it, not blamed on a peer") {
  const auto start = Clock::now();
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  const auto results = ranks_by_hand(argv, {{{"RANK", "0"}, {"WORLD_SIZE", "3"}},
                                            {{"RANK", "1"}, {"WORLD_SIZE", "3"}},
                                            {{"RANK", "1"}, {"WORLD_SIZE", "3"}}});
  // Rank 2 never comes, so the job cannot run: every rank is refused, with the reason.
  check_all_refused(results, start, "RANK=1 was given to two processes: ");
  // Each says the same two processes, in words true for both (the holder read "another process
  // (pid P)" about itself: an outside operator's).
  const std::regex pair("RANK=1 was given to two processes: \\S+ pid ([0-9]+) claimed it first, "
                        "then \\S+ pid ([0-9]+)\\. .*each node its own node rank");
  std::set<std::string> said;
  for (const auto& r : results) {
    CHECK_FALSE(contains(r.output, "never joined"));
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(r.output, m, pair), r.output);
    CHECK(m[1].str() != m[2].str());
    said.insert(m[0].str());
  }
  CHECK(said.size() == 1);
}

// Every rank of a job whose rank `culprit` (its RANK as `culprit_rank`: it may be outside the
// world) stopped before it joined ended well before its timeout with exit 2: the culprit saying
// `reason`, the others repeating it and naming the culprit, none saying a rank "never joined".
void check_told_at_once(const std::vector<ProcessResult>& results, Clock::time_point start,
                        int culprit, const std::string& culprit_rank, const std::string& reason) {
  INFO(describe(results));
  CHECK(seconds_since(start) < 15.0);  // NANODDP_TIMEOUT_S is 60
  for (std::size_t r = 0; r < results.size(); ++r) {
    CAPTURE(r);
    CHECK_FALSE(results[r].timed_out);
    CHECK(results[r].exit_code == 2);
    if (static_cast<int>(r) == culprit) {
      CHECK(contains(results[r].output, reason));
    } else {
      CHECK(contains(results[r].output, fmt::format("rank {} (host ", culprit_rank)));
      CHECK(contains(results[r].output, "stopped before it joined the job: " + reason));
      CHECK_FALSE(contains(results[r].output, "never joined"));
    }
  }
}

// An outside tester: a rank that stopped before it reached the store (a bad flag, an invalid
// RANK, an output path rank 0 cannot write) left the others waiting their whole timeout, then
// saying that it "never joined" (or that rank 0's store could not be reached). Now it tells them
// through the store (rank 0 serving it for that), and they stop at once with its reason.
TEST_CASE("bad input: a rank that stops before it joins stops the others at once, naming it") {
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  const auto late = [](std::vector<std::string> delayed) {  // started 2 s after the others
    delayed.insert(delayed.begin(), {"/bin/sh", "-c", "sleep 2; exec \"$@\"", "sh"});
    return delayed;
  };
  struct Case {
    std::string what;
    std::vector<std::vector<std::string>> argvs;
    std::vector<std::map<std::string, std::string>> envs;
    int culprit;
    std::string reason;  // as the culprit says it, and the others repeat it
  };
  const std::map<std::string, std::string> rank0 = {{"RANK", "0"}, {"WORLD_SIZE", "3"}};
  const std::map<std::string, std::string> rank1 = {{"RANK", "1"}, {"WORLD_SIZE", "3"}};
  const std::map<std::string, std::string> rank2 = {{"RANK", "2"}, {"WORLD_SIZE", "3"}};
  auto bad_lr = argv;
  bad_lr.insert(bad_lr.end(), {"--lr", "fast"});
  auto bad_save = argv;
  bad_save.insert(bad_save.end(), {"--save", "/proc/params.safetensors"});
  const std::vector<Case> cases = {
      {"rank 1 with a bad flag, rank 0 late",
       {late(argv), bad_lr, argv},
       {rank0, rank1, rank2},
       1,
       "--lr: 'fast' is not a number written in decimal"},
      {"rank 0 cannot write --save",
       {bad_save, argv, argv},
       {rank0, rank1, rank2},
       0,
       "the folder of --save '/proc' is not writable"},
      {"RANK outside the world",
       {argv, argv, argv},
       {rank0, {{"RANK", "3"}, {"WORLD_SIZE", "3"}}, rank2},
       1,
       "RANK=3 is outside the world of WORLD_SIZE=3 ranks"},
      // Outside testers' cases from here on.
      {"rank 1 with a NANODDP_TIMEOUT_S it cannot read",
       {argv, argv, argv},
       {rank0, {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"NANODDP_TIMEOUT_S", "abc"}}, rank2},
       1,
       "NANODDP_TIMEOUT_S=abc is not a positive number of seconds"},
      // Read at the first large allocation, after joining: rank 0 waited 30 s for rank 1's
      // parameters (an outside tester's). Now read before joining.
      {"rank 1 with a NANODDP_HUGEPAGES it cannot read",
       {argv, argv, argv},
       {rank0, {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"NANODDP_HUGEPAGES", "x"}}, rank2},
       1,
       "NANODDP_HUGEPAGES='x' is not understood"},
      // Rank 0 served its store for as many ranks as its own
      // WORLD_SIZE: a third rank was left to time out.
      {"rank 0 with a bad flag and another WORLD_SIZE",
       {bad_lr, argv, late(argv)},
       {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, rank1, rank2},
       0,
       "--lr: 'fast' is not a number written in decimal"}};
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const auto start = Clock::now();
    check_told_at_once(ranks_by_hand(c.argvs, c.envs), start, c.culprit,
                       c.envs[static_cast<std::size_t>(c.culprit)].at("RANK"), c.reason);
  }
}

// Reliability row 12c for nanoddp-bench-allreduce (an outside tester's): only nanoddp-train told
// the others, so a benchmark rank started by hand with a mistyped flag left the others waiting
// their whole timeout, then saying that rank 0's store could not be reached or a rank never came.
TEST_CASE("bad input: a bench-allreduce rank that stops before it joins stops the others at once") {
  const std::vector<std::string> bench = {bin_path("nanoddp-bench-allreduce"), "-b", "1K", "-e",
                                          "4K"};
  auto bad_op = bench;
  bad_op.insert(bad_op.end(), {"--op", "median"});
  auto bad_flag = bench;
  bad_flag.push_back("--no-such-flag");
  struct Case {
    std::string what;
    std::vector<std::vector<std::string>> argvs;
    int culprit;
    std::string reason;  // as the others repeat it
    std::map<std::string, std::string> culprit_env = {};
  };
  const std::vector<Case> cases = {
      {"rank 1 with a bad --op", {bench, bad_op, bench}, 1, "--op median: expected sum"},
      {"rank 0 with a flag CLI11 refuses",
       {bad_flag, bench, bench},
       0,
       "The following argument was not expected: --no-such-flag"},
      // An outside tester's: a bad value in a rank's environment was exit 1 and told nobody.
      {"rank 2 with a NANODDP_TIMEOUT_S it cannot read",
       {bench, bench, bench},
       2,
       "NANODDP_TIMEOUT_S=abc is not a positive number",
       {{"NANODDP_TIMEOUT_S", "abc"}}},
      {"rank 1 with a NANODDP_HUGEPAGES it cannot read",
       {bench, bench, bench},
       1,
       "NANODDP_HUGEPAGES='x' is not understood",
       {{"NANODDP_HUGEPAGES", "x"}}}};
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const auto start = Clock::now();
    std::vector<std::map<std::string, std::string>> envs = {{{"RANK", "0"}, {"WORLD_SIZE", "3"}},
                                                            {{"RANK", "1"}, {"WORLD_SIZE", "3"}},
                                                            {{"RANK", "2"}, {"WORLD_SIZE", "3"}}};
    for (const auto& [k, v] : c.culprit_env) envs[static_cast<std::size_t>(c.culprit)][k] = v;
    check_told_at_once(ranks_by_hand(c.argvs, envs), start, c.culprit, std::to_string(c.culprit),
                       c.reason);
  }
}

// An outside tester: ranks started by hand with different -e, -n or -w ran different numbers of
// ops; the one with more waited out its timeout, and with -e the other printed its rows and
// exited 0. Now every rank compares what it will measure with the others' first.
TEST_CASE("bad input: bench-allreduce ranks that would measure different things stop at once") {
  const std::vector<std::string> bench = {
      bin_path("nanoddp-bench-allreduce"), "-b", "8", "-e", "1K", "-n", "2", "-w", "1"};
  auto more = bench;
  more[4] = "4K";
  auto vs_raw = bench;
  vs_raw.push_back("--vs-raw");
  // --raw beside the process group: the --raw rank joined no check-in and both waited out
  // their timeouts (an outside tester's). Now --raw checks in as every rank does.
  auto raw = bench;
  raw.push_back("--raw");
  for (const auto& [odd, mine, theirs] :
       {std::tuple{more, "rank 0 has -e 1024, but rank 1 has -e 4096 (sizes in bytes)",
                   "rank 1 has -e 4096, but rank 0 has -e 1024"},
        std::tuple{vs_raw,
                   "rank 0 has --rounds 1 --mode process-group, but rank 1 has --rounds 5 "
                   "--mode vs-raw",
                   "rank 1 has --rounds 5 --mode vs-raw"},
        std::tuple{raw, "rank 0 has --mode process-group, but rank 1 has --mode raw",
                   "rank 1 has --mode raw, but rank 0 has --mode process-group"}}) {
    CAPTURE(mine);
    const auto start = Clock::now();
    const auto results =
        ranks_by_hand(std::vector<std::vector<std::string>>{bench, odd},
                      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, {{"RANK", "1"}, {"WORLD_SIZE", "2"}}});
    INFO(describe(results));
    CHECK(seconds_since(start) < 15.0);  // NANODDP_TIMEOUT_S is 60
    for (const auto& r : results) {
      CHECK(r.exit_code == 2);
      CHECK(contains(r.output, "the ranks disagree on what to measure: "));
      CHECK(contains(r.output, "give every rank the same flags"));
      CHECK_FALSE(contains(r.output, "# Avg bus bandwidth"));  // nothing was measured
    }
    CHECK(contains(results[0].output, mine));
    CHECK(contains(results[1].output, theirs));
  }
}

// An outside tester: a NANODDP_SHM value one rank did not understand stopped that rank, and the
// others waited their whole timeout for its shared-memory hello, then exited 1.
TEST_CASE("bad input: a shared-memory switch one rank cannot read stops every rank, naming it") {
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  const auto start = Clock::now();
  const auto results =
      ranks_by_hand(argv, {{{"RANK", "0"}, {"WORLD_SIZE", "2"}},
                           {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"NANODDP_SHM", "false"}}});
  check_all_refused(results, start, "NANODDP_SHM='false' is not understood");
  CHECK(contains(results[0].output,
                 "rank 1 stopped setting up shared memory, so every rank stops: NANODDP_SHM"));
}

// An outside adversary: a /dev/shm too small for the segment (Docker's default 64 MiB, with a
// valid NANODDP_SHM_CHUNK_KB) killed rank 0 with SIGBUS at its first touch, saying nothing. Now
// the segment's pages are reserved up front, and the job goes over TCP, saying why.
TEST_CASE("bad input: a /dev/shm too small for the segment falls back to TCP, saying why") {
  // A /dev/shm of its own, in a mount namespace of its own: root only (CI runs as root).
  const ProcessResult probe = run_process({"unshare", "-m", "true"});
  if (probe.exit_code != 0) {
    MESSAGE("SKIPPED: cannot make a mount namespace here (needs root): ", probe.output);
    return;
  }
  std::string command = "mount -t tmpfs -o size=8m tmpfs /dev/shm && exec \"$@\"";
  std::vector<std::string> argv = {
      "unshare", "-m", "sh", "-c", command, "sh", bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  const auto train = train_argv({"--steps", "20", "--quiet"});
  argv.insert(argv.end(), train.begin(), train.end());
  const ProcessResult r = run_process(argv, with_timeout_env({{"NANODDP_SHM_CHUNK_KB", "16384"}}));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "allreduce goes over TCP, not shared memory"));
  CHECK(contains(r.output, "posix_fallocate"));
  CHECK(contains(r.output, "No space left on device"));
}

// An outside tester: under nanoddp-run, a rank that failed before it joined kept its store up
// (rank 0) or told the others, which then exited as fast as it did, and the launcher's summary
// often named an innocent rank as the one that failed first. A launcher that stops the others
// is left to do so: the culprit exits at once and is named.
TEST_CASE("bad input: under nanoddp-run the rank that failed before it joined is named first") {
  TempDir dir;
  const std::string wrapper = dir.file("wrap.sh");
  std::ofstream(wrapper) << "#!/bin/sh\nif [ \"$RANK\" = \"$BAD_RANK\" ]; then exec \"$@\" "
                            "--no-such-flag; fi\nexec \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  for (const char* bad : {"0", "1"}) {
    CAPTURE(bad);
    std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2", wrapper};
    const auto train = train_argv({"--steps", "5", "--quiet"});
    argv.insert(argv.end(), train.begin(), train.end());
    ProcessOptions o = with_timeout_env({{"BAD_RANK", bad}, {"NANODDP_TIMEOUT_S", "60"}});
    const ProcessResult r = run_process(argv, o);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, fmt::format("nanoddp-run: rank {} (pid", bad)));
    CHECK(std::regex_search(r.output,
                            std::regex(fmt::format("rank {} \\(pid [0-9]+\\) failed first", bad))));
    CHECK_FALSE(contains(r.output, "stopped before it joined the job"));
  }
}

// Outside testers': with one rank of three (or two of eight) given other settings, every rank
// reported the disagreement as its own, and nanoddp-run named whichever exited first. The odd
// ranks (outside the largest group) are named now; their wrapper waits a second after the
// trainer, so they exit last.
TEST_CASE("bad input: under nanoddp-run a rank with other settings than most is named first") {
  TempDir dir;
  const std::string wrapper = dir.file("wrap.sh");
  std::ofstream(wrapper) << "#!/bin/sh\ncase \" $ODD \" in *\" $RANK \"*) \"$@\" --lr 0.5; rc=$?; "
                            "sleep 1; exit $rc;; esac\nexec \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  struct Case {
    int ranks;
    std::string odd;
    std::set<int> named;  // any of these
  };
  for (const Case& c : {Case{3, "2", {2}}, Case{5, "1 3", {1, 3}}}) {
    CAPTURE(c.odd);
    std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node",
                                     std::to_string(c.ranks), wrapper};
    const auto train = train_argv({"--steps", "5", "--quiet"});
    argv.insert(argv.end(), train.begin(), train.end());
    const ProcessResult r =
        run_process(argv, with_timeout_env({{"NANODDP_TIMEOUT_S", "60"}, {"ODD", c.odd}}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    std::smatch m;
    REQUIRE(std::regex_search(r.output, m,
                              std::regex(R"(rank ([0-9]+) \(pid [0-9]+\) failed first: exit code )"
                                         R"(2: the ranks disagree on command-line setting)")));
    CHECK(c.named.count(std::stoi(m[1].str())) == 1);
  }
}

// An outside operator's wrapper gave --metrics to rank 1 alone: exit 0, and no metrics file,
// without a word. What only rank 0 writes is not refused when it differs (a node-local path per
// host is common), but said.
TEST_CASE("bad input: an output only rank 0 writes, given otherwise on another rank, is said") {
  TempDir dir;
  const auto base = train_argv({"--steps", "4", "--quiet"});
  auto one = base;
  for (const std::string& a : {std::string("--metrics"), dir.file("m1.jsonl"),
                               std::string("--save"), dir.file("p1.safetensors")}) {
    one.push_back(a);
  }
  const auto results = ranks_by_hand({base, one}, {{{"RANK", "0"}, {"WORLD_SIZE", "2"}},
                                                   {{"RANK", "1"}, {"WORLD_SIZE", "2"}}});
  INFO(results[0].output, results[1].output);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  CHECK(contains(results[0].output,
                 "note: rank 1 gives --metrics '" + dir.file("m1.jsonl") +
                     "', rank 0 none: only rank 0 writes --metrics, so rank 1's is not used"));
  CHECK(contains(results[0].output, "note: rank 1 gives --save '" + dir.file("p1.safetensors") +
                                        "', rank 0 none"));
  CHECK_FALSE(contains(results[0].output, "--keep"));  // the same (no checkpoints) on both
  CHECK_FALSE(fs::exists(dir.file("m1.jsonl")));
}

TEST_CASE("bad input: malformed or missing launcher variables name the variable (exit 2)") {
  struct Case {
    std::map<std::string, std::string> env;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "abc"}},
       "MASTER_PORT"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}, "MASTER_ADDR"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}},
       "RANK"},
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"NANODDP_LAUNCHER_PID", "abc"}},
       "NANODDP_LAUNCHER_PID"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_process(train_argv({"--steps", "1"}), with_timeout_env(c.env));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, c.expected));
  }
}

TEST_CASE("bad input: a worker whose nanoddp-run is already gone stops at start (exit 2)") {
  // A launcher that died before its worker got going: NANODDP_LAUNCHER_PID names a process
  // that is not among the worker's ancestors (here a live sibling), so the worker, orphaned,
  // must not train on unsupervised.
  BackgroundProcess sibling({"/bin/sleep", "30"});
  const std::string pid = std::to_string(sibling.pid());
  const ProcessResult r = run_process(
      train_argv({"--steps", "5"}),
      with_timeout_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"NANODDP_LAUNCHER_PID", pid}}));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "NANODDP_LAUNCHER_PID=" + pid));
  CHECK(contains(r.output, "no longer running"));
}

TEST_CASE("bad input: MASTER_PORT held by a foreign process fails rank 0, and rank 1 ends too") {
  // A foreign listener on the port, which accepts nothing and answers nothing.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 16) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));

  const auto start = Clock::now();
  const auto argv = train_argv({"--steps", "5", "--quiet"});
  const auto results = two_ranks(argv, argv, {{"MASTER_PORT", port}}, {{"MASTER_PORT", port}});
  close(fd);
  INFO(describe(results));
  CHECK(seconds_since(start) < 20.0);
  CHECK(results[0].exit_code == 2);
  CHECK(contains(
      results[0].output,
      fmt::format("cannot start the store on 127.0.0.1:{}: address already in use", port)));
  // Rank 1 reached the foreign listener, which never answers: a bounded failure, not a hang,
  // and a store that does not answer (exit 1), as it would be if rank 0 had died: rank 1
  // cannot tell the two apart.
  CHECK_FALSE(results[1].timed_out);
  CHECK(results[1].exit_code == 1);
  CHECK(contains(results[1].output, "127.0.0.1:" + port));
}

TEST_CASE("bad input: an unreachable master fails within the timeout, naming the address") {
  const std::string port = std::to_string(free_port());
  const auto start = Clock::now();
  const ProcessResult r =
      run_process(train_argv({"--steps", "5"}), with_timeout_env({{"RANK", "1"},
                                                                  {"WORLD_SIZE", "2"},
                                                                  {"MASTER_ADDR", "127.0.0.2"},
                                                                  {"MASTER_PORT", port}}));
  const double took = seconds_since(start);
  INFO(r.output);
  // A store that cannot be reached within the timeout is a communication failure (exit 1, not
  // the usage error 2: rank 0 may be late or dead, and a launcher may restart it); the message
  // still asks whether MASTER_ADDR is right.
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "cannot reach the store at 127.0.0.2:" + port));
  CHECK(took >= 4.5);
  CHECK(took < 12.0);
}

TEST_CASE("bad input: another model or bucket cap on one rank is refused on every rank") {
  struct Case {
    std::vector<std::string> rank1;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {{"--hidden", "32"}, {"--hidden 16", "--hidden 32"}},
      {{"--bucket-cap-mb", "7"}, {"bucket_cap_mb=25", "bucket_cap_mb=7"}},
      {{"--comm-hook", "bf16"}, {"comm_hook"}},
      // The synthetic data: a rank with other noise or another teacher trains on other samples.
      {{"--noise", "0.5"}, {"--noise 0.001", "--noise 0.5"}},
      {{"--teacher-hidden", "8"}, {"--teacher-hidden 0", "--teacher-hidden 8"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> extra = {"--steps", "5", "--quiet"};
    auto argv1 = extra;
    argv1.insert(argv1.end(), c.rank1.begin(), c.rank1.end());
    const auto results = two_ranks(train_argv(extra), train_argv(argv1));
    INFO(describe(results));
    for (const auto& r : results) {
      CHECK_FALSE(r.timed_out);
      CHECK(r.exit_code == 2);
      for (const auto& e : c.expected) CHECK_MESSAGE(contains(r.output, e), e);
    }
  }
}

TEST_CASE("bad input: .npy files with the wrong dtype, Fortran order or NaN (exit 2, named)") {
  TempDir dir;
  write_good_npy(dir);
  struct Case {
    std::string name, descr;
    bool fortran;
    std::string data;
    std::vector<std::string> expected;
  };
  std::vector<float> nan_data(16 * 4, 0.5f);
  nan_data[9] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"int.npy", "<i8", false, std::string(16 * 4 * 8, '\0'), {"int.npy", "'<i8'", "float32"}},
      {"fortran.npy", "<f4", true, std::string(16 * 4 * 4, '\0'), {"fortran.npy", "Fortran"}},
      {"nan.npy",
       "<f4",
       false,
       std::string(reinterpret_cast<const char*>(nan_data.data()), nan_data.size() * 4),
       {"nan.npy", "non-finite", "row 2, column 1"}},
  };
  for (const Case& c : cases) {
    write_raw_npy(dir.file(c.name), c.descr, c.fortran, c.data, "(16, 4)");
    const ProcessResult r = run_process(npy_train(dir.file(c.name), dir.file("y.npy")));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    for (const auto& e : c.expected) CHECK_MESSAGE(contains(r.output, e), e);
  }
}

TEST_CASE("bad input: --resume from a damaged or foreign checkpoint is refused (exit 2)") {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const auto make = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--quiet", "--checkpoint-dir", ckpt};
    a.insert(a.end(), extra.begin(), extra.end());
    return train_argv(a);
  };
  const ProcessResult saved = run_process(make({"--steps", "4", "--checkpoint-every", "4"}));
  REQUIRE_MESSAGE(saved.exit_code == 0, saved.output);
  const std::string path = ckpt + "/step-000000004.safetensors";
  REQUIRE(fs::exists(path));
  const std::string pristine = dir.file("pristine");
  fs::copy_file(path, pristine);
  const auto restore = [&] { fs::copy_file(pristine, path, fs::copy_options::overwrite_existing); };

  SUBCASE("truncated") {
    fs::resize_file(path, fs::file_size(path) - 100);
    const ProcessResult r = run_process(make({"--steps", "8", "--resume"}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, path));
  }
  SUBCASE("a bit flipped in the data") {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-20, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    f.seekp(-20, std::ios::end);
    byte = static_cast<char>(byte ^ 0x10);
    f.write(&byte, 1);
    f.close();
    const ProcessResult r = run_process(make({"--steps", "8", "--resume"}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "is corrupted"));
    CHECK(contains(r.output, path));
  }
  SUBCASE("another model") {
    const ProcessResult r = run_process(make({"--steps", "8", "--resume", "--hidden", "20"}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    // From the checkpoint's header, before its tensors: the setting that differs, both values.
    CHECK(contains(r.output, "was saved from another model"));
    CHECK(contains(r.output, "hidden 16 there, 20 in this run (--hidden)"));
  }
  SUBCASE("another optimizer") {
    const ProcessResult r =
        run_process(make({"--steps", "8", "--resume", "--optimizer", "sgd", "--lr", "0.1"}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "--optimizer"));
  }
  SUBCASE("an older format version") {
    nanoddp::testing::rewrite_metadata(pristine, path, "format_version", "0");
    const ProcessResult r = run_process(make({"--steps", "8", "--resume"}));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "format version 0"));
  }
  restore();
  const ProcessResult ok = run_process(make({"--steps", "8", "--resume"}));
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);  // the pristine file resumes: the cases were real
}

TEST_CASE("bad input: an unusable --checkpoint-dir is refused before training (exit 2)") {
  TempDir dir;
  const std::string file = dir.file("a-file");
  std::ofstream(file) << "x";
  const ProcessResult r = run_process(train_argv(
      {"--steps", "100", "--checkpoint-every", "10", "--checkpoint-dir", file + "/sub"}));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, file + "/sub"));
  CHECK_FALSE(contains(r.output, "step   1/"));  // no step ran
}

TEST_CASE("bad input: an unwritable --save folder is refused before training (exit 2)") {
  // The parameters are written after the last step: finding out only then loses the whole run.
  TempDir dir;
  const std::string file = dir.file("a-file");
  std::ofstream(file) << "x";
  const ProcessResult r =
      run_process(train_argv({"--steps", "100", "--save", file + "/sub/params.safetensors"}));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--save"));
  CHECK(contains(r.output, file + "/sub"));
  CHECK_FALSE(contains(r.output, "step   1/"));  // no step ran
}

// Rank 0's failed checkpoint write ends every rank at once: rank 0 names the file and the cause,
// rank 1 says that rank 0 failed writing a checkpoint (it used to wait in the next step's
// collectives until their timeout, then report a collective failure instead).
void check_checkpoint_failure_ends_both(const std::string& rank0, const std::string& rank1,
                                        const std::string& dir, const std::string& cause) {
  INFO("rank 0:\n", rank0, "\nrank 1:\n", rank1);
  std::smatch m;
  REQUIRE(std::regex_search(
      rank0, m, std::regex("error: cannot write '" + dir + "/step-0*([0-9]+)\\.safetensors'")));
  CHECK(contains(rank0, cause));
  CHECK(contains(rank1, "error: rank 0 failed writing a checkpoint at step " + m[1].str() +
                            ", so every rank stops: cannot write '" + dir + "/step-"));
  CHECK(contains(rank1, cause));
  CHECK_FALSE(contains(rank1, "Gloo"));  // not a collective's timeout or lost peer
  // The run stops, but this checkpoint is kept: written where temporary files go, and named.
  std::smatch rescued;
  REQUIRE(std::regex_search(rank0, rescued,
                            std::regex("This checkpoint was written to '([^']+)' instead: move "
                                       "it into --checkpoint-dir, then --resume")));
  CHECK(nanoddp::nn::read_safetensors(rescued[1].str()).metadata().at("step") == m[1].str());
}

TEST_CASE("bad input: a full disk under rank 0's checkpoint write ends every rank, naming it") {
  TempDir dir;
  const SmallDisk disk(dir.file("small"), "1m");
  if (!disk.mounted) return;
  const std::string& mnt = disk.path;
  const std::vector<std::string> argv =
      with_env({{"TMPDIR", dir.path()}},
               train_argv({"--hidden", "120", "--steps", "30", "--checkpoint-every", "1", "--keep",
                           "100", "--checkpoint-dir", mnt, "--quiet"}));
  const auto results = two_ranks(argv, argv);
  for (const auto& r : results) {
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
  }
  check_checkpoint_failure_ends_both(results[0].output, results[1].output, mnt,
                                     "No space left on device");
}

TEST_CASE("bad input: a checkpoint folder turned read-only mid-run ends every rank, naming it") {
  TempDir dir;
  const SmallDisk disk(dir.file("ro"), "4m");
  if (!disk.mounted) return;
  const std::string& mnt = disk.path;
  auto ranks = start_ranks(train_argv({"--steps", "100000000", "--checkpoint-every", "1", "--keep",
                                       "2", "--checkpoint-dir", mnt, "--log-every", "1000"}),
                           2, {{"NANODDP_TIMEOUT_S", "5"}, {"TMPDIR", dir.path()}});
  REQUIRE_MESSAGE(
      ranks[0]->wait_for_output([](const std::string& out) { return contains(out, "loss "); }, 60s),
      ranks[0]->output());
  REQUIRE_FALSE(nanoddp::nn::list_checkpoints(mnt).empty());  // checkpoints are being written
  // A checkpoint being written holds a file open for writing, which makes the remount busy:
  // retry until it lands between two writes.
  bool read_only = false;
  for (int attempt = 0; attempt < 1000 && !read_only; ++attempt) {
    read_only = mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0;
    if (!read_only) std::this_thread::sleep_for(1ms);
  }
  REQUIRE_MESSAGE(read_only, "remount read-only failed: ", std::strerror(errno));
  std::optional<int> status[2];
  for (int r = 0; r < 2; ++r) status[r] = ranks[static_cast<std::size_t>(r)]->wait(60s);
  INFO("rank 0: ", status_text(status[0]), ", rank 1: ", status_text(status[1]));
  CHECK(exited_with(status[0], 1));
  CHECK(exited_with(status[1], 1));
  check_checkpoint_failure_ends_both(ranks[0]->output(), ranks[1]->output(), mnt,
                                     "Read-only file system");
}

TEST_CASE("bad input: a disk that fills up during a checkpoint write names the path (exit 1)") {
  TempDir dir;
  // 1 MiB of tmpfs: a few ~200 KB checkpoints fit (--keep 100 keeps them all), then one fails.
  const SmallDisk disk(dir.file("small"), "1m");
  if (!disk.mounted) return;
  const std::string& mnt = disk.path;
  const ProcessResult r =
      run_process(with_env({{"TMPDIR", dir.path()}},
                           train_argv({"--hidden", "120", "--steps", "30", "--checkpoint-every",
                                       "1", "--keep", "100", "--checkpoint-dir", mnt, "--quiet"})));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "No space left on device"));
  const auto listed = nanoddp::nn::list_checkpoints(mnt);
  REQUIRE(!listed.empty());
  const std::string failed = fmt::format("{}/step-{:09}.safetensors", mnt, listed.size() + 1);
  CHECK(contains(r.output, "cannot write '" + failed + "'"));
  // The earlier checkpoints survive whole and no temporary file is left.
  for (const std::string& path : listed) CHECK_NOTHROW(nanoddp::nn::read_safetensors(path));
  for (const auto& entry : fs::directory_iterator(mnt)) {
    CHECK_MESSAGE(!entry.path().filename().string().starts_with("."), entry.path());
  }
  const ProcessResult resumed =
      run_process(train_argv({"--hidden", "120", "--steps", std::to_string(listed.size() + 1),
                              "--checkpoint-dir", mnt, "--resume", "--quiet"}));
  CHECK_MESSAGE(resumed.exit_code == 0, resumed.output);
}

TEST_CASE("bad input: a full disk under the --trace write leaves the old trace whole (exit 1)") {
  // The trace is written after the last step: a full disk used to leave it truncated (JSON no
  // viewer opens) in place of the previous one. Now it goes through a temporary file.
  TempDir dir;
  const SmallDisk disk(dir.file("small"), "64k");
  if (!disk.mounted) return;
  const std::string& mnt = disk.path;
  const std::string trace = mnt + "/trace.json";
  { std::ofstream(trace) << "{\"traceEvents\":[]}\n"; }
  const ProcessResult r = run_process(with_env(
      {{"TMPDIR", dir.path()}},
      train_argv({"--steps", "300", "--trace", trace, "--trace-steps", "300", "--quiet"})));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "No space left on device"));
  // Rescued where temporary files go, whole.
  std::smatch rescued;
  REQUIRE(std::regex_search(
      r.output, rescued,
      std::regex("It was written to '([^']+/nanoddp-rescue-[^/']+/trace\\.json)' instead")));
  CHECK(fs::file_size(rescued[1].str()) > 1000);
  CHECK(contains(r.output, "--trace '" + trace + "' could not be written"));
  std::ifstream in(trace);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(kept == "{\"traceEvents\":[]}\n");
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(mnt)) ++files;
  CHECK(files == 1);  // no temporary left behind
}
