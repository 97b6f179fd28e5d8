// libFuzzer target: the decoder of PyTorch TCPStore answers (nanoddp/comm/torch_store_protocol.h),
// the code that reads what torchrun's store (or whatever listens on MASTER_PORT) sends back.
//
// The first input byte picks the query whose answer the rest is. Besides "never crash, never
// read out of bounds, never allocate past the limit", it checks that every prefix of a decoded
// answer is incomplete and that re-encoding it gives back exactly the bytes it consumed. A small
// limit makes the length check reachable with short inputs.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "nanoddp/comm/torch_store_protocol.h"

namespace tp = nanoddp::comm::torch_protocol;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "torch_store_protocol_fuzzer: %s\n", what);
  std::abort();
}

constexpr std::array kQueries = {tp::Query::kCompareSet, tp::Query::kGet,  tp::Query::kAdd,
                                 tp::Query::kCheck,      tp::Query::kWait, tp::Query::kDeleteKey};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const tp::Query q = kQueries[data[0] % kQueries.size()];
  const std::span<const std::uint8_t> bytes(data + 1, size - 1);
  const tp::Limits limits{.max_value_bytes = 256};
  const auto result = tp::decode_response(q, bytes, limits);
  if (result.status == tp::DecodeStatus::kOk) {
    if (result.consumed == 0 || result.consumed > bytes.size()) fail("consumed out of range");
    tp::Bytes again;
    tp::encode_response(q, result.message, again);
    if (again.size() != result.consumed || !std::equal(again.begin(), again.end(), bytes.begin())) {
      fail("re-encoding a decoded answer gives other bytes");
    }
    for (std::size_t n : {std::size_t{0}, result.consumed / 2, result.consumed - 1}) {
      if (n < result.consumed &&
          tp::decode_response(q, bytes.first(n), limits).status != tp::DecodeStatus::kIncomplete) {
        fail("a prefix of a valid answer is not reported incomplete");
      }
    }
  }
  (void)tp::decode_response(q, bytes);  // the default (production) limit too
  return 0;
}
