#pragma once
// The store server's state (internal, not installed): TcpStoreServer::Impl and one client
// Connection. tcp_store_server.cpp runs the connections (listen, accept, poll, read, write);
// tcp_store_commands.cpp decodes their requests and answers them (the command table, parked
// gets and waits).

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "nanoddp/comm/store.h"
#include "nanoddp/comm/store_protocol.h"
#include "nanoddp/comm/store_socket.h"
#include "nanoddp/comm/unique_fd.h"

namespace nanoddp::comm {

namespace proto = protocol;

namespace store_server {

using Clock = std::chrono::steady_clock;

inline constexpr std::size_t kReadChunk = 64u << 10;
// Stop decoding a connection's requests while this much of its output is unsent, and stop
// reading it while it is parked or stalled and this much input is buffered.
inline constexpr std::size_t kOutputHighWater = 1u << 20;
inline constexpr std::size_t kStalledReadCap = 64u << 10;
inline constexpr std::size_t kKeepCapacity = 1u << 20;
// Timeouts beyond this are clamped, so deadlines never overflow.
inline constexpr std::int64_t kMaxTimeoutMs = 30LL * 24 * 3600 * 1000;

struct Connection {
  UniqueFd fd;
  bool greeted = false;
  bool closing = false;  // close once the output is flushed (after a refusal)
  bool dead = false;     // close at the end of this loop iteration
  proto::Bytes in;
  proto::Bytes out;
  std::size_t out_pos = 0;
  // A parked get / wait.
  bool parked = false;
  proto::Opcode parked_op = proto::Opcode::kGet;
  std::vector<std::string> parked_keys;
  // The parked request's deadline, or (before the handshake) the handshake's.
  Clock::time_point deadline;

  std::size_t pending_out() const { return out.size() - out_pos; }
};

// Buffers that grew for a big value are given back once empty.
inline void release_if_big(proto::Bytes& b) {
  if (b.capacity() > kKeepCapacity) proto::Bytes().swap(b);
}

}  // namespace store_server

struct TcpStoreServer::Impl {
  using Clock = store_server::Clock;
  using Connection = store_server::Connection;

  TcpStoreOptions options;
  std::string token;
  proto::Limits limits;
  std::string address;
  UniqueFd listen_fd;
  UniqueFd wake_fd;
  std::uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::thread thread;

  // Owned by the server thread.
  std::map<std::uint64_t, Connection> conns;
  std::uint64_t next_id = 1;
  std::unordered_map<std::string, proto::Bytes> data;
  // key -> parked connections that wait for it. A parked connection is listed under one of its
  // missing keys at a time; entries of connections that left are skipped when the key is set.
  std::unordered_map<std::string, std::vector<std::uint64_t>> waiters;
  std::deque<std::uint64_t> runnable;  // connections with input to decode
  std::size_t max_connections = 0;     // options.max_connections, lowered to the file limit
  std::chrono::milliseconds handshake_timeout{};
  // Connections in accept order that had not finished their handshake when accepted (some
  // may have since, or be gone): at the cap the oldest one still in its handshake makes room.
  std::deque<std::uint64_t> handshaking;
  Clock::time_point accept_paused_until{};
  std::uint64_t dropped = 0;

  mutable std::mutex stats_mutex;
  TcpStoreServerStats stats;

  explicit Impl(const TcpStoreOptions& opts);
  void bind_and_listen();
  void run();
  void loop_once(std::vector<pollfd>& fds, std::vector<std::uint64_t>& ids);
  void accept_all();
  void read_from(std::uint64_t id, Connection& c);
  void flush(Connection& c);
  void process(std::uint64_t id, Connection& c);
  void handshake(Connection& c, const proto::Hello& hello);
  void handle(std::uint64_t id, Connection& c, proto::Request& req);
  void respond(Connection& c, proto::Opcode op, const proto::Response& resp);
  std::string store_value(const std::string& key, proto::Bytes value);
  void notify(const std::string& key);
  void park(std::uint64_t id, Connection& c, proto::Opcode op, std::vector<std::string> keys,
            std::int64_t timeout_ms);
  // Answers a parked connection if all its keys exist now; else lists it under a missing key.
  bool try_unpark(std::uint64_t id, Connection& c);
  void expire(Clock::time_point now);
  // At the cap: closes the oldest connection still in its handshake; false if there is none.
  bool evict_oldest_handshaking();
  void kill(Connection& c) {
    if (!c.dead) ++dropped;
    c.dead = true;
  }
  void publish_stats();
};

}  // namespace nanoddp::comm
