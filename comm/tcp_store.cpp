// The store client: one connection, one request at a time (a mutex), every send and receive
// bounded by a deadline through poll() on a non-blocking socket.
//
// After a failure the connection's state is unknown (an answer may still be on its way), so it
// is closed; the next call connects again, with the same retries as the first.

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "nanoddp/comm/store.h"
#include "nanoddp/comm/store_protocol.h"
#include "nanoddp/comm/store_socket.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

namespace proto = protocol;
using Clock = std::chrono::steady_clock;

constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
// The server answers a get / wait when its timeout passes; the client waits this much longer
// before it concludes the server itself stopped answering.
constexpr auto kAnswerGrace = std::chrono::milliseconds(2000);

enum class IoResult { kOk, kTimeout, kClosed, kError };

int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, 60'000));
}

// Waits for `events` on fd until the deadline; kOk when ready.
IoResult wait_for(int fd, short events, Clock::time_point deadline, int& err) {
  while (true) {
    pollfd p{fd, events, 0};
    const int timeout = poll_ms(deadline);
    const int n = ::poll(&p, 1, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return IoResult::kError;
    }
    if (n > 0) return IoResult::kOk;  // errors and hang-ups show up in the send / recv
    if (Clock::now() >= deadline) return IoResult::kTimeout;
  }
}

IoResult send_all(int fd, std::span<const std::uint8_t> data, Clock::time_point deadline,
                  int& err) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return IoResult::kClosed;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
      return IoResult::kError;
    }
    const IoResult r = wait_for(fd, POLLOUT, deadline, err);
    if (r != IoResult::kOk) return r;
  }
  return IoResult::kOk;
}

// Receives whatever is there (at least one byte) into the back of `buf`.
IoResult recv_some(int fd, proto::Bytes& buf, Clock::time_point deadline, int& err) {
  constexpr std::size_t kChunk = 64u << 10;
  while (true) {
    const std::size_t old = buf.size();
    buf.resize(old + kChunk);
    const ssize_t n = ::recv(fd, buf.data() + old, kChunk, MSG_DONTWAIT);
    buf.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) return IoResult::kOk;
    if (n == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return IoResult::kClosed;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
      return IoResult::kError;
    }
    const IoResult r = wait_for(fd, POLLIN, deadline, err);
    if (r != IoResult::kOk) return r;
  }
}

std::string describe_keys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return fmt::format("key '{}'", keys.front());
  std::string s = "keys ";
  for (std::size_t i = 0; i < keys.size() && i < 5; ++i) {
    s += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  }
  if (keys.size() > 5) s += fmt::format(" and {} more", keys.size() - 5);
  return s;
}

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::string address;
  std::string token;
  proto::Limits limits;
  std::atomic<std::int64_t> timeout_ms;
  std::mutex mutex;  // one request at a time; guards fd and in
  UniqueFd fd;
  proto::Bytes in;

  explicit Impl(const TcpStoreOptions& opts)
      : options(opts),
        address(detail::format_address(opts.host, opts.port)),
        token(detail::store_token(opts)),
        limits(detail::store_limits(opts)),
        timeout_ms(opts.timeout.count()) {}

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms.load()); }

  void connect();
  // One attempt; an empty optional with `why` set when it should be retried. A refusal by the
  // server throws (retrying would not change its mind).
  std::optional<UniqueFd> try_connect(Clock::time_point deadline, std::string& why);
  proto::Response call(const proto::Request& req, std::chrono::milliseconds answer_within);
  void check_key(const std::string& key) const;
  void check_value(const std::string& key, std::span<const std::uint8_t> value) const;
};

