// Faults injected into real training jobs: real nanoddp-train processes over real Gloo, real
// signals (SIGKILL, SIGSTOP) sent from outside, real checkpoint files. No test hook lives in the
// product: every fault comes from the test. Each test bounds every wait; collectives time out
// after NANODDP_TIMEOUT_S = 5 s.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "faults/faults_util.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/npy.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/safetensors.h"
#include "support/saved_parameters.h"

using namespace nanoddp::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr int kTimeoutS = 5;
// Time a surviving rank may take to notice and exit: the collective timeout plus slack for
// the teardown (the store check-out is bounded by the same timeout).
constexpr auto kExitWithin = std::chrono::seconds(2 * kTimeoutS + 8);

std::map<std::string, std::string> fault_env() {
  return {{"NANODDP_TIMEOUT_S", std::to_string(kTimeoutS)}};
}

bool has_progress(const std::string& out) {
  return contains(out, "loss ");
}

// Kills rank `victim` with `signo` once training runs, then checks that every other rank ends
// on its own, non-zero, within the bound, naming an operation and a rank.
void kill_one_rank(int world, int victim, int signo) {
  auto ranks =
      start_ranks(train_argv({"--steps", "100000", "--log-every", "1000"}), world, fault_env());
  REQUIRE_MESSAGE(ranks[0]->wait_for_output(has_progress, 30s), ranks[0]->output());
  std::this_thread::sleep_for(200ms);  // well inside the training loop
  ranks[static_cast<std::size_t>(victim)]->send(signo);
  const auto start = Clock::now();
  int named = 0, lost = 0, timed_out = 0;
  std::string outputs;
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    auto& rank = *ranks[static_cast<std::size_t>(r)];
    const auto status = rank.wait(kExitWithin);
    const double took = seconds_since(start);
    INFO("rank ", r, ": ", status_text(status), " after ", took, " s\n", rank.output());
    REQUIRE(status.has_value());  // it ended by itself: no hang
    CHECK(exited_with(status, 1));
    // The message names the operation with its sequence number.
    CHECK(
        std::regex_search(rank.output(), std::regex(R"(Gloo \w+ #[0-9]+ \(.*\) failed on rank)")));
    timed_out += contains(rank.output(), fmt::format("timed out after {}.0 s", kTimeoutS));
    // "rank V may have crashed", "ranks 1, V did not report reaching this op", ...
    named += std::regex_search(
        rank.output(),
        std::regex(fmt::format(
            R"(ranks? (?:[0-9]+, )*{}(?:, [0-9]+)* (?:may have crashed|did not report))", victim)));
    // TCP: the closed socket; shared memory: the victim's pid is gone.
    lost += contains(rank.output(), fmt::format("lost the connection to rank {}", victim)) ||
            contains(rank.output(), fmt::format("rank {} did not arrive: its process", victim));
    outputs += fmt::format("---- rank {} after {:.1f} s:\n{}", r, took, rank.output());
  }
  // The victim's ring neighbour sees the closed socket (or, for SIGSTOP, the missing report)
  // and names it; a rank further round the ring may instead time out in a send, or be failed
  // by a cascade, and then says "another rank" (as tests/comm/test_gloo.cpp describes).
  INFO(outputs);
  CHECK(named >= 1);
  // A crash is seen as a closed connection or a vanished peer process (at once), not only as a
  // timeout.
  if (signo == SIGKILL) CHECK(lost >= 1);
  // A hang is found by the timeout (a rank that timed out and exited may then fail the last
  // one with a closed connection: also an error, also bounded).
  if (signo == SIGSTOP) CHECK(timed_out >= 1);
  if (signo == SIGSTOP) {
    // The stopped rank is cleaned up by the test (SIGKILL reaches a stopped process).
    ranks[static_cast<std::size_t>(victim)]->send(SIGKILL);
    CHECK(ranks[static_cast<std::size_t>(victim)]->wait(10s).has_value());
  }
}

}  // namespace

TEST_CASE("kill -9 of rank 0 (the store host) mid-training ends every other rank") {
  kill_one_rank(3, 0, SIGKILL);
}

TEST_CASE("kill -9 of a non-zero rank mid-training ends every other rank") {
  kill_one_rank(3, 1, SIGKILL);
}

TEST_CASE("SIGSTOP of a rank (a hang) makes the others time out and exit") {
  kill_one_rank(3, 2, SIGSTOP);
}

