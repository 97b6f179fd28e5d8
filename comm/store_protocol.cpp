#include "nanoddp/comm/store_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace nanoddp::comm::protocol {

const char* opcode_name(Opcode op) {
  switch (op) {
    case Opcode::kSet:
      return "set";
    case Opcode::kGet:
      return "get";
    case Opcode::kAdd:
      return "add";
    case Opcode::kWait:
      return "wait";
    case Opcode::kCheck:
      return "check";
    case Opcode::kCompareSet:
      return "compare_set";
    case Opcode::kDelete:
      return "delete";
    case Opcode::kTryGetMany:
      return "try_get_many";
  }
  return "unknown";
}

namespace {

// ---- encoding -------------------------------------------------------------------------------

void put_u8(Bytes& out, std::uint8_t v) {
  out.push_back(v);
}

void put_u32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_i64(Bytes& out, std::int64_t v) {
  put_u64(out, static_cast<std::uint64_t>(v));
}

void put_string32(Bytes& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

void put_value(Bytes& out, std::span<const std::uint8_t> v) {
  put_u64(out, v.size());
  out.insert(out.end(), v.begin(), v.end());
}

// ---- decoding -------------------------------------------------------------------------------

// Reads fields off the front of a span. The first field that is not all there yet switches it
// to "incomplete", the first bad one to "invalid"; either way every later read fails at once, so
// a decoder can read straight through and look at the state at the end.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  bool ok() const { return state_ == DecodeStatus::kOk; }
  std::size_t position() const { return pos_; }

  template <typename T>
  Decoded<T> finish(T message) {
    Decoded<T> result;
    result.status = state_;
    if (state_ == DecodeStatus::kOk) {
      result.message = std::move(message);
      result.consumed = pos_;
    }
    if (state_ == DecodeStatus::kInvalid) result.error = error_;
    return result;
  }

  void invalid(std::string why) {
    if (state_ == DecodeStatus::kInvalid) return;
    state_ = DecodeStatus::kInvalid;
    error_ = std::move(why);
  }

  std::optional<std::uint64_t> uint(int size) {
    if (!need(static_cast<std::size_t>(size))) return std::nullopt;
    std::uint64_t v = 0;
    for (int i = 0; i < size; ++i) v |= static_cast<std::uint64_t>(bytes_[pos_ + i]) << (8 * i);
    pos_ += static_cast<std::size_t>(size);
    return v;
  }

  std::optional<std::int64_t> i64() {
    const auto v = uint(8);
    if (!v) return std::nullopt;
    return static_cast<std::int64_t>(*v);
  }

  // A u32 length + bytes, at most `max` bytes (and at least `min`).
  std::optional<std::string> string32(std::size_t min, std::size_t max, const char* what) {
    const auto len = uint(4);
    if (!len) return std::nullopt;
    if (*len < min || *len > max) {
      invalid(fmt::format("{} of {} bytes (allowed: {}..{})", what, *len, min, max));
      return std::nullopt;
    }
    if (!need(*len)) return std::nullopt;
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), *len);
    pos_ += *len;
    return s;
  }

  std::optional<Bytes> value(std::size_t max, const char* what) {
    const auto len = uint(8);
    if (!len) return std::nullopt;
    if (*len > max) {
      invalid(fmt::format("{} of {} bytes (at most {} allowed)", what, *len, max));
      return std::nullopt;
    }
    if (!need(*len)) return std::nullopt;
    Bytes v(bytes_.begin() + static_cast<std::ptrdiff_t>(pos_),
            bytes_.begin() + static_cast<std::ptrdiff_t>(pos_ + *len));
    pos_ += *len;
    return v;
  }

  // A u32 count of keys (1..max_keys) followed by the keys.
  std::optional<std::vector<std::string>> keys(const Limits& limits, std::size_t min) {
    const auto n = uint(4);
    if (!n) return std::nullopt;
    if (*n < min || *n > limits.max_keys) {
      invalid(fmt::format("{} keys in one message (allowed: {}..{})", *n, min, limits.max_keys));
      return std::nullopt;
    }
    // No reserve(n): a hostile count must not allocate before the keys have actually arrived.
    std::vector<std::string> keys;
    for (std::uint64_t i = 0; i < *n; ++i) {
      auto k = string32(1, limits.max_key_bytes, "a key");
      if (!k) return std::nullopt;
      keys.push_back(std::move(*k));
    }
    return keys;
  }

 private:
  bool need(std::uint64_t n) {
    if (state_ != DecodeStatus::kOk) return false;
    if (n > bytes_.size() - pos_) {
      state_ = DecodeStatus::kIncomplete;
      return false;
    }
    return true;
  }

  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
  DecodeStatus state_ = DecodeStatus::kOk;
  std::string error_;
};

}  // namespace

