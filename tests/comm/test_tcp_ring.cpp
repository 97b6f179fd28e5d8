// nanoddp's own TCP ring (comm/tcp_ring.h), rank by rank as threads of this process over real
// loopback sockets and a real TCP store: every size around the chunk boundaries on 2 to 5 ranks,
// every op and dtype, the same bits on every rank; then what goes wrong: a stranger on the ring's
// port, ranks in different ops or sizes, a rank that leaves, a rank that never comes.
// The group-level paths (every collective, crashes, stalls, with processes) are in test_gloo.cpp.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/comm/store.h"
#include "nanoddp/comm/tcp_ring.h"
#include "nanoddp/kernels/bf16.h"
#include "support/local_store.h"
#include "support/worst_error.h"

using nanoddp::DType;
using nanoddp::comm::ReduceOp;
using nanoddp::comm::TcpRing;
using nanoddp::comm::TcpRingError;
using namespace std::chrono_literals;
using nanoddp::testing::LocalStore;

namespace {

// Runs body(rank, ring) on `world` threads, each with its own ring; returns each rank's result.
template <typename Result>
std::vector<Result> on_ranks(int world, std::chrono::milliseconds timeout,
                             const std::function<Result(int, TcpRing&)>& body) {
  LocalStore store;
  std::vector<std::future<Result>> futures;
  for (int r = 0; r < world; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r] {
      auto client = store.client();
      TcpRing ring(*client, r, world, timeout, "test", "127.0.0.1");
      REQUIRE(ring.enabled());
      return body(r, ring);
    }));
  }
  std::vector<Result> results;
  for (auto& f : futures) results.push_back(f.get());
  return results;
}

float value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * 1000 + i % 997);
}

}  // namespace

TEST_CASE("tcp ring: sum, average, max and min over 2 to 5 ranks, every size around the chunks") {
  for (int world = 2; world <= 5; ++world) {
    const std::vector<std::size_t> sizes = {1,
                                            2,
                                            static_cast<std::size_t>(world) - 1,
                                            static_cast<std::size_t>(world) + 1,
                                            1000,
                                            (std::size_t{1} << 20) + 7};
    const auto results =
        on_ranks<std::vector<std::vector<float>>>(world, 20s, [&](int rank, TcpRing& ring) {
          std::vector<std::vector<float>> out;
          std::uint64_t seq = 0;
          for (std::size_t n : sizes) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
              std::vector<float> x(n);
              for (std::size_t i = 0; i < n; ++i) x[i] = value(rank, i);
              ring.allreduce(x.data(), nullptr, n, DType::kF32, op, ++seq);
              out.push_back(std::move(x));
            }
          }
          return out;
        });
    std::size_t k = 0;
    for (std::size_t n : sizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        INFO("world " << world << ", n " << n << ", op " << static_cast<int>(op));
        bool right = true;
        for (std::size_t i = 0; i < n && right; ++i) {
          float want = 0;
          for (int r = 0; r < world; ++r) want += value(r, i);  // integers: exact in any order
          if (op == ReduceOp::kMax) want = value(world - 1, i);
          if (op == ReduceOp::kMin) want = value(0, i);
          right = results[0][k][i] == want;
        }
        CHECK(right);
        for (int r = 1; r < world; ++r)
          CHECK(results[static_cast<std::size_t>(r)][k] == results[0][k]);
        ++k;
      }
    }
  }
}

