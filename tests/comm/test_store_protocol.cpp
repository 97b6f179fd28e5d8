// The store's wire decoders on crafted bytes: round trips, every prefix of a valid message is
// "incomplete", and lengths over the limits, unknown opcodes and bad magic are "invalid" as soon
// as the offending bytes are in, without waiting for (or allocating) what they claim.

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nanoddp/comm/store_protocol.h"

namespace proto = nanoddp::comm::protocol;
using proto::Bytes;
using proto::DecodeStatus;

namespace {

void put_u32(Bytes& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u64(Bytes& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
Bytes text(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

std::vector<proto::Request> sample_requests() {
  return {
      {.op = proto::Opcode::kSet, .keys = {"k"}, .value = text("hello")},
      {.op = proto::Opcode::kSet, .keys = {"empty"}},
      {.op = proto::Opcode::kGet, .keys = {"a/b"}, .timeout_ms = 1500},
      {.op = proto::Opcode::kAdd, .keys = {"n"}, .delta = -7},
      {.op = proto::Opcode::kWait, .keys = {"x", "y", "z"}, .timeout_ms = 0},
      {.op = proto::Opcode::kCheck, .keys = {"x"}},
      {.op = proto::Opcode::kCompareSet,
       .keys = {"c"},
       .value = text("old"),
       .desired = text("new")},
      {.op = proto::Opcode::kDelete, .keys = {"gone"}},
      {.op = proto::Opcode::kTryGetMany, .keys = {"hb/0", "hb/1", "done/1"}},
  };
}

}  // namespace

TEST_CASE("protocol: every request round-trips, and every strict prefix is incomplete") {
  for (const auto& req : sample_requests()) {
    CAPTURE(proto::opcode_name(req.op));
    Bytes wire;
    proto::encode_request(req, wire);
    const auto d = proto::decode_request(wire);
    REQUIRE(d.status == DecodeStatus::kOk);
    CHECK(d.consumed == wire.size());
    CHECK(d.message.op == req.op);
    CHECK(d.message.keys == req.keys);
    CHECK(d.message.value == req.value);
    CHECK(d.message.desired == req.desired);
    CHECK(d.message.delta == req.delta);
    CHECK(d.message.timeout_ms == req.timeout_ms);
    for (std::size_t n = 0; n < wire.size(); ++n) {
      CHECK(proto::decode_request(std::span(wire.data(), n)).status == DecodeStatus::kIncomplete);
    }
  }
}

TEST_CASE("protocol: two pipelined requests decode one at a time") {
  Bytes wire;
  proto::encode_request({.op = proto::Opcode::kAdd, .keys = {"a"}, .delta = 1}, wire);
  const std::size_t first = wire.size();
  proto::encode_request({.op = proto::Opcode::kDelete, .keys = {"b"}}, wire);
  const auto d1 = proto::decode_request(wire);
  REQUIRE(d1.status == DecodeStatus::kOk);
  CHECK(d1.consumed == first);
  const auto d2 = proto::decode_request(std::span(wire).subspan(first));
  REQUIRE(d2.status == DecodeStatus::kOk);
  CHECK(d2.message.op == proto::Opcode::kDelete);
}

TEST_CASE("protocol: unknown opcodes are invalid at the first byte") {
  for (std::uint8_t op : {std::uint8_t{0}, std::uint8_t{9}, std::uint8_t{0xff}}) {
    const Bytes wire{op, 1, 2, 3};
    const auto d = proto::decode_request(wire);
    CHECK(d.status == DecodeStatus::kInvalid);
    CHECK(d.error.find("unknown opcode") != std::string::npos);
  }
}

TEST_CASE("protocol: a 1 TiB value is refused from its length alone") {
  Bytes wire{static_cast<std::uint8_t>(proto::Opcode::kSet)};
  put_u32(wire, 1);
  wire.push_back('k');
  put_u64(wire, std::uint64_t{1} << 40);  // and no value bytes follow
  const auto d = proto::decode_request(wire);
  CHECK(d.status == DecodeStatus::kInvalid);
  CHECK(d.error.find("1099511627776") != std::string::npos);
}

TEST_CASE("protocol: oversized or empty keys, key counts and limits from the caller") {
  proto::Limits limits{.max_key_bytes = 8, .max_value_bytes = 16, .max_keys = 3};
  SUBCASE("a key longer than max_key_bytes") {
    Bytes wire{static_cast<std::uint8_t>(proto::Opcode::kGet)};
    put_u32(wire, 9);
    CHECK(proto::decode_request(wire, limits).status == DecodeStatus::kInvalid);
  }
  SUBCASE("a key of 0xffffffff bytes") {
    Bytes wire{static_cast<std::uint8_t>(proto::Opcode::kDelete)};
    put_u32(wire, 0xffffffffu);
    CHECK(proto::decode_request(wire).status == DecodeStatus::kInvalid);
  }
  SUBCASE("an empty key") {
    Bytes wire{static_cast<std::uint8_t>(proto::Opcode::kDelete)};
    put_u32(wire, 0);
    CHECK(proto::decode_request(wire, limits).status == DecodeStatus::kInvalid);
  }
  SUBCASE("a value over max_value_bytes") {
    Bytes wire;
    proto::encode_request({.op = proto::Opcode::kSet, .keys = {"k"}, .value = Bytes(17, 1)}, wire);
    CHECK(proto::decode_request(wire, limits).status == DecodeStatus::kInvalid);
  }
  SUBCASE("a desired value over max_value_bytes") {
    Bytes wire;
    proto::encode_request(
        {.op = proto::Opcode::kCompareSet, .keys = {"k"}, .desired = Bytes(17, 1)}, wire);
    CHECK(proto::decode_request(wire, limits).status == DecodeStatus::kInvalid);
  }
  SUBCASE("more keys than max_keys, and none") {
    for (std::uint32_t n : {4u, 0u, 0xffffffffu}) {
      Bytes wire{static_cast<std::uint8_t>(proto::Opcode::kWait)};
      put_u32(wire, n);
      CHECK(proto::decode_request(wire, limits).status == DecodeStatus::kInvalid);
    }
  }
  SUBCASE("a negative timeout") {
    Bytes wire;
    proto::encode_request({.op = proto::Opcode::kGet, .keys = {"k"}, .timeout_ms = -1}, wire);
    CHECK(proto::decode_request(wire, limits).status == DecodeStatus::kInvalid);
  }
}

TEST_CASE("protocol: the hello checks the magic byte by byte, and the token's length") {
  Bytes wire;
  proto::encode_hello({.version = proto::kVersion, .token = "secret"}, wire);
  const auto d = proto::decode_hello(wire);
  REQUIRE(d.status == DecodeStatus::kOk);
  CHECK(d.consumed == wire.size());
  CHECK(d.message.token == "secret");
  CHECK(d.message.version == proto::kVersion);
  for (std::size_t n = 0; n < wire.size(); ++n) {
    CHECK(proto::decode_hello(std::span(wire.data(), n)).status == DecodeStatus::kIncomplete);
  }
  CHECK(proto::decode_hello(text("G")).status == DecodeStatus::kInvalid);
  CHECK(proto::decode_hello(text("GET / HTTP/1.1\r\n")).status == DecodeStatus::kInvalid);
  CHECK(proto::decode_hello(text("NDDPSTOX")).status == DecodeStatus::kInvalid);

  Bytes huge_token(proto::kMagic.begin(), proto::kMagic.end());
  put_u32(huge_token, proto::kVersion);
  put_u32(huge_token, 1u << 30);
  CHECK(proto::decode_hello(huge_token).status == DecodeStatus::kInvalid);
}

TEST_CASE("protocol: responses round-trip and refuse bad status bytes") {
  Bytes wire;
  proto::encode_response(proto::Opcode::kGet, {.value = text("v")}, wire);
  auto d = proto::decode_response(proto::Opcode::kGet, wire);
  REQUIRE(d.status == DecodeStatus::kOk);
  CHECK(d.message.value == text("v"));

  wire.clear();
  proto::encode_response(proto::Opcode::kWait,
                         {.status = proto::Status::kTimeout, .keys = {"a", "b"}}, wire);
  d = proto::decode_response(proto::Opcode::kWait, wire);
  REQUIRE(d.status == DecodeStatus::kOk);
  CHECK(d.message.keys == std::vector<std::string>{"a", "b"});

  wire.clear();
  proto::encode_response(proto::Opcode::kAdd, {.status = proto::Status::kError, .message = "no"},
                         wire);
  d = proto::decode_response(proto::Opcode::kAdd, wire);
  REQUIRE(d.status == DecodeStatus::kOk);
  CHECK(d.message.message == "no");

  CHECK(proto::decode_response(proto::Opcode::kSet, Bytes{9}).status == DecodeStatus::kInvalid);
  CHECK(proto::decode_response(proto::Opcode::kCheck, Bytes{0, 2}).status ==
        DecodeStatus::kInvalid);
  CHECK(proto::decode_response(proto::Opcode::kCheck, Bytes{}).status == DecodeStatus::kIncomplete);
}

TEST_CASE("protocol: try_get_many answers one value or absence per key, within the limits") {
  const proto::Response answer{.values = {text("12"), std::nullopt, text("")}};
  Bytes wire;
  proto::encode_response(proto::Opcode::kTryGetMany, answer, wire);
  const auto d = proto::decode_response(proto::Opcode::kTryGetMany, wire);
  REQUIRE(d.status == DecodeStatus::kOk);
  CHECK(d.consumed == wire.size());
  CHECK(d.message.values == answer.values);
  for (std::size_t n = 0; n < wire.size(); ++n) {  // every strict prefix waits for more
    CAPTURE(n);
    CHECK(proto::decode_response(proto::Opcode::kTryGetMany, std::span(wire.data(), n)).status ==
          DecodeStatus::kIncomplete);
  }
  // A presence flag other than 0 or 1.
  Bytes bad{0};
  put_u32(bad, 1);
  bad.push_back(2);
  CHECK(proto::decode_response(proto::Opcode::kTryGetMany, bad).status == DecodeStatus::kInvalid);
  // Values that together pass one value's limit, though each is within it: refused at the
  // length that crosses it, before its bytes arrive.
  Bytes big{0};
  put_u32(big, 2);
  for (int i = 0; i < 2; ++i) {
    big.push_back(1);
    put_u64(big, 10);
    if (i == 0) big.insert(big.end(), 10, 'x');
  }
  const auto over =
      proto::decode_response(proto::Opcode::kTryGetMany, big, proto::Limits{.max_value_bytes = 16});
  CHECK(over.status == DecodeStatus::kInvalid);
  CHECK(over.error.find("the values of one answer") != std::string::npos);
  // More values than keys may be asked at once.
  Bytes many{0};
  put_u32(many, 4);
  CHECK(proto::decode_response(proto::Opcode::kTryGetMany, many, proto::Limits{.max_keys = 3})
            .status == DecodeStatus::kInvalid);
}

TEST_CASE("protocol: arbitrary byte strings never crash the request decoder") {
  // A small deterministic fuzz: every 1- and 2-byte string, and pseudo-random longer ones.
  for (int a = 0; a < 256; ++a) {
    const Bytes one{static_cast<std::uint8_t>(a)};
    (void)proto::decode_request(one);
    for (int b = 0; b < 256; ++b) {
      const Bytes two{static_cast<std::uint8_t>(a), static_cast<std::uint8_t>(b)};
      (void)proto::decode_request(two);
    }
  }
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 20000; ++i) {
    Bytes wire(static_cast<std::size_t>(state % 64));
    for (auto& byte : wire) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      byte = static_cast<std::uint8_t>(state >> 56);
    }
    if (!wire.empty()) wire[0] = static_cast<std::uint8_t>(1 + wire[0] % 8);  // a real opcode
    const auto d = proto::decode_request(wire);
    if (d.status == DecodeStatus::kOk) CHECK(d.consumed <= wire.size());
  }
}

TEST_CASE("protocol: mutated answers never crash the response decoder, of any request") {
  // What a client reads comes from the network too. Valid answers (small limits, so that the
  // checks are reached), then one to three bytes overwritten and the end cut at random.
  const proto::Limits limits{.max_key_bytes = 8, .max_value_bytes = 16, .max_keys = 4};
  std::uint64_t state = 0x2545f4914f6cdd1dull;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int many_values = 0;  // decoded try_get_many answers with values: the fuzz reached them
  for (int i = 0; i < 40000; ++i) {
    const auto op = static_cast<proto::Opcode>(1 + i % 8);
    proto::Response valid{.value = Bytes(next() % 6, 'v'), .number = 7, .flag = true};
    for (std::uint64_t k = next() % 4; k > 0; --k) {
      valid.values.push_back(next() % 3 == 0 ? std::nullopt
                                             : std::optional<Bytes>(Bytes(next() % 6, 'x')));
    }
    Bytes wire;
    proto::encode_response(op, valid, wire);
    for (std::uint64_t k = next() % 4; k > 0 && !wire.empty(); --k) {
      wire[next() % wire.size()] = static_cast<std::uint8_t>(next());
    }
    if (next() % 4 == 0) wire.resize(next() % (wire.size() + 1));
    const auto d = proto::decode_response(op, wire, limits);
    if (d.status != DecodeStatus::kOk) continue;
    CHECK(d.consumed <= wire.size());
    CHECK(d.message.values.size() <= limits.max_keys);
    std::size_t total = 0;
    for (const auto& v : d.message.values) total += v ? v->size() : 0;
    CHECK(total <= limits.max_value_bytes);
    if (op == proto::Opcode::kTryGetMany && !d.message.values.empty()) ++many_values;
  }
  CHECK(many_values > 0);
}
