#pragma once
// Small POSIX socket helpers shared by the TCP store's client and server (internal).

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/comm/store.h"
#include "nanoddp/comm/store_protocol.h"
#include "nanoddp/comm/unique_fd.h"

namespace nanoddp::comm::detail {

// What the client and the server both take from TcpStoreOptions: the shared secret (the option,
// else $NANODDP_STORE_TOKEN) and the limits on what a message may hold.
std::string store_token(const TcpStoreOptions& options);
protocol::Limits store_limits(const TcpStoreOptions& options);

// "127.0.0.1:29500", or "[::1]:29500" for an IPv6 literal.
std::string format_address(const std::string& host, std::uint16_t port);
// "0.3 s", "300 s": how messages state a timeout.
std::string format_seconds(std::chrono::milliseconds ms);
// "key 'a'", or "keys 'a', 'b' and 3 more": how messages name the keys of a request.
std::string describe_keys(const std::vector<std::string>& keys);
// A client's reconnection backoff: doubling from the first to the most.
constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
// strerror, thread-safely, lower-cased the way our messages use it ("connection refused").
std::string errno_text(int err);

// Non-blocking socket I/O bounded by a deadline (poll), for the store clients.
using Clock = std::chrono::steady_clock;
enum class IoResult { kOk, kTimeout, kClosed, kError };
// Waits for `events` on fd until the deadline; kOk when ready.
IoResult wait_for(int fd, short events, Clock::time_point deadline, int& err);
IoResult send_all(int fd, std::span<const std::uint8_t> data, Clock::time_point deadline, int& err);
// Receives whatever is there (at least one byte) into the back of `buf`.
IoResult recv_some(int fd, protocol::Bytes& buf, Clock::time_point deadline, int& err);
// One attempt at a non-blocking TCP connection to host:port (TCP_NODELAY set), trying each
// address the name resolves to; nullopt with `why` set when none answered.
std::optional<UniqueFd> connect_tcp(const std::string& host, std::uint16_t port,
                                    Clock::time_point deadline, std::string& why);

}  // namespace nanoddp::comm::detail
