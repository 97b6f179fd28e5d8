#include "nanoddp/comm/torch_store_protocol.h"

#include <fmt/format.h>

namespace nanoddp::comm::torch_protocol {

const char* query_name(Query q) {
  switch (q) {
    case Query::kSet:
      return "set";
    case Query::kCompareSet:
      return "compare_set";
    case Query::kGet:
      return "get";
    case Query::kAdd:
      return "add";
    case Query::kCheck:
      return "check";
    case Query::kWait:
      return "wait";
    case Query::kDeleteKey:
      return "delete";
  }
  return "unknown";
}

bool has_response(Query q) {
  return q != Query::kSet;
}

namespace {

void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_bytes(Bytes& out, std::span<const std::uint8_t> v) {
  put_u64(out, v.size());
  out.insert(out.end(), v.begin(), v.end());
}

// A key as PyTorch's client sends it.
void put_key(Bytes& out, const std::string& key) {
  put_u64(out, key.size() + 1);
  out.push_back('/');
  out.insert(out.end(), key.begin(), key.end());
}

std::uint64_t get_u64(std::span<const std::uint8_t> b) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<std::uint64_t>(b[static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

Decoded<Response> incomplete() {
  return {};
}

Decoded<Response> invalid(std::string why) {
  Decoded<Response> d;
  d.status = DecodeStatus::kInvalid;
  d.error = std::move(why);
  return d;
}

Decoded<Response> ok(Response r, std::size_t consumed) {
  Decoded<Response> d;
  d.status = DecodeStatus::kOk;
  d.message = std::move(r);
  d.consumed = consumed;
  return d;
}

}  // namespace

void encode_request(const Request& request, Bytes& out) {
  out.push_back(static_cast<std::uint8_t>(request.query));
  switch (request.query) {
    case Query::kSet:
      put_key(out, request.keys.at(0));
      put_bytes(out, request.value);
      break;
    case Query::kCompareSet:
      put_key(out, request.keys.at(0));
      put_bytes(out, request.value);
      put_bytes(out, request.desired);
      break;
    case Query::kGet:
    case Query::kDeleteKey:
      put_key(out, request.keys.at(0));
      break;
    case Query::kAdd:
      put_key(out, request.keys.at(0));
      put_u64(out, static_cast<std::uint64_t>(request.delta));
      break;
    case Query::kCheck:
    case Query::kWait:
      put_u64(out, request.keys.size());
      for (const auto& k : request.keys) put_key(out, k);
      break;
  }
}

Decoded<Response> decode_response(Query q, std::span<const std::uint8_t> bytes,
                                  const Limits& limits) {
  Response r;
  switch (q) {
    case Query::kSet:
      return ok(r, 0);  // no answer: nothing to read (callers do not ask; kept total)
    case Query::kGet:
    case Query::kCompareSet: {
      if (bytes.size() < 8) return incomplete();
      const std::uint64_t n = get_u64(bytes);
      if (n > limits.max_value_bytes) {
        return invalid(fmt::format("a value of {} bytes, more than the limit of {}", n,
                                   limits.max_value_bytes));
      }
      if (bytes.size() - 8 < n) return incomplete();
      r.value.assign(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
      return ok(std::move(r), 8 + static_cast<std::size_t>(n));
    }
    case Query::kAdd:
    case Query::kDeleteKey:
      if (bytes.size() < 8) return incomplete();
      r.number = static_cast<std::int64_t>(get_u64(bytes));
      if (q == Query::kDeleteKey && r.number != 0 && r.number != 1) {
        return invalid(fmt::format("{} keys deleted for one key", r.number));
      }
      return ok(r, 8);
    case Query::kCheck:
    case Query::kWait:
      if (bytes.empty()) return incomplete();
      if (bytes[0] > (q == Query::kCheck ? 1 : 0)) {
        return invalid(fmt::format("status byte {} in answer to {}", bytes[0], query_name(q)));
      }
      r.flag = bytes[0] == 0;
      return ok(r, 1);
  }
  return invalid(fmt::format("query type {} has no known answer", static_cast<int>(q)));
}

void encode_response(Query q, const Response& response, Bytes& out) {
  switch (q) {
    case Query::kSet:
      break;
    case Query::kGet:
    case Query::kCompareSet:
      put_bytes(out, response.value);
      break;
    case Query::kAdd:
    case Query::kDeleteKey:
      put_u64(out, static_cast<std::uint64_t>(response.number));
      break;
    case Query::kCheck:
    case Query::kWait:
      out.push_back(response.flag ? 0 : 1);
      break;
  }
}

}  // namespace nanoddp::comm::torch_protocol
