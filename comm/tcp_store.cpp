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

using detail::describe_keys;
// The server answers a get / wait when its timeout passes; the client waits this much longer
// before it concludes the server itself stopped answering.
constexpr auto kAnswerGrace = std::chrono::milliseconds(2000);

using detail::IoResult;
using detail::recv_some;
using detail::send_all;
using detail::wait_for;

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
  // The server closed or broke the connection we had (not merely a slow answer). A reconnection
  // then makes one attempt instead of retrying for the whole timeout: the retries are for a
  // server that has not started yet, and this one had, so a refusal now means it is gone (rank
  // 0 died). Retrying would hold a failing rank for the timeout in its error path (each store
  // call after the loss, e.g. the check-out in ~Distributed) before it could exit.
  bool lost = false;

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
  std::optional<UniqueFd> connected =
      detail::connect_tcp(options.host, options.port, deadline, why);
  if (!connected) return std::nullopt;
  UniqueFd s = std::move(*connected);
  int err = 0;
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
    return std::nullopt;
  }
  if (reply->status == proto::DecodeStatus::kInvalid) {
    throw StoreRefused(fmt::format(
        "the server at {} does not speak the nanoddp store protocol ({}); is {} the port of this "
        "job's store?",
        address, reply->error, options.port_setting));
  }
  if (!reply->message.accepted) {
    throw StoreRefused(
        fmt::format("cannot use the store at {}: {}", address, reply->message.message));
  }
  // Anything past the reply would be an answer to a request we have not sent.
  return s;
}

void TcpStore::Impl::connect() {
  in.clear();
  if (lost) {
    std::string why = "no attempt finished";
    std::optional<UniqueFd> s = try_connect(Clock::now() + timeout(), why);
    if (!s) {
      throw StoreError(fmt::format(
          "the store at {} dropped the connection earlier and does not accept a new one ({}); "
          "did {} exit?",
          address, why, options.server_role));
    }
    fd = std::move(*s);
    lost = false;
    return;
  }
  fd = detail::connect_with_retry(
      "the store at " + address,
      fmt::format("is {} running? is {} right?", options.server_role, options.address_setting),
      timeout(),
      [&](Clock::time_point deadline, std::string& why) { return try_connect(deadline, why); });
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
  lost = r != IoResult::kTimeout;
  switch (r) {
    case IoResult::kClosed:
      throw StoreError(fmt::format("the store at {} closed the connection (did {} exit?) during {}",
                                   address, options.server_role, what));
    case IoResult::kTimeout:
      throw StoreError(detail::no_answer_message(
          "the store at " + address, what, answer_within,
          fmt::format("is {} stuck or overloaded?", options.server_role)));
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

std::vector<std::optional<Bytes>> TcpStore::try_get_many(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  const proto::Request req{.op = proto::Opcode::kTryGetMany, .keys = keys};
  auto resp = impl_->call(req, timeout());
  if (resp.status != proto::Status::kOk) throw_answer(impl_->address, req, resp, timeout());
  if (resp.values.size() != keys.size()) {
    throw StoreError(fmt::format("the store at {} answered try_get_many of {} with {} values",
                                 impl_->address, describe_keys(keys), resp.values.size()));
  }
  return std::move(resp.values);
}

std::chrono::milliseconds TcpStore::timeout() const {
  return impl_->timeout();
}

void TcpStore::set_timeout(std::chrono::milliseconds timeout) {
  impl_->timeout_ms.store(timeout.count());
}

}  // namespace nanoddp::comm