// An outside adversary's: with rank 0 (the store's host) stopped, rank 1 printed its error after
// one timeout, then spent a second whole timeout checking out of the frozen store.
TEST_CASE("SIGSTOP of rank 0 (the store host): the other rank exits about one timeout after") {
  constexpr int kTimeout = 8;
  auto ranks = start_ranks(train_argv({"--steps", "100000000", "--log-every", "1000"}), 2,
                           {{"NANODDP_TIMEOUT_S", std::to_string(kTimeout)}});
  REQUIRE_MESSAGE(ranks[0]->wait_for_output(has_progress, 30s), ranks[0]->output());
  ranks[0]->send(SIGSTOP);
  const auto start = Clock::now();
  const auto status = ranks[1]->wait(std::chrono::seconds(4 * kTimeout));
  const double took = seconds_since(start);
  INFO(status_text(status), " after ", took, " s\n", ranks[1]->output());
  CHECK(exited_with(status, 1));
  // Stopped before the op, or inside it (then it is "in this op but did not arrive").
  CHECK(std::regex_search(
      ranks[1]->output(),
      std::regex("rank 0 (did not report reaching this op|is in this op but did not arrive)")));
  // One timeout, then at most 2 s of check-out and the teardown: not two timeouts.
  CHECK(took < kTimeout + 5);
  ranks[0]->send(SIGKILL);
  CHECK(ranks[0]->wait(10s).has_value());
}

// The hung-job guide (docs/reliability.md) suggests --trace; a job that hung inside its traced
// steps could not gather them on rank 0 and wrote nothing. Now each rank writes what it traced
// beside --trace: under nanoddp-run, rank 0 when its all-reduce times out waiting for a stopped
// rank 1, and rank 1 when the launcher then stops it (SIGTERM, after a SIGCONT).
TEST_CASE("a hang inside the traced steps: each rank writes what it traced, alone") {
  TempDir dir;
  const std::string trace = dir.file("t.json");
  std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2",
                                   "--grace-period", "10"};
  for (const auto& a : train_argv({"--steps", "100000", "--log-every", "1000", "--trace", trace,
                                   "--trace-steps", "100000"})) {
    argv.push_back(a);
  }
  BackgroundProcess launcher(with_env(fault_env(), argv));
  REQUIRE_MESSAGE(launcher.wait_for_output(has_progress, 30s), launcher.output());
  std::this_thread::sleep_for(200ms);
  pid_t victim = -1;
  for (const pid_t child : children_of(launcher.pid())) {
    if (environ_of(child, "RANK") == "1") victim = child;
  }
  REQUIRE(victim > 0);
  REQUIRE(kill(victim, SIGSTOP) == 0);
  const auto status = launcher.wait(kExitWithin + 10s);
  const std::string out = launcher.output();
  INFO(status_text(status), "\n", out);
  REQUIRE(status.has_value());
  CHECK(exited_with(status, 1));
  CHECK(contains(out, "--trace '" + trace + "' was not written"));
  CHECK_FALSE(fs::exists(trace));
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const std::string partial = dir.file(fmt::format("t.rank{}.partial.json", rank));
    std::smatch m;
    REQUIRE(std::regex_search(
        out, m,
        std::regex(fmt::format("rank {} {} in step ([0-9]+), inside its traced steps: what it "
                               "traced is in '{}' \\(this rank's events alone\\)",
                               rank, rank == 0 ? "stopped" : "got SIGTERM", partial))));
    const long stopped = std::stol(m[1].str());
    std::ifstream in(partial);
    const nlohmann::json file = nlohmann::json::parse(in);
    int forwards = 0, optimizer_steps = 0, others = 0;
    nlohmann::json config;
    for (const auto& e : file.at("traceEvents")) {
      others += e.at("pid") != rank;
      if (e.at("name") == "run_config") config = e.at("args");
      forwards += e.at("name") == "forward";
      optimizer_steps += e.at("name") == "optimizer step";
    }
    CHECK(others == 0);  // this rank's events alone
    CHECK(config["partial"] == true);
    CHECK(config["rank"] == rank);
    CHECK(config["world_size"] == 2);
    CHECK(config["first_step"] == 1);
    CHECK(config["stopped_in_step"] == stopped);
    CHECK(config["last_step"] == stopped);
    // The steps before the one it stopped in, whole, and that step's forward; a rank stopped
    // after its step's optimizer (logging, before the next step) has that step whole too.
    CHECK(optimizer_steps >= stopped - 1);
    CHECK(optimizer_steps <= stopped);
    CHECK(forwards == stopped);
  }
}