TEST_CASE(
    "tcp ring: non-integer float32 and bfloat16 give every rank the same bits, out of place") {
  const int world = 3;
  const std::size_t n = 100003;
  const auto results =
      on_ranks<std::vector<std::uint32_t>>(world, 20s, [&](int rank, TcpRing& ring) {
        std::vector<float> in(n), out(n, -1.0f);
        for (std::size_t i = 0; i < n; ++i) in[i] = std::sin(static_cast<float>(i * (rank + 3)));
        ring.allreduce(out.data(), in.data(), n, DType::kF32, ReduceOp::kSum, 1);
        std::vector<std::uint16_t> h(n);
        for (std::size_t i = 0; i < n; ++i) h[i] = nanoddp::kernels::float_to_bf16(in[i]);
        ring.allreduce(h.data(), nullptr, n, DType::kBF16, ReduceOp::kSum, 2);
        std::vector<std::uint32_t> bits(n);
        std::memcpy(bits.data(), out.data(), n * 4);
        for (std::size_t i = 0; i < n; ++i) bits.push_back(h[i]);
        // Close to the float64 sum (each chunk is summed once, in ring order).
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) {
          double want = 0;
          for (int r = 0; r < world; ++r) want += std::sin(static_cast<float>(i * (r + 3)));
          worst = nanoddp::test::worse(worst, std::abs(out[i] - want));
        }
        CHECK(worst < 1e-5);
        return bits;
      });
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
}

namespace {
// A TCP connection to 127.0.0.1:port (-1 if refused).
int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The port in a ring entry "1 <ip> <port> <nonce>".
int port_of(const std::string& entry) {
  const std::size_t at = entry.find(' ', 2) + 1;
  return std::stoi(entry.substr(at, entry.find(' ', at) - at));
}
// Ranks 0 .. started-1 of a ring of `world` set up as threads; each one's CommError, if any.
std::vector<std::string> set_up_errors(const LocalStore& store, int started, int world) {
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < started; ++r) {
    ranks.push_back(std::async(std::launch::async, [&store, r, world] {
      auto client = store.client();
      try {
        TcpRing ring(*client, r, world, 1s, "test", "127.0.0.1");
      } catch (const nanoddp::comm::CommError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }));
  }
  std::vector<std::string> errors;
  for (auto& f : ranks) errors.push_back(f.get());
  return errors;
}
}  // namespace

TEST_CASE("tcp ring: strangers on a rank's port (garbage, idle) are dropped without delay") {
  LocalStore store;
  // Before rank 0 comes, five strangers connect to rank 1's ring port: one sends garbage, four
  // say nothing and stay. Rank 1 must take rank 0's hello as soon as it comes (an outside
  // tester's: each idle stranger used to hold the set-up up for a second, one after another).
  std::vector<int> strangers;
  auto stranger = std::async(std::launch::async, [&] {
    auto client = store.client();
    const int port = port_of(client->get_string("test/ring/1"));
    for (int i = 0; i < 5; ++i) {
      const int fd = connect_to(port);
      if (fd >= 0 && i == 0) {
        const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
        (void)!::write(fd, garbage, sizeof(garbage));
      }
      strangers.push_back(fd);
    }
  });
  std::vector<std::future<std::pair<float, double>>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto client = store.client();
      if (r == 0) stranger.wait();  // the strangers come first
      const auto start = std::chrono::steady_clock::now();
      TcpRing ring(*client, r, 2, 10s, "test", "127.0.0.1");
      float x = static_cast<float>(r + 1);
      ring.allreduce(&x, nullptr, 1, DType::kF32, ReduceOp::kSum, 1);
      return std::pair{
          x, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
    }));
  }
  const auto [x0, seconds0] = ranks[0].get();
  const auto [x1, seconds1] = ranks[1].get();
  CHECK(x0 == 3.0f);
  CHECK(x1 == 3.0f);
  CHECK(seconds0 < 2.0);  // five strangers at a second each would be 5 s
  for (int fd : strangers) {
    if (fd >= 0) ::close(fd);
  }
}

