#pragma once
// PyTorch's TCPStore wire protocol, client side, as pure functions over byte buffers (internal to
// nanoddp/comm). torchrun's agent serves such a store; TorchStore (torch_store.h) talks to it.
//
// Written from the protocol as torch 1.13 implements it (torch/csrc/distributed/c10d/
// TCPStore.cpp): no handshake; a request is a one-byte query type and its fields, in the host's
// byte order (little-endian on every platform torch runs on); strings and byte vectors are a
// u64 length and the bytes. Requests and answers:
//
//   SET (0)          key  value                 -> nothing
//   COMPARE_SET (1)  key  expected  desired     -> value (the one stored afterwards)
//   GET (2)          key                        -> value (the client WAITs for the key first)
//   ADD (3)          key  i64 delta             -> i64 (the new value; stored as decimal text)
//   CHECK (4)        u64 n  key * n             -> u8 (0 READY, 1 NOT_READY)
//   WAIT (5)         u64 n  key * n             -> u8 (0 STOP_WAITING) once every key exists;
//                                                  the server has no timeout: the client's
//                                                  deadline ends the wait (and the connection)
//   DELETE_KEY (8)   key                        -> i64 (keys deleted: 0 or 1)
//   (6 GETNUMKEYS and 7 WATCH_KEY are not used.)
// PyTorch's client puts "/" in front of every key on the wire (TCPStore's keyPrefix_), so a key
// PyTorch code calls "k" is "/k" here: encode_request adds it, as PyTorch does.
//
// Only the answers come from the peer, so only they are decoded, and every length is checked
// against the limits as soon as it has arrived: a value that claims 1 TiB is refused after its
// 8-byte length. `decode_response` is what fuzz/torch_store_protocol_fuzzer.cpp drives.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nanoddp/comm/store_protocol.h"

namespace nanoddp::comm::torch_protocol {

using protocol::Bytes;
using protocol::Decoded;
using protocol::DecodeStatus;

enum class Query : std::uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kDeleteKey = 8,
};
// "set", "get", ... for messages.
const char* query_name(Query q);

struct Limits {
  std::size_t max_value_bytes = 64u << 20;
};

struct Request {
  Query query = Query::kSet;
  std::vector<std::string> keys;  // one key, except for CHECK and WAIT; without the "/"
  Bytes value;                    // SET: the value; COMPARE_SET: the expected value
  Bytes desired;                  // COMPARE_SET
  std::int64_t delta = 0;         // ADD
};

struct Response {
  Bytes value;              // GET, COMPARE_SET
  std::int64_t number = 0;  // ADD, DELETE_KEY
  bool flag = false;        // CHECK: ready; WAIT: always true
};

// Whether `q` is answered at all (SET is not).
bool has_response(Query q);

// Appends the encoding to `out`.
void encode_request(const Request& request, Bytes& out);

// The answer to `q` at the front of `bytes`. kInvalid for a value over the limits or a status
// byte the protocol does not have.
Decoded<Response> decode_response(Query q, std::span<const std::uint8_t> bytes,
                                  const Limits& limits = {});
// The inverse of decode_response (the fuzzer's round trip, and tests' fake answers).
void encode_response(Query q, const Response& response, Bytes& out);

}  // namespace nanoddp::comm::torch_protocol