// An outside tester's Ctrl-Z, held longer than NANODDP_TIMEOUT_S: nanoddp-run stopped every rank
// with itself, yet at SIGCONT the shared-memory all-reduce counted the stop against its deadline
// and failed the job at once ("rank 1 did not report reaching this op"). What the launcher does
// on Ctrl-Z, done here to the ranks themselves (a launcher without a terminal is not stopped).
namespace {
void check_stopped_and_continued(const std::map<std::string, std::string>& transport, int rounds) {
  // Long enough to be stopped mid-run in any build; under TSan a step is ten times slower, and
  // 40,000 steps took three rounds past the test's 300 s (a CI rehearsal).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  const std::string steps = "6000";
#else
  const std::string steps = "40000";
#endif
  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    std::map<std::string, std::string> env = {{"NANODDP_TIMEOUT_S", "2"}};
    env.insert(transport.begin(), transport.end());
    auto ranks = start_ranks(train_argv({"--steps", steps, "--log-every", "1000"}), 2, env);
    REQUIRE_MESSAGE(ranks[0]->wait_for_output(has_progress, 30s), ranks[0]->output());
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 37 * round));
    ranks[0]->send(SIGSTOP);
    ranks[1]->send(SIGSTOP);
    std::this_thread::sleep_for(4s);  // two timeouts
    ranks[1]->send(SIGCONT);
    ranks[0]->send(SIGCONT);
    for (auto& rank : ranks) {
      const auto status = rank->wait(60s);
      INFO(status_text(status), "\n", rank->output());
      CHECK(exited_with(status, 0));
    }
  }
}
}  // namespace

TEST_CASE("every rank stopped longer than the timeout, then continued: the job goes on") {
  check_stopped_and_continued({}, 3);
}

// The same over nanoddp's TCP ring, whose waits also move their deadline by the time the process
// did not run (an outside tester's: the ring failed the job at SIGCONT, blaming a rank).
TEST_CASE("every rank stopped longer than the timeout, then continued: the job goes on (TCP)") {
  check_stopped_and_continued({{"NANODDP_SHM", "0"}}, 2);
}

TEST_CASE("under nanoddp-run a killed rank is named first in the launcher's summary") {
  TempDir dir;
  std::vector<std::string> argv = {
      bin_path("nanoddp-run"), "--nproc-per-node", "2", "--grace-period", "3", "--log-dir",
      dir.file("logs")};
  for (const auto& a : train_argv({"--steps", "100000", "--log-every", "1000"})) {
    argv.push_back(a);
  }
  BackgroundProcess launcher(with_env(fault_env(), argv));
  REQUIRE_MESSAGE(launcher.wait_for_output(has_progress, 30s), launcher.output());
  pid_t victim = -1;
  for (const pid_t child : children_of(launcher.pid())) {
    if (environ_of(child, "RANK") == "1") victim = child;
  }
  REQUIRE(victim > 0);
  REQUIRE(kill(victim, SIGKILL) == 0);
  const auto status = launcher.wait(20s);
  INFO(status_text(status), "\n", launcher.output());
  REQUIRE(status.has_value());
  CHECK(exited_with(status, 137));  // 128 + SIGKILL: the first failure's code
  CHECK(contains(launcher.output(),
                 fmt::format("rank 1 (pid {}) failed first: killed by SIGKILL", victim)));
  CHECK(std::regex_search(launcher.output(),
                          std::regex(R"(\n +1 +1 +[0-9]+ +killed by SIGKILL  <- failed first)")));
}

TEST_CASE(
    "under nanoddp-run the rank whose checkpoint failed is named first, not the rank it stopped") {
  // Rank 0 cannot write a checkpoint (its folder replaced by a file mid-run) and tells rank 1
  // through the store; rank 1 exits at once, often before rank 0 has finished saying why, and
  // the launcher used to name rank 1. Rank 0's wrapper waits a second more, so that rank 1 is
  // always first to exit: the workers' error files decide.
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2",
                                   "--grace-period", "5"};
  for (const auto& a :
       exits_last(0, train_argv({"--steps", "10000000", "--log-every", "1000", "--checkpoint-dir",
                                 ckpt, "--checkpoint-every", "100"}))) {
    argv.push_back(a);
  }
  std::map<std::string, std::string> env = fault_env();
  env["TMPDIR"] = dir.path();  // where rank 0 rescues the checkpoint it could not write
  BackgroundProcess launcher(with_env(env, argv));
  const auto has_checkpoint = [&] {
    std::error_code ec;
    for (auto it = fs::directory_iterator(ckpt, ec); !ec && it != fs::directory_iterator(); ++it) {
      if (it->path().extension() == ".safetensors") return true;
    }
    return false;
  };
  const auto start = Clock::now();
  while (!has_checkpoint() && seconds_since(start) < 30.0) std::this_thread::sleep_for(10ms);
  REQUIRE_MESSAGE(has_checkpoint(), launcher.output());
  fs::remove_all(ckpt);
  std::ofstream(ckpt) << "not a folder";
  const auto status = launcher.wait(30s);
  INFO(status_text(status), "\n", launcher.output());
  REQUIRE(status.has_value());
  CHECK(exited_with(status, 1));
  CHECK(std::regex_search(
      launcher.output(),
      std::regex(R"(nanoddp-run: rank 0 \(pid [0-9]+\) failed first: exit code 1: cannot create )"
                 R"(the checkpoint directory)")));
  CHECK(std::regex_search(launcher.output(),
                          std::regex(R"(\n +0 +0 +[0-9]+ +exit code 1  <- failed first\n)")));
  CHECK(std::regex_search(launcher.output(),
                          std::regex(R"(\n +1 +1 +[0-9]+ +exit code 1, because rank 0 failed\n)")));
}