TEST_CASE("tcp ring: a rank that never connects stops every rank with the reason, naming it") {
  // Rank 2 publishes an address whose listener accepts (so rank 1's connection forms) but never
  // connects to rank 0. Rank 0 times out waiting for it; rank 1, whose own connections formed,
  // must not go on (to time out in the job's next store wait, blaming someone else): it stops
  // with rank 0's reason (an outside tester's).
  LocalStore store;
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  store.client()->set("test/ring/2", fmt::format("1 127.0.0.1 {} 42", ntohs(a.sin_port)));
  const auto errors = set_up_errors(store, 2, 3);
  const std::string& e0 = errors[0];
  const std::string& e1 = errors[1];
  ::close(listener);
  CHECK(e0 ==
        "TCP ring 'test': rank 0 of 3 was not connected to by rank 2 within 1.0 s: rank 2 died or "
        "stalled during the set-up");
  CHECK(e1 == "rank 0 could not set up the TCP ring, so every rank stops: " + e0);
}

TEST_CASE("tcp ring: a rank that never publishes its address is named") {
  LocalStore store(1s);
  for (const std::string& e : set_up_errors(store, 2, 3)) {
    INFO(e);
    CHECK(e.find("TCP ring 'test': rank 2 did not publish its ring address within 1.0 s: it died "
                 "or stalled during the set-up") == 0);
  }
}