std::optional<UniqueFd> TcpStore::Impl::try_connect(Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options.port);
  const int rc = ::getaddrinfo(options.host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0) {
    // Retried too: a cluster's DNS may learn the master's name a moment after we start.
    why = fmt::format("cannot resolve '{}': {}", options.host, ::gai_strerror(rc));
    return std::nullopt;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd s(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s) {
      why = detail::errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        why = detail::errno_text(errno);
        continue;
      }
      const IoResult r = wait_for(s.get(), POLLOUT, deadline, err);
      if (r != IoResult::kOk) {
        why = r == IoResult::kTimeout ? "connecting timed out" : detail::errno_text(err);
        continue;
      }
      socklen_t len = sizeof err;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        why = detail::errno_text(err);
        continue;
      }
    }
    const int one = 1;
    ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    proto::Bytes hello;
    proto::encode_hello({.version = proto::kVersion, .token = token}, hello);
    proto::Bytes reply_bytes;
    IoResult r = send_all(s.get(), hello, deadline, err);
    std::optional<proto::Decoded<proto::HelloReply>> reply;
    while (r == IoResult::kOk) {
      auto decoded = proto::decode_hello_reply(reply_bytes, limits);
      if (decoded.status != proto::DecodeStatus::kIncomplete) {
        reply = std::move(decoded);
        break;
      }
      r = recv_some(s.get(), reply_bytes, deadline, err);
    }
    if (!reply) {
      why = r == IoResult::kTimeout  ? "no answer to the handshake"
            : r == IoResult::kClosed ? "the server closed the connection during the handshake "
                                       "(is it at its connection limit?)"
                                     : detail::errno_text(err);
      continue;
    }
    if (reply->status == proto::DecodeStatus::kInvalid) {
      throw StoreError(fmt::format(
          "the server at {} does not speak the nanoddp store protocol ({}); is MASTER_PORT the "
          "port of this job's store?",
          address, reply->error));
    }
    if (!reply->message.accepted) {
      throw StoreError(
          fmt::format("cannot use the store at {}: {}", address, reply->message.message));
    }
    // Anything past the reply would be an answer to a request we have not sent.
    return s;
  }
  return std::nullopt;
}

void TcpStore::Impl::connect() {
  const auto start = Clock::now();
  const auto budget = timeout();
  const auto deadline = start + budget;
  auto backoff = std::chrono::milliseconds(kFirstBackoff);
  int attempts = 0;
  std::string why = "no attempt finished";
  while (true) {
    ++attempts;
    if (auto s = try_connect(deadline, why)) {
      fd = std::move(*s);
      in.clear();
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  throw StoreError(fmt::format(
      "cannot reach the store at {} after {} (is rank 0 running? is MASTER_ADDR right?); {} "
      "attempts, the last one: {}",
      address, detail::format_seconds(budget), attempts, why));
}

void TcpStore::Impl::check_key(const std::string& key) const {
  if (key.empty()) fail("a store key must not be empty");
  if (key.size() > options.max_key_bytes) {
    fail("store key '{}...' has {} bytes, more than TcpStoreOptions::max_key_bytes = {}",
         key.substr(0, 40), key.size(), options.max_key_bytes);
  }
}

void TcpStore::Impl::check_value(const std::string& key,
                                 std::span<const std::uint8_t> value) const {
  if (value.size() > options.max_value_bytes) {
    fail(
        "the value for store key '{}' has {} bytes, more than TcpStoreOptions::max_value_bytes "
        "= {}",
        key, value.size(), options.max_value_bytes);
  }
}

proto::Response TcpStore::Impl::call(const proto::Request& req,
                                     std::chrono::milliseconds answer_within) {
  for (const auto& k : req.keys) check_key(k);
  if (req.keys.size() > options.max_keys) {
    fail("a store {} of {} keys is more than TcpStoreOptions::max_keys = {}",
         proto::opcode_name(req.op), req.keys.size(), options.max_keys);
  }
  std::lock_guard lock(mutex);
  if (!fd) connect();
  const char* op = proto::opcode_name(req.op);
  const std::string what = fmt::format("{} of {}", op, describe_keys(req.keys));
  debug_log(DebugLevel::kDetail, "store {} at {}", what, address);

  proto::Bytes message;
  proto::encode_request(req, message);
  int err = 0;
  const auto start = Clock::now();
  IoResult r = send_all(fd.get(), message, start + timeout(), err);
  const auto deadline = start + answer_within;
  while (r == IoResult::kOk) {
    auto decoded = proto::decode_response(req.op, in, limits);
    if (decoded.status == proto::DecodeStatus::kOk) {
      in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(decoded.consumed));
      return std::move(decoded.message);
    }
    if (decoded.status == proto::DecodeStatus::kInvalid) {
      fd.reset();
      throw StoreError(fmt::format("the store at {} sent a garbled answer to {} ({})", address,
                                   what, decoded.error));
    }
    r = recv_some(fd.get(), in, deadline, err);
  }
  fd.reset();
  switch (r) {
    case IoResult::kClosed:
      throw StoreError(fmt::format(
          "the store at {} closed the connection (did rank 0 exit?) during {}", address, what));
    case IoResult::kTimeout:
      throw StoreError(fmt::format(
          "the store at {} did not answer {} within {} (is rank 0 stuck or overloaded?)", address,
          what, detail::format_seconds(answer_within)));
    default:
      throw StoreError(fmt::format("the connection to the store at {} failed during {}: {}",
                                   address, what, detail::errno_text(err)));
  }
}

TcpStore::TcpStore(const TcpStoreOptions& options) : impl_(std::make_unique<Impl>(options)) {
  std::lock_guard lock(impl_->mutex);
  impl_->connect();
}

TcpStore::~TcpStore() = default;

namespace {

[[noreturn]] void throw_answer(const std::string& address, const proto::Request& req,
                               const proto::Response& resp, std::chrono::milliseconds timeout) {
  if (resp.status == proto::Status::kTimeout) {
    throw StoreError(fmt::format(
        "store {} timed out after {} at {}: {} {} still missing (did every rank reach this "
        "point? if it is only slow, raise NANODDP_TIMEOUT_S)",
        proto::opcode_name(req.op), detail::format_seconds(timeout), address,
        describe_keys(resp.keys.empty() ? req.keys : resp.keys),
        resp.keys.size() > 1 ? "are" : "is"));
  }
  throw StoreError(fmt::format("the store at {} refused {} of {}: {}", address,
                               proto::opcode_name(req.op), describe_keys(req.keys), resp.message));
}

}  // namespace

void TcpStore::set(const std::string& key, std::span<const std::uint8_t> value) {
  impl_->check_value(key, value);
  proto::Request req{.op = proto::Opcode::kSet, .keys = {key}};
  req.value.assign(value.begin(), value.end());
  const auto resp = impl_->call(req, timeout());
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, timeout());
}