// An outside tester's: with rank 0 suspended (SIGSTOP), the others timed out in their
// collectives and one was named first, with nothing pointing at rank 0; and rank 0, still
// suspended, took its SIGTERM only at the SIGKILL after the whole grace period.
TEST_CASE(
    "under nanoddp-run a suspended rank is pointed at, and stopped without its grace period") {
  std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "3",
                                   "--grace-period", "30"};
  for (const auto& a : train_argv({"--steps", "10000000", "--log-every", "1000"})) {
    argv.push_back(a);
  }
  std::map<std::string, std::string> env = fault_env();
  env["NANODDP_TIMEOUT_S"] = "3";
  BackgroundProcess launcher(with_env(env, argv));
  REQUIRE_MESSAGE(launcher.wait_for_output(has_progress, 30s), launcher.output());
  pid_t victim = -1;
  for (const pid_t child : children_of(launcher.pid())) {
    if (environ_of(child, "RANK") == "0") victim = child;
  }
  REQUIRE(victim > 0);
  REQUIRE(kill(victim, SIGSTOP) == 0);
  const auto status = launcher.wait(25s);  // less than the grace period
  INFO(status_text(status), "\n", launcher.output());
  REQUIRE(status.has_value());
  CHECK(exited_with(status, 1));
  CHECK(std::regex_search(
      launcher.output(),
      std::regex(R"(\n +0 +0 +[0-9]+ +stopped by launcher \(killed by SIGTERM\), )"
                 R"(it was suspended \(SIGSTOP\) when the others failed\n)")));
  CHECK(
      std::regex_search(launcher.output(),
                        std::regex(R"(failed first: exit code 1, after a communication failure)")));
}

namespace {

// Whether a process with this pid still exists (a zombie, awaiting its reaper, counts as gone).
bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // pid (comm) state ...: comm may contain spaces, so the state follows the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace

TEST_CASE("a SIGKILLed nanoddp-run takes its workers with it") {
  // SIGKILL leaves the launcher no chance to stop anyone, and the workers live in process groups
  // of their own: they must notice the launcher's death themselves (parent-death signal).
  std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  for (const auto& a : train_argv({"--steps", "100000000", "--log-every", "1000"})) {
    argv.push_back(a);
  }
  BackgroundProcess launcher(with_env(fault_env(), argv));
  REQUIRE_MESSAGE(launcher.wait_for_output(has_progress, 30s), launcher.output());
  const std::vector<pid_t> workers = children_of(launcher.pid());
  REQUIRE(workers.size() == 2);
  for (const pid_t w : workers) REQUIRE(contains(cmdline_of(w), "nanoddp-train"));
  REQUIRE(kill(launcher.pid(), SIGKILL) == 0);
  const auto status = launcher.wait(5s);
  REQUIRE(status.has_value());
  const auto start = Clock::now();
  std::vector<pid_t> left = workers;
  while (!left.empty() && seconds_since(start) < 5.0) {
    std::erase_if(left, [](pid_t pid) { return !process_alive(pid); });
    std::this_thread::sleep_for(20ms);
  }
  // Whatever the outcome, no worker outlives the test.
  for (const pid_t pid : left) kill(pid, SIGKILL);
  INFO(launcher.output());
  CHECK_MESSAGE(left.empty(), left.size(), " worker(s) still running 5 s after the launcher died");
}

TEST_CASE("a rank that dies during the shared-memory set-up leaves no segment in /dev/shm") {
  // Rank 1 exits after rank 0 created /dev/shm/nanoddp-<pid>-<hex> and before rank 1 attached;
  // the launcher's SIGTERM then ends rank 0 without its destructor, the one that unlinks.
  const ProcessResult r =
      run_process({bin_path("nanoddp-run"), "--nproc-per-node", "2", "--grace-period", "2",
                   bin_path("nanoddp-test-shm-setup-worker")},
                  {.timeout = 40s});
  INFO(r.output);
  std::smatch m;
  REQUIRE(
      std::regex_search(r.output, m, std::regex(R"(saw segment /(nanoddp-[0-9]+-[0-9a-f]{16}))")));
  const fs::path segment = fs::path("/dev/shm") / m[1].str();
  const bool left = fs::exists(segment);
  if (left) fs::remove(segment);  // nor does a failing test leave it behind
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code == 3);  // rank 1's exit code: it failed first
  CHECK(contains(r.output, "rank 1 (pid"));
  CHECK_MESSAGE(!left, segment.string(), " was left behind");
  // Removed by the launcher, which says so (and not by, say, a late rank 0).
  CHECK(contains(r.output, "nanoddp-run: removed " + segment.string() + ", left by rank 0"));
}

