// TorchStore: one connection, one request at a time, every send and receive bounded by a
// deadline (store_socket.h's poll-based helpers).

#include "nanoddp/comm/torch_store.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>

#include "nanoddp/comm/store_socket.h"
#include "nanoddp/comm/torch_store_protocol.h"
#include "nanoddp/comm/unique_fd.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

namespace tp = torch_protocol;
using detail::Clock;
using detail::IoResult;

using detail::describe_keys;

}  // namespace

struct TorchStore::Impl {
  TorchStoreOptions options;
  std::string address;
  std::atomic<std::int64_t> timeout_ms;
  std::mutex mutex;  // one request at a time; guards fd and in
  UniqueFd fd;
  tp::Bytes in;
  // A store that accepts connections but does not answer the first request on one (a wrong
  // port, a process that is not torchrun's store) is given up on after one timeout: every later
  // request fails at once with the same reason, instead of each waiting out its own timeout (the
  // job took 4 timeouts to end, and said a key was "still missing" from a store that had never
  // answered at all).
  bool answered = false;  // on the current connection
  std::string lost;
  // The server closed or broke the connection we had (not merely a slow answer): the next
  // connection makes one attempt instead of retrying for the whole timeout, as TcpStore does.
  // The retries are for an agent that has not started yet; this one had, so a refusal now means
  // it is gone, and retrying would hold a failing rank's error path for the timeout.
  bool dropped = false;

  explicit Impl(const TorchStoreOptions& opts)
      : options(opts),
        address(detail::format_address(opts.host, opts.port)),
        timeout_ms(opts.timeout.count()) {}

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms.load()); }

  void connect() {
    answered = false;
    in.clear();
    if (dropped) {
      std::string why = "no attempt finished";
      std::optional<UniqueFd> s =
          detail::connect_tcp(options.host, options.port, Clock::now() + timeout(), why);
      if (!s) {
        throw StoreError(fmt::format(
            "torchrun's store at {} dropped the connection earlier and does not accept a new one "
            "({}); did torchrun's agent exit?",
            address, why));
      }
      fd = std::move(*s);
      dropped = false;
      return;
    }
    fd = detail::connect_with_retry(
        "torchrun's store at " + address,
        "is torchrun's agent running? are MASTER_ADDR and MASTER_PORT its store's?", timeout(),
        [&](Clock::time_point deadline, std::string& why) {
          return detail::connect_tcp(options.host, options.port, deadline, why);
        });
  }

  void check_value(const std::string& key, std::span<const std::uint8_t> value) const {
    if (value.size() > options.max_value_bytes) {
      fail(
          "the value for store key '{}' has {} bytes, more than TorchStoreOptions::"
          "max_value_bytes = {}",
          key, value.size(), options.max_value_bytes);
    }
  }

  // Sends the request and reads its answer within `answer_within`. `on_timeout` words the
  // error when the answer does not come in time (a wait's "still missing").
  tp::Response call(const tp::Request& req, std::chrono::milliseconds answer_within,
                    const std::string& on_timeout = "") {
    for (const auto& k : req.keys) {
      if (k.empty()) fail("a store key must not be empty");
    }
    std::lock_guard lock(mutex);
    if (!lost.empty()) throw StoreError(lost);
    if (!fd) open();
    return exchange(req, answer_within, on_timeout);
  }

  // Connects, and asks a check: it answers at once whatever the keys, so a store that does not
  // answer it is not torchrun's (or is hung): said as such, not later as a wait's "key still
  // missing".
  void open() {
    connect();
    exchange({.query = tp::Query::kCheck, .keys = {"nanoddp/ping"}}, timeout(), "");
    answered = true;
  }

  tp::Response exchange(const tp::Request& req, std::chrono::milliseconds answer_within,
                        const std::string& on_timeout) {
    const std::string what =
        fmt::format("{} of {}", tp::query_name(req.query), describe_keys(req.keys));
    debug_log(DebugLevel::kDetail, "torchrun store {} at {}", what, address);
    tp::Bytes message;
    tp::encode_request(req, message);
    int err = 0;
    const auto start = Clock::now();
    IoResult r = detail::send_all(fd.get(), message, start + timeout(), err);
    if (r == IoResult::kOk && !tp::has_response(req.query)) return {};
    const auto deadline = start + answer_within;
    const tp::Limits limits{.max_value_bytes = options.max_value_bytes};
    while (r == IoResult::kOk) {
      auto decoded = tp::decode_response(req.query, in, limits);
      if (decoded.status == tp::DecodeStatus::kOk) {
        in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(decoded.consumed));
        return std::move(decoded.message);
      }
      if (decoded.status == tp::DecodeStatus::kInvalid) {
        fd.reset();
        throw StoreError(fmt::format("torchrun's store at {} sent a garbled answer to {} ({})",
                                     address, what, decoded.error));
      }
      r = detail::recv_some(fd.get(), in, deadline, err);
    }
    fd.reset();  // an answer may still come: the connection is of no further use
    dropped = r != IoResult::kTimeout;
    switch (r) {
      case IoResult::kClosed:
        throw StoreError(fmt::format(
            "torchrun's store at {} closed the connection during {} (did the agent exit? or is "
            "it a later torch than 1.13, whose store protocol nanoddp does not speak?)",
            address, what));
      case IoResult::kTimeout:
        if (!answered) {  // the connection's first request
          lost = fmt::format(
              "torchrun's store at {} accepted the connection but answered nothing within {} "
              "(the request: {}): is MASTER_PORT the port of torchrun's store (torch 1.13's "
              "protocol), and is its agent alive?",
              address, detail::format_seconds(answer_within), what);
          throw StoreError(lost);
        }
        if (!on_timeout.empty()) throw StoreError(on_timeout);
        throw StoreError(
            detail::no_answer_message("torchrun's store at " + address, what, answer_within));
      default:
        throw StoreError(
            fmt::format("the connection to torchrun's store at {} failed during {}: {}", address,
                        what, detail::errno_text(err)));
    }
  }
};

