#pragma once
// Small POSIX socket helpers shared by the TCP store's client and server (internal).

#include <chrono>
#include <cstdint>
#include <functional>
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

// The connect, retry and timeout wording both store clients (TcpStore, TorchStore) share.
// One connection attempt before `deadline`: the socket, or nullopt with `why` set.
using ConnectAttempt =
    std::function<std::optional<UniqueFd>(Clock::time_point deadline, std::string& why)>;
// A client's reconnection backoff: doubling from the first to the most.
inline constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
inline constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
// Repeats `attempt` until one succeeds or `budget` has passed, sleeping the backoff between
// attempts. Then throws StoreError: "cannot reach <server> after <budget> (<hint>); N attempts,
// the last one: <why>", where `server` is e.g. "the store at 127.0.0.1:29500" and `hint` what to
// check.
UniqueFd connect_with_retry(const std::string& server, const std::string& hint,
                            std::chrono::milliseconds budget, const ConnectAttempt& attempt);
// "<server> did not answer <what> within <timeout>", then " (<hint>)" when a hint is given.
std::string no_answer_message(const std::string& server, const std::string& what,
                              std::chrono::milliseconds timeout, const std::string& hint = "");

}  // namespace nanoddp::comm::detail
