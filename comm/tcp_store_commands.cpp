// The store server's command table: decoding a connection's requests (the handshake first),
// answering them, and parking a get / wait until its keys exist or its deadline passes.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nanoddp/comm/store_protocol.h"
#include "nanoddp/comm/tcp_store_server_impl.h"

namespace nanoddp::comm {

using namespace store_server;

void TcpStoreServer::Impl::process(std::uint64_t id, Connection& c) {
  std::size_t pos = 0;
  while (!c.dead && !c.closing && !c.parked && c.pending_out() < kOutputHighWater &&
         pos < c.in.size()) {
    const std::span<const std::uint8_t> bytes(c.in.data() + pos, c.in.size() - pos);
    if (!c.greeted) {
      auto hello = proto::decode_hello(bytes, limits);
      if (hello.status == proto::DecodeStatus::kIncomplete) break;
      if (hello.status == proto::DecodeStatus::kInvalid) {
        kill(c);  // not one of ours (bad magic) or a token over the limit: say nothing
        break;
      }
      pos += hello.consumed;
      handshake(c, hello.message);
      continue;
    }
    auto req = proto::decode_request(bytes, limits);
    if (req.status == proto::DecodeStatus::kIncomplete) break;
    if (req.status == proto::DecodeStatus::kInvalid) {
      kill(c);
      break;
    }
    pos += req.consumed;
    handle(id, c, req.message);
  }
  if (pos == c.in.size()) {
    c.in.clear();
    release_if_big(c.in);
  } else if (pos > 0) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  }
}

void TcpStoreServer::Impl::handshake(Connection& c, const proto::Hello& hello) {
  proto::HelloReply reply;
  if (hello.version != proto::kVersion) {
    reply.message = fmt::format(
        "refused: protocol version {} but this store speaks version {} (do all ranks run the "
        "same nanoddp build?)",
        hello.version, proto::kVersion);
  } else if (!token.empty() && hello.token.empty()) {
    reply.message = "refused: missing token (set NANODDP_STORE_TOKEN to the job's token)";
  } else if (!token.empty() && hello.token != token) {
    reply.message = "refused: wrong token (set NANODDP_STORE_TOKEN to the job's token)";
  } else {
    reply.accepted = true;
  }
  proto::encode_hello_reply(reply, c.out);
  if (reply.accepted) {
    c.greeted = true;
  } else {
    ++dropped;
    c.closing = true;
  }
  flush(c);
}

void TcpStoreServer::Impl::respond(Connection& c, proto::Opcode op, const proto::Response& resp) {
  proto::encode_response(op, resp, c.out);
  flush(c);
}

std::string TcpStoreServer::Impl::store_value(const std::string& key, proto::Bytes value) {
  auto it = data.find(key);
  if (it != data.end()) {
    it->second = std::move(value);
  } else {
    if (data.size() >= options.max_keys) {
      return fmt::format(
          "the store already holds {} keys (TcpStoreOptions::max_keys); cannot add key '{}'",
          data.size(), key);
    }
    data.emplace(key, std::move(value));
  }
  notify(key);
  return {};
}