void encode_hello(const Hello& hello, Bytes& out) {
  out.insert(out.end(), kMagic.begin(), kMagic.end());
  put_u32(out, hello.version);
  put_string32(out, hello.token);
}

Decoded<Hello> decode_hello(std::span<const std::uint8_t> bytes, const Limits& limits) {
  // Compare what has arrived of the magic first, so garbage is refused at its first byte.
  const std::size_t have = std::min(bytes.size(), kMagic.size());
  if (!std::equal(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(have),
                  kMagic.begin())) {
    Decoded<Hello> bad;
    bad.status = DecodeStatus::kInvalid;
    bad.error = "bad magic (not a nanoddp store client)";
    return bad;
  }
  if (have < kMagic.size()) return Decoded<Hello>{};  // kIncomplete
  Reader r(bytes.subspan(have));
  Hello hello;
  if (auto v = r.uint(4)) hello.version = static_cast<std::uint32_t>(*v);
  if (auto t = r.string32(0, limits.max_token_bytes, "a token")) hello.token = std::move(*t);
  auto result = r.finish(std::move(hello));
  if (result.status == DecodeStatus::kOk) result.consumed += kMagic.size();
  return result;
}

void encode_hello_reply(const HelloReply& reply, Bytes& out) {
  put_u8(out, reply.accepted ? 1 : 0);
  put_string32(out, reply.message);
}

Decoded<HelloReply> decode_hello_reply(std::span<const std::uint8_t> bytes, const Limits& limits) {
  Reader r(bytes);
  HelloReply reply;
  if (auto a = r.uint(1)) {
    if (*a > 1) r.invalid(fmt::format("a hello reply with accepted = {}", *a));
    reply.accepted = *a == 1;
  }
  if (auto m = r.string32(0, limits.max_message_bytes, "a refusal reason")) {
    reply.message = std::move(*m);
  }
  return r.finish(std::move(reply));
}

void encode_request(const Request& request, Bytes& out) {
  put_u8(out, static_cast<std::uint8_t>(request.op));
  const std::string empty;
  const std::string& key = request.keys.empty() ? empty : request.keys.front();
  switch (request.op) {
    case Opcode::kSet:
      put_string32(out, key);
      put_value(out, request.value);
      break;
    case Opcode::kGet:
      put_string32(out, key);
      put_i64(out, request.timeout_ms);
      break;
    case Opcode::kAdd:
      put_string32(out, key);
      put_i64(out, request.delta);
      break;
    case Opcode::kWait:
    case Opcode::kCheck:
    case Opcode::kTryGetMany:
      put_u32(out, static_cast<std::uint32_t>(request.keys.size()));
      for (const auto& k : request.keys) put_string32(out, k);
      if (request.op == Opcode::kWait) put_i64(out, request.timeout_ms);
      break;
    case Opcode::kCompareSet:
      put_string32(out, key);
      put_value(out, request.value);
      put_value(out, request.desired);
      break;
    case Opcode::kDelete:
      put_string32(out, key);
      break;
  }
}

Decoded<Request> decode_request(std::span<const std::uint8_t> bytes, const Limits& limits) {
  Reader r(bytes);
  Request req;
  const auto op = r.uint(1);
  if (!op) return r.finish(std::move(req));
  if (*op < static_cast<std::uint8_t>(Opcode::kSet) ||
      *op > static_cast<std::uint8_t>(Opcode::kTryGetMany)) {
    r.invalid(fmt::format("unknown opcode {}", *op));
    return r.finish(std::move(req));
  }
  req.op = static_cast<Opcode>(*op);
  auto one_key = [&] {
    if (auto k = r.string32(1, limits.max_key_bytes, "a key")) req.keys.push_back(std::move(*k));
  };
  auto timeout = [&] {
    if (auto t = r.i64()) {
      if (*t < 0) r.invalid(fmt::format("a negative timeout ({} ms)", *t));
      req.timeout_ms = *t;
    }
  };
  switch (req.op) {
    case Opcode::kSet:
      one_key();
      if (auto v = r.value(limits.max_value_bytes, "a value")) req.value = std::move(*v);
      break;
    case Opcode::kGet:
      one_key();
      timeout();
      break;
    case Opcode::kAdd:
      one_key();
      if (auto d = r.i64()) req.delta = *d;
      break;
    case Opcode::kWait:
    case Opcode::kCheck:
    case Opcode::kTryGetMany:
      if (auto k = r.keys(limits, 1)) req.keys = std::move(*k);
      if (req.op == Opcode::kWait) timeout();
      break;
    case Opcode::kCompareSet:
      one_key();
      if (auto v = r.value(limits.max_value_bytes, "an expected value")) req.value = std::move(*v);
      if (auto v = r.value(limits.max_value_bytes, "a desired value")) req.desired = std::move(*v);
      break;
    case Opcode::kDelete:
      one_key();
      break;
  }
  return r.finish(std::move(req));
}