namespace {

// Each rank's error (or none), with the time it took.
struct Outcome {
  std::optional<TcpRingError> error;
  double seconds = 0;
};

Outcome attempt(const std::function<void()>& op) {
  const auto start = std::chrono::steady_clock::now();
  Outcome o;
  try {
    op();
  } catch (const TcpRingError& e) {
    o.error = e;
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace

TEST_CASE("tcp ring: ranks in different ops or sizes fail, naming both, not summing them") {
  SUBCASE("different ops") {
    const auto out = on_ranks<Outcome>(2, 5s, [](int rank, TcpRing& ring) {
      std::vector<float> x(64, 1.0f);
      return attempt([&] {
        ring.allreduce(x.data(), nullptr, 64, DType::kF32, ReduceOp::kSum, rank == 0 ? 7 : 8);
      });
    });
    for (const Outcome& o : out) {
      REQUIRE(o.error.has_value());
      CHECK(o.error->kind() == TcpRingError::Kind::kMismatch);
      CHECK(std::string(o.error->what()).find("the ranks issued different ops") !=
            std::string::npos);
    }
    CHECK(std::string(out[0].error->what())
              .find("step 0 of op #8 while this rank runs step 0 of op #7") != std::string::npos);
  }
  SUBCASE("different sizes") {
    // Both ends must say so (an outside tester's: with 1 against 2 elements one end saw only the
    // other hang up): the header carries the op's whole size, and every step has a header.
    for (const auto& [a, b] :
         std::vector<std::pair<std::size_t, std::size_t>>{{64, 66}, {1, 2}, {3, 4}, {0, 1}}) {
      INFO(a << " against " << b << " elements");
      const auto out = on_ranks<Outcome>(2, 5s, [&](int rank, TcpRing& ring) {
        const std::size_t n = rank == 0 ? a : b;
        std::vector<float> x(n + 1, 1.0f);
        return attempt(
            [&] { ring.allreduce(x.data(), nullptr, n, DType::kF32, ReduceOp::kSum, 1); });
      });
      for (std::size_t r = 0; r < out.size(); ++r) {
        const Outcome& o = out[r];
        REQUIRE(o.error.has_value());
        const std::string what = o.error->what();
        CHECK(what.find("buffers of different sizes") != std::string::npos);
        CHECK(what.find(r == 0 ? fmt::format("over {} elements, this rank over {}", b, a)
                               : fmt::format("over {} elements, this rank over {}", a, b)) !=
              std::string::npos);
        CHECK(o.seconds < 4.0);  // found from the header, not by waiting out the timeout
      }
    }
  }
}

TEST_CASE("tcp ring: a reduce-scatter against an all-gather of the same bytes fails, naming both") {
  // Their chunks are of equal size and their sequence numbers equal: only the header's kind of
  // op tells them apart (an outside-path test found the two summed into each other silently).
  const auto out = on_ranks<Outcome>(2, 5s, [](int rank, TcpRing& ring) {
    std::vector<float> big(16, 1.0f), small(8, 2.0f);
    return attempt([&] {
      if (rank == 0) {
        ring.reduce_scatter(big.data(), small.data(), 8, DType::kF32, ReduceOp::kSum, 3);
      } else {
        ring.allgather(small.data(), big.data(), 8, DType::kF32, 3);
      }
    });
  });
  REQUIRE(out[0].error.has_value());
  REQUIRE(out[1].error.has_value());
  CHECK(std::string(out[0].error->what()) ==
        "rank 1 sent op #3 as allgather (float32), this rank runs it as reduce_scatter (sum, "
        "float32): the ranks issued different ops");
  CHECK(std::string(out[1].error->what())
            .find("as reduce_scatter (sum, float32), this rank runs "
                  "it as allgather (float32)") != std::string::npos);
}

TEST_CASE("tcp ring: a barrier against an all-reduce of the same op number fails at once") {
  // An outside tester's: with the barrier on Gloo, the all-reduce waited out its timeout and then
  // suggested a crash.
  const auto out = on_ranks<Outcome>(3, 5s, [](int rank, TcpRing& ring) {
    std::vector<float> x(100, 1.0f);
    ring.barrier(1);
    return attempt([&] {
      if (rank == 1) {
        ring.barrier(2);
      } else {
        ring.allreduce(x.data(), nullptr, x.size(), DType::kF32, ReduceOp::kSum, 2);
      }
    });
  });
  for (const Outcome& o : out) {
    REQUIRE(o.error.has_value());
    CHECK(o.seconds < 2.0);
  }
  // Rank 2 receives from rank 1, the one in the barrier.
  CHECK(std::string(out[2].error->what()) ==
        "rank 1 sent op #2 as barrier, this rank runs it as allreduce (sum, float32): the ranks "
        "issued different ops");
}

TEST_CASE("tcp ring: a rank that leaves fails both its neighbours at once, naming it") {
  // Rank 2 leaves after op 1. Rank 0 receives from it and sees the close; rank 1 only sends to
  // it, and must name it too (it watches the connection for a hang-up), not the rank 0 whose
  // failure would reach it round the ring (an outside tester's: with 4 ranks, 2 of the 3
  // survivors blamed the wrong rank).
  const auto out = on_ranks<Outcome>(3, 10s, [](int rank, TcpRing& ring) {
    std::vector<float> x(1000, 1.0f);
    ring.allreduce(x.data(), nullptr, 1000, DType::kF32, ReduceOp::kSum, 1);
    if (rank == 2) return Outcome{};  // leaves: its ring is destroyed, its sockets closed
    Outcome o =
        attempt([&] { ring.allreduce(x.data(), nullptr, 1000, DType::kF32, ReduceOp::kSum, 2); });
    std::this_thread::sleep_for(500ms);  // a survivor's own exit must not be what the other sees
    return o;
  });
  for (int r : {0, 1}) {
    INFO("rank " << r);
    const Outcome& o = out[static_cast<std::size_t>(r)];
    REQUIRE(o.error.has_value());
    CHECK(o.error->kind() == TcpRingError::Kind::kConnectionLost);
    CHECK(o.error->peer() == 2);
    CHECK(o.error->address().rfind("[127.0.0.1]:", 0) == 0);
    CHECK(o.seconds < 2.0);
  }
}

TEST_CASE("tcp ring: a rank that finishes its last op and leaves fails nobody") {
  // After its last receive a rank may exit while the rank before it still waits on its own
  // receive: that hang-up is no failure.
  for (int round = 0; round < 20; ++round) {
    const auto out = on_ranks<Outcome>(3, 10s, [](int rank, TcpRing& ring) {
      std::vector<float> x(5000, static_cast<float>(rank));
      return attempt(
          [&] { ring.allreduce(x.data(), nullptr, x.size(), DType::kF32, ReduceOp::kSum, 1); });
    });
    for (const Outcome& o : out) CHECK_FALSE(o.error.has_value());
  }
}

TEST_CASE("tcp ring: a rank that never comes to the op times the others out within the timeout") {
  const auto out = on_ranks<Outcome>(2, 700ms, [](int rank, TcpRing& ring) {
    if (rank == 1) {
      std::this_thread::sleep_for(1500ms);  // busy elsewhere, socket open
      return Outcome{};
    }
    std::vector<float> x(1 << 20, 1.0f);
    return attempt(
        [&] { ring.allreduce(x.data(), nullptr, x.size(), DType::kF32, ReduceOp::kSum, 1); });
  });
  REQUIRE(out[0].error.has_value());
  CHECK(out[0].error->kind() == TcpRingError::Kind::kTimedOut);
  CHECK(out[0].error->peer() == 1);
  CHECK(std::string(out[0].error->what()).find("Timed out after 0.7 s waiting to") !=
        std::string::npos);
  CHECK(out[0].seconds >= 0.6);
  CHECK(out[0].seconds < 1.4);
}

TEST_CASE("tcp ring: a world of one needs no ring") {
  LocalStore store;
  auto client = store.client();
  TcpRing one(*client, 0, 1, 5s, "one", "127.0.0.1");
  CHECK_FALSE(one.enabled());
  CHECK(one.fallback_reason() == "a group of one rank needs no ring");
}

TEST_CASE("tcp ring: reduce-scatter and all-gather, in place and out of place, 2 to 4 ranks") {
  for (int world = 2; world <= 4; ++world) {
    const auto w = static_cast<std::size_t>(world);
    for (std::size_t block : {std::size_t{1}, std::size_t{5}, std::size_t{1000}}) {
      INFO("world " << world << ", block " << block);
      const auto ok = on_ranks<bool>(world, 20s, [&](int rank, TcpRing& ring) {
        const auto r = static_cast<std::size_t>(rank);
        std::vector<float> in(block * w);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
        bool right = true;
        // Out of place, then in place (the output is this rank's block of the input).
        std::vector<float> out(block, -1.0f);
        ring.reduce_scatter(in.data(), out.data(), block, DType::kF32, ReduceOp::kSum, 1);
        std::vector<float> in_place = in;
        ring.reduce_scatter(in_place.data(), in_place.data() + r * block, block, DType::kF32,
                            ReduceOp::kMax, 2);
        for (std::size_t i = 0; i < block; ++i) {
          float sum = 0;
          for (int q = 0; q < world; ++q) sum += value(q, r * block + i);
          right =
              right && out[i] == sum && in_place[r * block + i] == value(world - 1, r * block + i);
        }
        // Every other block of the in-place input is untouched.
        for (std::size_t i = 0; i < in.size(); ++i) {
          if (i / block != r) right = right && in_place[i] == in[i];
        }
        std::vector<float> mine(block);
        for (std::size_t i = 0; i < block; ++i) mine[i] = value(rank, i);
        std::vector<float> gathered(block * w, -1.0f);
        ring.allgather(mine.data(), gathered.data(), block, DType::kF32, 3);
        std::vector<float> gathered_in_place(block * w, -1.0f);
        std::copy(mine.begin(), mine.end(),
                  gathered_in_place.begin() + static_cast<long>(r * block));
        ring.allgather(gathered_in_place.data() + r * block, gathered_in_place.data(), block,
                       DType::kF32, 4);
        for (std::size_t i = 0; i < block * w; ++i) {
          const float want = value(static_cast<int>(i / block), i % block);
          right = right && gathered[i] == want && gathered_in_place[i] == want;
        }
        return right;
      });
      for (bool b : ok) CHECK(b);
    }
  }
}

TEST_CASE("tcp ring: a reduce-scatter sums in the all-reduce's order: the same bits (ZeRO 2 = 0)") {
  const int world = 3;
  const std::size_t block = 4099;
  const auto same = on_ranks<bool>(world, 20s, [&](int rank, TcpRing& ring) {
    const auto r = static_cast<std::size_t>(rank);
    std::vector<float> x(block * world);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(static_cast<float>(i) * 0.37f + rank);
    std::vector<float> reduced(block);
    ring.reduce_scatter(x.data(), reduced.data(), block, DType::kF32, ReduceOp::kSum, 1);
    ring.allreduce(x.data(), nullptr, x.size(), DType::kF32, ReduceOp::kSum, 2);
    return std::memcmp(reduced.data(), x.data() + r * block, block * sizeof(float)) == 0;
  });
  for (bool b : same) CHECK(b);
}

TEST_CASE("tcp ring: broadcast from every root, 2 to 5 ranks, every size around the chunks") {
  for (int world = 2; world <= 5; ++world) {
    CAPTURE(world);
    const auto w = static_cast<std::size_t>(world);
    const std::vector<std::size_t> sizes = {0, 1, w - 1, w + 1, 1237, (std::size_t{1} << 18) + 5};
    // Every rank ends with the root's bytes, whatever it held, for each root, size and dtype
    // (int64: bytes a float sum would change).
    const auto results = on_ranks<int>(world, 20s, [&](int rank, TcpRing& ring) {
      int wrong = 0;
      std::uint64_t seq = 0;
      for (int root = 0; root < world; ++root) {
        for (std::size_t n : sizes) {
          std::vector<std::int64_t> x(n), expected(n);
          for (std::size_t i = 0; i < n; ++i) {
            x[i] = static_cast<std::int64_t>(i * 7919) ^ (std::int64_t{rank} << 40);
            expected[i] = static_cast<std::int64_t>(i * 7919) ^ (std::int64_t{root} << 40);
          }
          ring.broadcast(x.data(), n, DType::kI64, root, ++seq);
          wrong += x != expected;
          std::vector<float> f(n, static_cast<float>(rank) + 0.5f);
          ring.broadcast(f.data(), n, DType::kF32, root, ++seq);
          for (float v : f) wrong += v != static_cast<float>(root) + 0.5f;
        }
      }
      return wrong;
    });
    for (int wrong : results) CHECK(wrong == 0);
  }
}

TEST_CASE("tcp ring: a broadcast against another op, or from another root, fails at once") {
  SUBCASE("another root") {
    const auto out = on_ranks<Outcome>(3, 5s, [](int rank, TcpRing& ring) {
      std::vector<float> x(100, 1.0f);
      return attempt(
          [&] { ring.broadcast(x.data(), x.size(), DType::kF32, rank == 2 ? 1 : 0, 4); });
    });
    for (const Outcome& o : out) {
      REQUIRE(o.error.has_value());
      CHECK(o.seconds < 2.0);
    }
    // Rank 0 receives from rank 2, the one with another root.
    CHECK(std::string(out[0].error->what()) ==
          "rank 2 broadcasts op #4 from rank 1, this rank from rank 0: the ranks gave different "
          "roots");
  }
  SUBCASE("an all-reduce") {
    const auto out = on_ranks<Outcome>(2, 5s, [](int rank, TcpRing& ring) {
      std::vector<float> x(100, 1.0f);
      return attempt([&] {
        if (rank == 0) {
          ring.broadcast(x.data(), x.size(), DType::kF32, 0, 2);
        } else {
          ring.allreduce(x.data(), nullptr, x.size(), DType::kF32, ReduceOp::kSum, 2);
        }
      });
    });
    for (const Outcome& o : out) {
      REQUIRE(o.error.has_value());
      CHECK(o.seconds < 2.0);
    }
    CHECK(std::string(out[0].error->what()) ==
          "rank 1 sent op #2 as allreduce (sum, float32), this rank runs it as broadcast "
          "(float32): the ranks issued different ops");
  }
}