void TcpStoreServer::Impl::handle(std::uint64_t id, Connection& c, proto::Request& req) {
  proto::Response resp;
  const std::string& key = req.keys.front();
  switch (req.op) {
    case proto::Opcode::kSet: {
      std::string error = store_value(key, std::move(req.value));
      if (!error.empty()) {
        resp.status = proto::Status::kError;
        resp.message = std::move(error);
      }
      break;
    }
    case proto::Opcode::kGet:
    case proto::Opcode::kWait: {
      const bool all = std::all_of(req.keys.begin(), req.keys.end(),
                                   [&](const std::string& k) { return data.contains(k); });
      if (!all && req.timeout_ms > 0) {
        park(id, c, req.op, std::move(req.keys), req.timeout_ms);
        return;
      }
      if (!all) {
        resp.status = proto::Status::kTimeout;
        for (const auto& k : req.keys) {
          if (!data.contains(k)) resp.keys.push_back(k);
        }
      } else if (req.op == proto::Opcode::kGet) {
        resp.value = data.at(key);
      }
      break;
    }
    case proto::Opcode::kAdd: {
      std::int64_t current = 0;
      auto it = data.find(key);
      if (it != data.end()) {
        const char* begin = reinterpret_cast<const char*>(it->second.data());
        const char* end = begin + it->second.size();
        const auto [ptr, ec] = std::from_chars(begin, end, current);
        if (ec != std::errc() || ptr != end || begin == end) {
          resp.status = proto::Status::kError;
          resp.message = fmt::format(
              "the value of key '{}' is not an integer, so add() cannot update it (was it "
              "written with set()?)",
              key);
          break;
        }
      }
      std::int64_t updated = 0;
      if (__builtin_add_overflow(current, req.delta, &updated)) {
        resp.status = proto::Status::kError;
        resp.message = fmt::format("add({}) to key '{}' (now {}) overflows a 64-bit integer",
                                   req.delta, key, current);
        break;
      }
      const std::string text = std::to_string(updated);
      std::string error = store_value(key, proto::Bytes(text.begin(), text.end()));
      if (!error.empty()) {
        resp.status = proto::Status::kError;
        resp.message = std::move(error);
      }
      resp.number = updated;
      break;
    }
    case proto::Opcode::kCheck:
      resp.flag = std::all_of(req.keys.begin(), req.keys.end(),
                              [&](const std::string& k) { return data.contains(k); });
      break;
    case proto::Opcode::kCompareSet: {
      auto it = data.find(key);
      const bool matches = it == data.end() ? req.value.empty() : it->second == req.value;
      if (matches) {
        resp.value = req.desired;
        std::string error = store_value(key, std::move(req.desired));
        if (!error.empty()) {
          resp.status = proto::Status::kError;
          resp.message = std::move(error);
        }
      } else if (it != data.end()) {
        resp.value = it->second;
      }
      break;
    }
    case proto::Opcode::kDelete:
      resp.flag = data.erase(key) > 0;
      break;
    case proto::Opcode::kTryGetMany: {
      std::size_t total = 0;
      for (const auto& k : req.keys) {
        const auto it = data.find(k);
        if (it == data.end()) {
          resp.values.emplace_back();
          continue;
        }
        total += it->second.size();
        resp.values.emplace_back(it->second);
      }
      if (total > options.max_value_bytes) {  // the client could not take the answer either
        resp.values.clear();
        resp.status = proto::Status::kError;
        resp.message = fmt::format(
            "try_get_many of {} keys would answer {} bytes, more than max_value_bytes = {}",
            req.keys.size(), total, options.max_value_bytes);
      }
      break;
    }
  }
  respond(c, req.op, resp);
}

void TcpStoreServer::Impl::park(std::uint64_t id, Connection& c, proto::Opcode op,
                                std::vector<std::string> keys, std::int64_t timeout_ms) {
  c.parked = true;
  c.parked_op = op;
  c.parked_keys = std::move(keys);
  c.deadline = Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kMaxTimeoutMs));
  try_unpark(id, c);
}

bool TcpStoreServer::Impl::try_unpark(std::uint64_t id, Connection& c) {
  for (const auto& k : c.parked_keys) {
    if (!data.contains(k)) {
      waiters[k].push_back(id);
      return false;
    }
  }
  proto::Response resp;
  if (c.parked_op == proto::Opcode::kGet) resp.value = data.at(c.parked_keys.front());
  c.parked = false;
  c.parked_keys.clear();
  respond(c, c.parked_op, resp);
  runnable.push_back(id);  // it may have sent more requests meanwhile
  return true;
}

void TcpStoreServer::Impl::notify(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  std::vector<std::uint64_t> ids = std::move(it->second);
  waiters.erase(it);
  for (const std::uint64_t id : ids) {
    auto conn = conns.find(id);
    if (conn == conns.end() || conn->second.dead || !conn->second.parked) continue;
    const auto& keys = conn->second.parked_keys;
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;  // a stale entry
    try_unpark(id, conn->second);
  }
}

void TcpStoreServer::Impl::expire(Clock::time_point now) {
  for (auto& [id, c] : conns) {
    if (c.dead || c.deadline > now) continue;
    if (!c.greeted) {
      kill(c);  // connected but never finished the handshake
    } else if (c.parked) {
      proto::Response resp;
      resp.status = proto::Status::kTimeout;
      for (const auto& k : c.parked_keys) {
        if (!data.contains(k)) resp.keys.push_back(k);
      }
      c.parked = false;
      c.parked_keys.clear();
      respond(c, c.parked_op, resp);
      runnable.push_back(id);
    }
  }
  // Forget the oldest handshake entries whose connection finished it or is gone (entries behind
  // one still in its handshake go within handshake_timeout, when it does).
  while (!handshaking.empty()) {
    auto conn = conns.find(handshaking.front());
    if (conn != conns.end() && !conn->second.greeted && !conn->second.dead) break;
    handshaking.pop_front();
  }
  // Forget waiter lists that only name connections that are gone or no longer parked, so the
  // index does not grow with every timed-out wait on a key that never comes.
  for (auto it = waiters.begin(); it != waiters.end();) {
    std::erase_if(it->second, [&](std::uint64_t id) {
      auto conn = conns.find(id);
      return conn == conns.end() || conn->second.dead || !conn->second.parked;
    });
    it = it->second.empty() ? waiters.erase(it) : std::next(it);
  }
}

}  // namespace nanoddp::comm