void encode_response(Opcode op, const Response& response, Bytes& out) {
  put_u8(out, static_cast<std::uint8_t>(response.status));
  switch (response.status) {
    case Status::kOk:
      switch (op) {
        case Opcode::kGet:
        case Opcode::kCompareSet:
          put_value(out, response.value);
          break;
        case Opcode::kAdd:
          put_i64(out, response.number);
          break;
        case Opcode::kCheck:
        case Opcode::kDelete:
          put_u8(out, response.flag ? 1 : 0);
          break;
        case Opcode::kTryGetMany:
          put_u32(out, static_cast<std::uint32_t>(response.values.size()));
          for (const auto& v : response.values) {
            put_u8(out, v ? 1 : 0);
            if (v) put_value(out, *v);
          }
          break;
        case Opcode::kSet:
        case Opcode::kWait:
          break;
      }
      break;
    case Status::kTimeout:
      put_u32(out, static_cast<std::uint32_t>(response.keys.size()));
      for (const auto& k : response.keys) put_string32(out, k);
      break;
    case Status::kError:
      put_string32(out, response.message);
      break;
  }
}

Decoded<Response> decode_response(Opcode op, std::span<const std::uint8_t> bytes,
                                  const Limits& limits) {
  Reader r(bytes);
  Response resp;
  const auto status = r.uint(1);
  if (!status) return r.finish(std::move(resp));
  if (*status > static_cast<std::uint8_t>(Status::kError)) {
    r.invalid(fmt::format("unknown response status {}", *status));
    return r.finish(std::move(resp));
  }
  resp.status = static_cast<Status>(*status);
  switch (resp.status) {
    case Status::kOk:
      switch (op) {
        case Opcode::kGet:
        case Opcode::kCompareSet:
          if (auto v = r.value(limits.max_value_bytes, "a value")) resp.value = std::move(*v);
          break;
        case Opcode::kAdd:
          if (auto n = r.i64()) resp.number = *n;
          break;
        case Opcode::kCheck:
        case Opcode::kDelete:
          if (auto f = r.uint(1)) {
            if (*f > 1) r.invalid(fmt::format("a boolean of {}", *f));
            resp.flag = *f == 1;
          }
          break;
        case Opcode::kTryGetMany: {
          // As many values as keys asked, all of them within one value's limit together.
          const auto n = r.uint(4);
          if (n && *n > limits.max_keys) {
            r.invalid(fmt::format("{} values in one answer (at most {})", *n, limits.max_keys));
          }
          std::size_t total = 0;
          for (std::uint64_t i = 0; n && r.ok() && i < *n; ++i) {
            const auto present = r.uint(1);
            if (!present) break;
            if (*present > 1) r.invalid(fmt::format("a presence flag of {}", *present));
            if (*present != 1) {
              resp.values.emplace_back();
              continue;
            }
            auto v = r.value(limits.max_value_bytes - total, "the values of one answer");
            if (!v) break;
            total += v->size();
            resp.values.emplace_back(std::move(*v));
          }
          break;
        }
        case Opcode::kSet:
        case Opcode::kWait:
          break;
      }
      break;
    case Status::kTimeout:
      if (auto k = r.keys(limits, 0)) resp.keys = std::move(*k);
      break;
    case Status::kError:
      if (auto m = r.string32(0, limits.max_message_bytes, "an error message")) {
        resp.message = std::move(*m);
      }
      break;
  }
  return r.finish(std::move(resp));
}

}  // namespace nanoddp::comm::protocol