namespace {

// Two ranks started by hand (no launcher to stop rank 0, as with a stopped or killed
// nanoddp-run); rank 1 is SIGKILLed once its NANODDP_DEBUG=DETAIL log reaches `phase`, a point
// of the set-up, or with no `phase` is never started. Rank 0's wait status and output, and the
// seconds from the kill (or rank 0's start) to its exit.
struct SetupDeath {
  std::optional<int> status;
  std::string output;
  double seconds = 0;
};

SetupDeath rank_1_gone_in_setup(const std::string& phase, int timeout_s) {
  // Steps enough that a kill after the set-up would find it training (and show it).
  const auto argv = train_argv({"--steps", "100000000", "--log-every", "1000000"});
  const std::string port = std::to_string(free_port());
  const auto env = [&](int rank) {
    std::map<std::string, std::string> e = {{"RANK", std::to_string(rank)},
                                            {"WORLD_SIZE", "2"},
                                            {"LOCAL_RANK", std::to_string(rank)},
                                            {"LOCAL_WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "127.0.0.1"},
                                            {"MASTER_PORT", port},
                                            {"NANODDP_TIMEOUT_S", std::to_string(timeout_s)}};
    if (rank == 1) e["NANODDP_DEBUG"] = "DETAIL";
    return e;
  };
  auto since = Clock::now();
  BackgroundProcess rank0(with_env(env(0), argv));
  std::optional<BackgroundProcess> rank1;
  if (!phase.empty()) {
    rank1.emplace(with_env(env(1), argv));
    REQUIRE_MESSAGE(
        rank1->wait_for_output([&](const std::string& o) { return contains(o, phase); }, 30s),
        rank1->output());
    rank1->send(SIGKILL);
    since = Clock::now();
  }
  SetupDeath out;
  out.status = rank0.wait(60s);
  out.seconds = seconds_since(since);
  out.output = rank0.output();
  return out;
}

}  // namespace

// Reported: rank 0 exited 2 (a usage error: launchers do not restart it) when a peer died while
// the process group connected, and took ~30 s under NANODDP_TIMEOUT_S=5: Gloo waits 5 x its
// timeout for a pair to connect (25 s), then rank 0 kept the store up 5 s more for the dead
// peer's check-out. Where the kill lands (before rank 1 connects its pair, after it, with rank 0
// listening or connecting) varies; every case is a communication failure naming rank 1.
TEST_CASE("a peer killed while the group connects: rank 0 exits 1 naming it, within the timeout") {
  const SetupDeath r = rank_1_gone_in_setup("store wait of key 'restart0/default/gloo/0'", 5);
  INFO(status_text(r.status), " after ", r.seconds, " s\n", r.output);
  REQUIRE(r.status.has_value());
  CHECK(exited_with(r.status, 1));
  CHECK(r.seconds < 20.0);  // was ~30 s when Gloo's own connect wait ran
  CHECK(contains(r.output, "nanoddp-train: error: Gloo group 'default': rank 0 of 2"));
  CHECK(std::regex_search(r.output, std::regex(R"(rank(\(s\))? 1\b)")));
  CHECK_FALSE(contains(r.output, "| device "));  // the banner: it never got past the set-up
}

// The same wait, deterministic: rank 1 never comes, so rank 0 waits the timeout for its Gloo
// address. The check-out that followed added min(timeout, 30 s) (here 12 s: 24 s in all, exit
// 2); after a communication failure it is now min(timeout / 2, 3 s).
TEST_CASE("a peer that never joins: rank 0 exits 1 after the timeout, without a long check-out") {
  const SetupDeath r = rank_1_gone_in_setup("", 12);
  INFO(status_text(r.status), " after ", r.seconds, " s\n", r.output);
  REQUIRE(r.status.has_value());
  CHECK(exited_with(r.status, 1));
  CHECK(r.seconds >= 11.0);  // the timeout: nothing says sooner that rank 1 will not come
  CHECK(r.seconds < 20.0);
  CHECK(contains(r.output, "rank(s) 1 never joined"));
}

TEST_CASE("--max-restarts recovers a killed rank from the newest checkpoint, bit for bit") {
  TempDir dir;
  const std::vector<std::string> training = {"--steps",     "1000",  "--log-every", "500",
                                             "--optimizer", "adamw", "--lr",        "0.01"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = training;
    a.insert(a.end(), extra.begin(), extra.end());
    return train_argv(a);
  };
  // The uninterrupted run.
  {
    std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
    for (const auto& a : with({"--save", dir.file("full")})) argv.push_back(a);
    ProcessOptions o;
    o.env = fault_env();
    o.timeout = 60s;
    const ProcessResult r = run_process(argv, o);
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  }
  // The same run with checkpoints every 200 steps; a rank is killed from outside once step 400
  // is on disk, and the launcher restarts the group, which resumes from the newest checkpoint.
  const std::string ckpt = dir.file("ckpt");
  std::vector<std::string> argv = {bin_path("nanoddp-run"),
                                   "--nproc-per-node",
                                   "2",
                                   "--max-restarts",
                                   "2",
                                   "--grace-period",
                                   "3"};
  for (const auto& a : with({"--checkpoint-dir", ckpt, "--checkpoint-every", "200", "--resume",
                             "--save", dir.file("recovered")})) {
    argv.push_back(a);
  }
  BackgroundProcess launcher(with_env(fault_env(), argv));
  const auto deadline = Clock::now() + 30s;
  while (!fs::exists(ckpt + "/step-000000400.safetensors") && Clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  REQUIRE_MESSAGE(fs::exists(ckpt + "/step-000000400.safetensors"), launcher.output());
  pid_t victim = -1;
  for (const pid_t child : children_of(launcher.pid())) {
    if (environ_of(child, "RANK") == "1") victim = child;
  }
  REQUIRE(victim > 0);
  REQUIRE(kill(victim, SIGKILL) == 0);  // it was still training: the job had not finished
  const auto status = launcher.wait(60s);
  const std::string& out = launcher.output();
  INFO(status_text(status), "\n", out);
  REQUIRE(exited_with(status, 0));
  CHECK(contains(out, "failed first: killed by SIGKILL"));
  CHECK(contains(out, "restarting the group (attempt 2 of 3)"));
  CHECK(contains(out, "all 2 workers exited 0 (attempt 2 of 3"));
  std::smatch m;
  REQUIRE(
      std::regex_search(out, m, std::regex(R"(resume: loaded \S+step-0*([0-9]+)\.safetensors)")));
  CHECK(std::stoi(m[1]) >= 400);
  CHECK(std::stoi(m[1]) < 1000);
  // The recovered job ends exactly where the uninterrupted one does.
  CHECK(all_parameters(dir.file("recovered")) == all_parameters(dir.file("full")));
}

TEST_CASE("a whole job killed, resumed on another number of ranks (same global batch)") {
  TempDir dir;
  auto argv_for = [&](int world, int batch, std::vector<std::string> extra) {
    std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node",
                                     std::to_string(world)};
    std::vector<std::string> train = train_argv(
        {"--steps", "600", "--log-every", "300", "--lr", "0.01", "--batch", std::to_string(batch)});
    train.insert(train.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), train.begin(), train.end());
    return argv;
  };
  ProcessOptions o;
  o.env = fault_env();
  o.timeout = 60s;
  const ProcessResult full = run_process(argv_for(2, 8, {"--save", dir.file("full")}), o);
  REQUIRE_MESSAGE(full.exit_code == 0, full.output);