TorchStore::TorchStore(const TorchStoreOptions& options) : impl_(std::make_unique<Impl>(options)) {
  std::lock_guard lock(impl_->mutex);
  impl_->open();
}

TorchStore::~TorchStore() = default;

void TorchStore::set(const std::string& key, std::span<const std::uint8_t> value) {
  impl_->check_value(key, value);
  tp::Request req{.query = tp::Query::kSet, .keys = {key}};
  req.value.assign(value.begin(), value.end());
  impl_->call(req, timeout());
}

Bytes TorchStore::get(const std::string& key) {
  wait({key}, timeout());
  auto resp = impl_->call({.query = tp::Query::kGet, .keys = {key}}, timeout());
  return std::move(resp.value);
}

std::int64_t TorchStore::add(const std::string& key, std::int64_t delta) {
  return impl_->call({.query = tp::Query::kAdd, .keys = {key}, .delta = delta}, timeout()).number;
}

void TorchStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  const auto wait = std::max(timeout, std::chrono::milliseconds(0));
  impl_->call({.query = tp::Query::kWait, .keys = keys}, wait,
              fmt::format("store wait timed out after {} at {} (torchrun's store): {} {} still "
                          "missing (did every rank reach this point? if it is only slow, raise "
                          "NANODDP_TIMEOUT_S)",
                          detail::format_seconds(wait), impl_->address, describe_keys(keys),
                          keys.size() > 1 ? "are" : "is"));
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  return impl_->call({.query = tp::Query::kCheck, .keys = keys}, timeout()).flag;
}

Bytes TorchStore::compare_set(const std::string& key, std::span<const std::uint8_t> expected,
                              std::span<const std::uint8_t> desired) {
  impl_->check_value(key, expected);
  impl_->check_value(key, desired);
  tp::Request req{.query = tp::Query::kCompareSet, .keys = {key}};
  req.value.assign(expected.begin(), expected.end());
  req.desired.assign(desired.begin(), desired.end());
  return std::move(impl_->call(req, timeout()).value);
}

bool TorchStore::remove(const std::string& key) {
  return impl_->call({.query = tp::Query::kDeleteKey, .keys = {key}}, timeout()).number == 1;
}

std::chrono::milliseconds TorchStore::timeout() const {
  return impl_->timeout();
}

void TorchStore::set_timeout(std::chrono::milliseconds timeout) {
  impl_->timeout_ms.store(timeout.count());
}

}  // namespace nanoddp::comm
