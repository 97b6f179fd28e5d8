#pragma once
// The TCP store's wire protocol, as pure functions over byte buffers (internal to nanoddp/comm).
//
// A connection starts with a handshake, then carries requests, each answered by one response,
// in order. All integers are little-endian. Nothing is framed as a whole: every variable-length
// field carries its own length, and the decoders check each length against the limits as soon
// as the length itself has arrived. So a peer that claims a 1 TiB value is rejected after 9
// bytes, and a partial message in a buffer is never larger than the largest legal message.
//
//   hello          "NDDPSTOR"  u32 version  u32 token_len  token
//   hello reply    u8 accepted (1 = yes)  u32 len  message (the refusal reason, else empty)
//
//   request        u8 opcode, then by opcode:
//     SET          key  value
//     GET          key  i64 timeout_ms         (blocks on the server up to timeout_ms)
//     ADD          key  i64 delta
//     WAIT         u32 n  key * n  i64 timeout_ms
//     CHECK        u32 n  key * n
//     COMPARE_SET  key  value(expected)  value(desired)
//     DELETE       key
//     TRY_GET_MANY u32 n  key * n              (never blocks: an absent key is answered absent)
//   key = u32 len + bytes (1..max_key_bytes);  value = u64 len + bytes (<= max_value_bytes)
//
//   response       u8 status, then by status:
//     OK           by opcode: GET, COMPARE_SET: value; ADD: i64; CHECK, DELETE: u8;
//                  SET, WAIT: nothing; TRY_GET_MANY: u32 n, then per key u8 present (+ value)
//     TIMEOUT      u32 n  key * n  (the keys still missing)
//     ERROR        u32 len  message
//
// The decoders never trust a length, never read past the span, and never allocate more than
// the limits allow: `decode_request` is the entry point a fuzzer drives.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nanoddp::comm::protocol {

using Bytes = std::vector<std::uint8_t>;

inline constexpr std::string_view kMagic = "NDDPSTOR";
// 2: TRY_GET_MANY. A client of another version is refused at the handshake, naming both.
inline constexpr std::uint32_t kVersion = 2;

enum class Opcode : std::uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kWait = 4,
  kCheck = 5,
  kCompareSet = 6,
  kDelete = 7,
  kTryGetMany = 8,
};
// "set", "get", ... for messages; "unknown" for anything else.
const char* opcode_name(Opcode op);

enum class Status : std::uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

struct Limits {
  std::size_t max_key_bytes = 4096;
  std::size_t max_value_bytes = 64u << 20;
  std::size_t max_keys = 1u << 20;  // keys in one WAIT / CHECK (and in a TIMEOUT answer)
  std::size_t max_token_bytes = 4096;
  std::size_t max_message_bytes = 64u << 10;  // ERROR answers and refusal reasons
};

struct Request {
  Opcode op = Opcode::kSet;
  std::vector<std::string> keys;  // one key, except for WAIT, CHECK and TRY_GET_MANY
  Bytes value;                    // SET: the value; COMPARE_SET: the expected value
  Bytes desired;                  // COMPARE_SET
  std::int64_t delta = 0;         // ADD
  std::int64_t timeout_ms = 0;    // GET, WAIT (>= 0)
};

struct Response {
  Status status = Status::kOk;
  Bytes value;                    // OK answer to GET / COMPARE_SET
  std::int64_t number = 0;        // OK answer to ADD
  bool flag = false;              // OK answer to CHECK / DELETE
  std::vector<std::string> keys;  // TIMEOUT: the missing keys
  std::vector<std::optional<Bytes>> values;  // OK answer to TRY_GET_MANY, one per key asked
  std::string message;            // ERROR
};

struct Hello {
  std::uint32_t version = kVersion;
  std::string token;
};

struct HelloReply {
  bool accepted = false;
  std::string message;
};

// What a decoder made of the bytes at the front of a buffer.
enum class DecodeStatus {
  kOk,          // one whole message decoded; `consumed` bytes belong to it
  kIncomplete,  // a valid prefix: wait for more bytes
  kInvalid,     // not a valid message (bad magic, unknown opcode, a length over the limits...)
};

template <typename T>
struct Decoded {
  DecodeStatus status = DecodeStatus::kIncomplete;
  T message{};
  std::size_t consumed = 0;  // kOk only
  std::string error;         // kInvalid only: what was wrong, for logs and tests
};

void encode_hello(const Hello& hello, Bytes& out);
Decoded<Hello> decode_hello(std::span<const std::uint8_t> bytes, const Limits& limits = {});
void encode_hello_reply(const HelloReply& reply, Bytes& out);
Decoded<HelloReply> decode_hello_reply(std::span<const std::uint8_t> bytes,
                                       const Limits& limits = {});

// Appends the encoding to `out` (so a sender can batch). The encoder does not check limits: the
// client checks sizes before sending, with messages that name the key.
void encode_request(const Request& request, Bytes& out);
Decoded<Request> decode_request(std::span<const std::uint8_t> bytes, const Limits& limits = {});

// A response's layout depends on the request it answers, hence `op`.
void encode_response(Opcode op, const Response& response, Bytes& out);
Decoded<Response> decode_response(Opcode op, std::span<const std::uint8_t> bytes,
                                  const Limits& limits = {});

}  // namespace nanoddp::comm::protocol