  // 2 ranks x batch 8, killed as a whole (launcher and workers, SIGKILL) once step 300 is saved.
  const std::string ckpt = dir.file("ckpt");
  {
    BackgroundProcess launcher(with_env(
        fault_env(), argv_for(2, 8, {"--checkpoint-dir", ckpt, "--checkpoint-every", "150"})));
    const auto deadline = Clock::now() + 30s;
    while (!fs::exists(ckpt + "/step-000000300.safetensors") && Clock::now() < deadline) {
      std::this_thread::sleep_for(2ms);
    }
    REQUIRE_MESSAGE(fs::exists(ckpt + "/step-000000300.safetensors"), launcher.output());
    const std::vector<pid_t> workers = children_of(launcher.pid());
    REQUIRE(workers.size() == 2);
    launcher.send(SIGKILL);
    for (const pid_t w : workers) kill(w, SIGKILL);
    const auto status = launcher.wait(10s);
    REQUIRE(status.has_value());
    CHECK(WIFSIGNALED(*status));
  }
  const auto checkpoints = nanoddp::nn::list_checkpoints(ckpt);
  REQUIRE(!checkpoints.empty());
  CHECK(checkpoints.back() < ckpt + "/step-000000600.safetensors");
  // Resumed by 4 ranks x batch 4.
  const ProcessResult resumed = run_process(
      argv_for(4, 4, {"--checkpoint-dir", ckpt, "--resume", "--save", dir.file("resumed")}), o);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(contains(resumed.output, "resume: loaded " + checkpoints.back()));
  CHECK(contains(resumed.output, "4 rank(s) x batch 4"));
  CHECK(relative_difference(all_parameters(dir.file("resumed")),
                            all_parameters(dir.file("full"))) <= 1e-5);
}

