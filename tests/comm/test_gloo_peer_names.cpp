// Naming the peer in a Gloo error. Gloo prints a pair's peer either as the address the peer
// published in the rendezvous or as the peer's end of the connection; connect_gloo's address
// lists hold both. Before they held only the second, and in the 3-process crash test
// (test_gloo.cpp, "a rank that crashes mid-way") a survivor said "lost the connection to a
// peer" about 1 run in 15 (CI, 2026-12-02). That test is the one that caught it; this one
// checks the naming in-process for every survivor of several meshes, so both roles of a pair
// (which side connects depends on the ports) come up.

#include <doctest/doctest.h>

#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/store.h"

using namespace std::chrono_literals;

namespace {

std::vector<nanoddp::comm::GlooConnection> connected_ranks(int size, const std::string& name) {
  using nanoddp::comm::TcpStoreOptions;
  const TcpStoreOptions store_options{.host = "127.0.0.1", .port = 0, .timeout = 20s};
  nanoddp::comm::TcpStoreServer server(store_options);
  auto connect = [&](int rank) {
    TcpStoreOptions o = store_options;
    o.port = server.port();
    return nanoddp::comm::connect_gloo(std::make_shared<nanoddp::comm::TcpStore>(o), rank, size,
                                       {.timeout = 20s, .name = name, .master_addr = "127.0.0.1"});
  };
  std::vector<std::future<nanoddp::comm::GlooConnection>> pending;
  for (int r = 0; r < size; ++r) pending.push_back(std::async(std::launch::async, connect, r));
  std::vector<nanoddp::comm::GlooConnection> out;
  for (auto& p : pending) out.push_back(p.get());
  return out;
}

// The error a receive from `peer` gets on `survivor` once the peer's context is gone (its
// sockets closed, as when its process dies). A receive from that one pair only: no other pair
// can fail first.
std::string error_receiving_from(nanoddp::comm::GlooConnection& survivor, int peer) {
  // Kept for the life of the process, as GlooProcessGroup keeps a failed op's buffers: Gloo's
  // transport thread may still touch a buffer whose op failed (tests/sanitizers/tsan.supp).
  static auto* kept = new std::vector<
      std::pair<std::vector<char>, std::unique_ptr<gloo::transport::UnboundBuffer>>>();
  kept->emplace_back(std::vector<char>(64), nullptr);
  auto& [data, buffer] = kept->back();
  buffer = survivor.context->createUnboundBuffer(data.data(), data.size());
  try {
    buffer->recv(peer, 1);  // throws at once when the pair has seen the close already
    buffer->waitRecv(5s);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gloo peer names: survivors name the rank that left, whichever side connected") {
  for (int trial = 0; trial < 6; ++trial) {
    auto ranks = connected_ranks(3, "trial" + std::to_string(trial));
    const int leaving = trial % 3;
    ranks[static_cast<std::size_t>(leaving)].context.reset();
    for (int s = 0; s < 3; ++s) {
      if (s == leaving) continue;
      auto& survivor = ranks[static_cast<std::size_t>(s)];
      const std::string message = error_receiving_from(survivor, leaving);
      INFO("trial " << trial << ", rank " << s << ": " << message);
      REQUIRE_FALSE(message.empty());
      CHECK(nanoddp::comm::gloo_peer_from_message(message, survivor.addresses) == leaving);
    }
  }
}
