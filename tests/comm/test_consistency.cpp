// check_same_on_all_ranks over a real TCP store, one thread and one client per rank: who is
// blamed when ranks disagree. A launcher names the rank that failed first from these verdicts,
// so a rank of the majority must say "another rank's" (PeerFailedError) and an odd rank "mine".

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/comm/consistency.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/kernels/error.h"

using namespace std::chrono_literals;
using nanoddp::comm::PeerFailedError;
using nanoddp::comm::TcpStore;
using nanoddp::comm::TcpStoreServer;

namespace {

struct Verdict {
  enum Kind { kAgreed, kOwn, kPeer } kind = kAgreed;
  int peer = -1;
  std::string message;
};

// Runs the check on `items.size()` ranks and returns each rank's verdict.
std::vector<Verdict> check(const std::vector<std::vector<std::string>>& items) {
  TcpStoreServer server({.host = "127.0.0.1", .port = 0, .timeout = 10s, .token = "t"});
  const int size = static_cast<int>(items.size());
  std::vector<Verdict> verdicts(items.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      TcpStore store({.host = "127.0.0.1", .port = server.port(), .timeout = 10s, .token = "t"});
      Verdict& v = verdicts[static_cast<std::size_t>(r)];
      try {
        nanoddp::comm::check_same_on_all_ranks(store, r, size, "k", "setting",
                                               items[static_cast<std::size_t>(r)]);
      } catch (const PeerFailedError& e) {
        v = {.kind = Verdict::kPeer, .peer = e.rank(), .message = e.what()};
      } catch (const nanoddp::Error& e) {
        v = {.kind = Verdict::kOwn, .message = e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return verdicts;
}

const std::vector<std::string> kJob = {"--seed 1", "--lr 0.1", "--steps 5"};

std::vector<std::string> with(std::size_t i, const std::string& value) {
  std::vector<std::string> v = kJob;
  v[i] = value;
  return v;
}

}  // namespace

TEST_CASE("consistency: ranks that agree pass, and one odd rank of three is the one to blame") {
  for (const Verdict& v : check({kJob, kJob, kJob})) CHECK(v.kind == Verdict::kAgreed);

  const auto v = check({kJob, kJob, with(1, "--lr 0.5")});
  CHECK(v[0].kind == Verdict::kPeer);
  CHECK(v[0].peer == 2);
  CHECK(v[1].kind == Verdict::kPeer);
  CHECK(v[2].kind == Verdict::kOwn);
  for (const Verdict& x : v) {
    INFO(x.message);
    CHECK(x.message.find("setting #1 (of 3 on rank 0): ranks 0, 1 have '--lr 0.1'; rank 2 has "
                         "'--lr 0.5'. rank 2 has other settings than most ranks.") !=
          std::string::npos);
  }
}

TEST_CASE(
    "consistency: the odd ones out are decided on all the settings, not the first to differ") {
  // Rank 4 has another seed and another learning rate, rank 3 only another learning rate. On the
  // seed alone rank 3 sided with the majority and blamed rank 4; it is odd too.
  auto both = with(0, "--seed 7");
  both[1] = "--lr 0.5";
  const auto v = check({kJob, kJob, kJob, with(1, "--lr 0.5"), both});
  for (int r : {0, 1, 2}) {
    CHECK(v[static_cast<std::size_t>(r)].kind == Verdict::kPeer);
    CHECK(v[static_cast<std::size_t>(r)].peer == 3);
  }
  CHECK(v[3].kind == Verdict::kOwn);
  CHECK(v[4].kind == Verdict::kOwn);
  INFO(v[0].message);
  CHECK(v[0].message.find("setting #0 (of 3 on rank 0)") != std::string::npos);
  CHECK(v[0].message.find("(setting #1 differs too)") != std::string::npos);
  CHECK(v[0].message.find("ranks 3, 4 have other settings than most ranks") != std::string::npos);
}

TEST_CASE("consistency: without a majority no rank is blamed by another") {
  // 2 against 2; and three seeds plus two ranks with another learning rate (the largest group,
  // ranks 3 and 4, is not most of the job).
  const auto tie = check({kJob, kJob, with(2, "--steps 9"), with(2, "--steps 9")});
  const auto three_ways = check({with(0, "--seed 2"), with(0, "--seed 3"), with(0, "--seed 4"),
                                 with(1, "--lr 0.5"), with(1, "--lr 0.5")});
  for (const auto* run : {&tie, &three_ways}) {
    for (const Verdict& x : *run) {
      INFO(x.message);
      CHECK(x.kind == Verdict::kOwn);
      CHECK(x.message.find("than most ranks") == std::string::npos);
    }
  }
}

TEST_CASE("consistency: a rank with fewer items disagrees on the first it lacks") {
  const auto v = check({kJob, kJob, {"--seed 1", "--lr 0.1"}});
  CHECK(v[0].kind == Verdict::kPeer);
  CHECK(v[2].kind == Verdict::kOwn);
  INFO(v[2].message);
  CHECK(v[2].message.find("rank 2 has nothing") != std::string::npos);
}