TEST_CASE("killed while writing checkpoints, the directory only ever holds whole ones") {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  // ~37 MB per checkpoint (3.1 M parameters + AdamW's two moments), one every step: most of
  // the wall time is spent writing, so a kill at a random moment often lands inside a write.
  const std::vector<std::string> model = {"--in",     "64",     "--out",    "8",
                                          "--hidden", "1024",   "--layers", "3",
                                          "--batch",  "8",      "--quiet",  "--checkpoint-dir",
                                          ckpt,       "--keep", "2"};
  auto argv_for = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {bin_path("nanoddp-train")};
    argv.insert(argv.end(), model.begin(), model.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  // What the test loads the checkpoints into: the same model and optimizer.
  nanoddp::nn::Mlp mlp(
      nanoddp::nn::MlpOptions{.in_features = 64, .out_features = 8, .hidden = 1024, .layers = 3});
  nanoddp::nn::FlatParameters flat(mlp, nanoddp::Device::cpu());
  nanoddp::nn::AdamW adamw(flat, nanoddp::nn::AdamWOptions{});

  std::mt19937 random(12345);
  int hit_a_write = 0;
  const int attempts = 6;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    CAPTURE(attempt);
    BackgroundProcess train(argv_for({"--steps", "100000", "--checkpoint-every", "1", "--resume"}));
    // Wait for the next checkpoint beyond what is there, then kill at a random moment.
    const auto before = nanoddp::nn::list_checkpoints(ckpt);
    const auto deadline = Clock::now() + 30s;
    while (nanoddp::nn::list_checkpoints(ckpt) == before && Clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    REQUIRE_MESSAGE(nanoddp::nn::list_checkpoints(ckpt) != before, train.output());
    if (attempt % 2 == 1) {
      // Every other attempt aims: kill the moment a writer's temporary file exists, so at
      // least some kills surely land mid-write, however fast or slow this machine is.
      const auto aim_deadline = Clock::now() + 5s;
      auto writing = [&] {
        for (const auto& entry : fs::directory_iterator(ckpt)) {
          if (entry.path().filename().string().starts_with(".step-")) return true;
        }
        return false;
      };
      while (!writing() && Clock::now() < aim_deadline) std::this_thread::sleep_for(100us);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(random() % 300));
    }
    train.send(SIGKILL);
    REQUIRE(train.wait(10s).has_value());

    // A temporary file left behind means the kill hit a write; it is never a step-*.safetensors.
    int temporaries = 0;
    for (const auto& entry : fs::directory_iterator(ckpt)) {
      if (entry.path().filename().string().starts_with(".step-")) ++temporaries;
    }
    hit_a_write += temporaries > 0;
    // Only the last killed writer's: the next save removes those of dead writers.
    CHECK(temporaries <= 1);
    const auto listed = nanoddp::nn::list_checkpoints(ckpt);
    REQUIRE(!listed.empty());
    for (const std::string& path : listed) {
      CAPTURE(path);
      CHECK_NOTHROW(nanoddp::nn::load_checkpoint(path, mlp, adamw));  // sizes and checksum
    }
    // --resume takes the newest complete one.
    const std::int64_t newest =
        std::stoll(fs::path(listed.back()).stem().string().substr(std::string("step-").size()));
    const ProcessResult ok = run_process(argv_for(
        {"--steps", std::to_string(newest + 1), "--checkpoint-every", "1000", "--resume"}));
    INFO(ok.output);
    CHECK(ok.exit_code == 0);
    CHECK(contains(ok.output, "resume: loaded " + listed.back()));
  }
  MESSAGE(hit_a_write, " of ", attempts, " kills landed inside a checkpoint write");
  CHECK(hit_a_write >= 1);
}

// ---- NaN and Inf ---------------------------------------------------------------------------

TEST_CASE("a diverging run stops on every rank at the same step, naming it") {
  const auto results =
      run_world(train_argv({"--steps", "50", "--optimizer", "sgd", "--lr", "1e30", "--quiet"}), 2,
                {.env = fault_env(), .timeout = 60s});
  INFO(describe(results));
  std::set<std::string> steps;
  for (const auto& r : results) {
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
    std::smatch m;
    REQUIRE(std::regex_search(
        r.output, m, std::regex(R"(the loss became (nan|inf) at step ([0-9]+) on ranks? )")));
    steps.insert(m[2]);
    CHECK(contains(r.output, "--skip-nonfinite"));
  }
  CHECK(steps.size() == 1);  // the same step on both ranks
}

