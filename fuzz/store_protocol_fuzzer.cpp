// libFuzzer target: the TCP store's wire decoders (comm/store_protocol.h), the code that
// reads bytes from any peer that connects to rank 0's port.
//
// The first input byte picks the decoder (request, hello, hello reply, or a response to one of
// the seven opcodes); the rest is the message. Besides "never crash, never read out of bounds,
// never allocate past the limits" (ASan/UBSan and libFuzzer's -rss_limit_mb check those), it
// checks two properties of the decoders:
//   - every prefix of a complete message is reported kIncomplete, never kOk or kInvalid;
//   - re-encoding a decoded message gives back exactly the bytes it consumed.
// Small limits make the length checks reachable with short inputs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "nanoddp/comm/store_protocol.h"

namespace proto = nanoddp::comm::protocol;

namespace {

const proto::Limits kLimits{.max_key_bytes = 64,
                            .max_value_bytes = 256,
                            .max_keys = 16,
                            .max_token_bytes = 64,
                            .max_message_bytes = 256};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "store_protocol_fuzzer: %s\n", what);
  std::abort();
}

// `decode(bytes)` and `encode(message, out)` for one message kind.
template <typename Decode, typename Encode>
void check(std::span<const std::uint8_t> bytes, Decode decode, Encode encode) {
  const auto result = decode(bytes);
  if (result.status != proto::DecodeStatus::kOk) return;
  if (result.consumed == 0 || result.consumed > bytes.size()) fail("consumed out of range");
  proto::Bytes again;
  encode(result.message, again);
  if (again.size() != result.consumed ||
      !std::equal(again.begin(), again.end(), bytes.begin())) {
    fail("re-encoding a decoded message gives other bytes");
  }
  // Every proper prefix of a whole message is incomplete (checking a few keeps it fast).
  for (std::size_t n : {std::size_t{0}, result.consumed / 2, result.consumed - 1}) {
    if (n >= result.consumed) continue;
    if (decode(bytes.first(n)).status != proto::DecodeStatus::kIncomplete) {
      fail("a prefix of a valid message is not reported incomplete");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t selector = data[0];
  const std::span<const std::uint8_t> bytes(data + 1, size - 1);
  switch (selector % 10) {
    case 0:
      check(
          bytes, [](auto b) { return proto::decode_request(b, kLimits); },
          [](const proto::Request& r, proto::Bytes& out) { proto::encode_request(r, out); });
      break;
    case 1:
      check(
          bytes, [](auto b) { return proto::decode_hello(b, kLimits); },
          [](const proto::Hello& h, proto::Bytes& out) { proto::encode_hello(h, out); });
      break;
    case 2:
      check(
          bytes, [](auto b) { return proto::decode_hello_reply(b, kLimits); },
          [](const proto::HelloReply& h, proto::Bytes& out) { proto::encode_hello_reply(h, out); });
      break;
    default: {
      const auto op = static_cast<proto::Opcode>(selector % 10 - 2);  // 1..7
      check(
          bytes, [op](auto b) { return proto::decode_response(op, b, kLimits); },
          [op](const proto::Response& r, proto::Bytes& out) { proto::encode_response(op, r, out); });
      break;
    }
  }
  // The default (production) limits too, on the same bytes.
  (void)proto::decode_request(bytes);
  return 0;
}