Bytes TcpStore::get(const std::string& key) {
  const auto wait = timeout();
  const proto::Request req{.op = proto::Opcode::kGet, .keys = {key}, .timeout_ms = wait.count()};
  auto resp = impl_->call(req, wait + kAnswerGrace);
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, wait);
  return std::move(resp.value);
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  const proto::Request req{.op = proto::Opcode::kAdd, .keys = {key}, .delta = delta};
  const auto resp = impl_->call(req, timeout());
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, timeout());
  return resp.number;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  const auto wait = std::max(timeout, std::chrono::milliseconds(0));
  const proto::Request req{.op = proto::Opcode::kWait, .keys = keys, .timeout_ms = wait.count()};
  const auto resp = impl_->call(req, wait + kAnswerGrace);
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, wait);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  const proto::Request req{.op = proto::Opcode::kCheck, .keys = keys};
  const auto resp = impl_->call(req, timeout());
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, timeout());
  return resp.flag;
}

Bytes TcpStore::compare_set(const std::string& key, std::span<const std::uint8_t> expected,
                            std::span<const std::uint8_t> desired) {
  impl_->check_value(key, expected);
  impl_->check_value(key, desired);
  proto::Request req{.op = proto::Opcode::kCompareSet, .keys = {key}};
  req.value.assign(expected.begin(), expected.end());
  req.desired.assign(desired.begin(), desired.end());
  auto resp = impl_->call(req, timeout());
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, timeout());
  return std::move(resp.value);
}

bool TcpStore::remove(const std::string& key) {
  const proto::Request req{.op = proto::Opcode::kDelete, .keys = {key}};
  const auto resp = impl_->call(req, timeout());
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, timeout());
  return resp.flag;
}

std::chrono::milliseconds TcpStore::timeout() const {
  return impl_->timeout();
}

void TcpStore::set_timeout(std::chrono::milliseconds timeout) {
  impl_->timeout_ms.store(timeout.count());
}

}  // namespace nanoddp::comm