namespace {

// 64 samples x 4 -> 2 in .npy files; sample `poisoned` has a target of 3e38, whose squared
// error overflows to +inf (the files themselves are finite, so the loader accepts them).
void write_poisoned_data(const TempDir& dir, std::int64_t poisoned) {
  const std::int64_t n = 64, in = 4, out = 2;
  std::vector<float> x(n * in), y(n * out);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < in; ++j) {
      x[i * in + j] = static_cast<float>((i * 7 + j * 3) % 11) / 11.0f;
    }
    y[i * out + 0] = x[i * in + 0] - 2.0f * x[i * in + 1];
    y[i * out + 1] = 0.5f * x[i * in + 2] + x[i * in + 3];
  }
  y[poisoned * out] = 3e38f;
  const std::vector<std::int64_t> x_shape{n, in}, y_shape{n, out};
  nanoddp::nn::write_npy(dir.file("x.npy"), x_shape, x.data());
  nanoddp::nn::write_npy(dir.file("y.npy"), y_shape, y.data());
}

// nanoddp-train on write_poisoned_data's files, unshuffled, batch 4, 3 epochs, then `extra`.
std::vector<std::string> poisoned_train_argv(const TempDir& dir,
                                             const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {bin_path("nanoddp-train"),
                                   "--data",
                                   dir.file("x.npy"),
                                   "--targets",
                                   dir.file("y.npy"),
                                   "--layers",
                                   "0",
                                   "--batch",
                                   "4",
                                   "--no-shuffle",
                                   "--epochs",
                                   "3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace

TEST_CASE("an Inf loss on one rank only stops every rank at that step, naming the rank") {
  TempDir dir;
  // No shuffle, 2 ranks x batch 4: global batch k is samples 8k..8k+7, rank 1 holds 8k+4..8k+7.
  // Sample 21 = global batch 2 (step 3), rank 1.
  write_poisoned_data(dir, 21);
  const auto results =
      run_world(poisoned_train_argv(dir, {"--quiet"}), 2, {.env = fault_env(), .timeout = 60s});
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
    CHECK(contains(r.output, "the loss became inf at step 3 on rank 1."));
  }
}

// An outside tester's: every rank reported the Inf as its own failure, and nanoddp-run named
// whichever exited first (rank 0 in 7 of 15 runs). Rank 1's wrapper waits a second after the
// trainer, so rank 0 always exits first.
TEST_CASE("under nanoddp-run an Inf loss on rank 1 names rank 1 first, whoever exits first") {
  TempDir dir;
  write_poisoned_data(dir, 21);
  std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
  for (const auto& a : exits_last(1, poisoned_train_argv(dir, {"--quiet"}))) argv.push_back(a);
  const ProcessResult r = run_process(argv, {.env = fault_env(), .timeout = 60s});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(std::regex_search(r.output, std::regex(R"(rank 1 \(pid [0-9]+\) failed first: exit code )"
                                               R"(1: the loss became inf at step 3 on rank 1\.)")));
  CHECK(std::regex_search(r.output,
                          std::regex(R"(\n +0 +0 +[0-9]+ +exit code 1, because rank 1 failed\n)")));
}

TEST_CASE("--skip-nonfinite skips the poisoned step on every rank and keeps training") {
  TempDir dir;
  write_poisoned_data(dir, 21);  // step 3 of each epoch, rank 1
  const auto results = run_world(
      poisoned_train_argv(dir, {"--log-every", "1", "--lr", "0.01", "--skip-nonfinite", "--metrics",
                                dir.file("m.jsonl"), "--save", dir.file("params")}),
      2, {.env = fault_env(), .timeout = 60s});
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 0);
  }
  const std::string& out = results[0].output;
  // 8 steps per epoch: the poisoned batch is step 3, 11 and 19.
  for (const int step : {3, 11, 19}) {
    CHECK(contains(out, fmt::format("the loss became inf at step {} on rank 1: skipped this "
                                    "optimizer step on every rank",
                                    step)));
  }
  CHECK(contains(out, "24 steps"));
  CHECK(contains(out, "3 step(s) skipped for NaN/Inf"));
  const auto params = all_parameters(dir.file("params"));
  REQUIRE(!params.empty());
  for (const float p : params) REQUIRE(std::isfinite(p));
  // And the clean steps did train: the last loss is finite and below the first.
  std::ifstream metrics(dir.file("m.jsonl"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(metrics, line);) lines.push_back(line);
  REQUIRE(lines.size() == 24);
  CHECK(contains(lines[2], "\"loss\":null"));  // step 3: inf is not JSON
  CHECK(contains(lines.back(), "\"skipped_steps\":3"));
}
