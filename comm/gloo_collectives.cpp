// The Gloo group's reduce-scatter and all-gather (worker thread): shared memory when every rank
// is on this host (shm_collectives.cpp), else over TCP: around nanoddp's ring (tcp_ring.h) in a
// flat group, or Gloo's when a rank set NANODDP_TCP_RING=0. A hierarchical group's leaders-only
// ring is an all-reduce's: its reduce-scatter is its all-reduce, cut (below), and its all-gather
// takes Gloo's flat path (copies only: no order to keep).
//
// Gloo's TCP reduce-scatter is a ring on Gloo's unbound buffers — the transport under the
// options-style functions, so it mixes with them on one context (the legacy algorithm classes
// would not: gloo_process_group.h). With n ranks and blocks of B bytes, step s = 0 .. n-2 on
// rank r:
//
//   send  block (r-s-1) mod n to rank r+1: at step 0 straight from the input, later the partial
//         sum this rank made in the step before
//   recv  rank r-1's partial of block (r-s-2) mod n, and combine it with this rank's own
//         contribution: the next step's send, or at the last step (block r) the output
//
// Every rank sends (n-1) B bytes and receives as many: the least a reduce-scatter can move, where
// the all-reduce it replaces moved twice that (and reduced n blocks, not n-1). Average is summed
// on the wire and divided once at the end; bfloat16 is rounded after every combination, as
// gloo::allreduce does. All messages of an op share one slot (the op's tag under a prefix of
// ours): Gloo matches messages of one slot on one pair in the order they were sent.

#include <fmt/format.h>

#include <gloo/allgather.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "nanoddp/comm/gloo_group_impl.h"
#include "nanoddp/comm/gloo_helpers.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {
namespace {

// Above Gloo's own prefixes (gloo/types.h: 0x01-0x08), so no Gloo collective shares the slots.
constexpr std::uint8_t kReduceScatterSlotPrefix = 0x40;

// The ring's buffers: kept alive after a failure (keep_failed_gloo_op), since Gloo's transport
// thread may still complete a send on them.
struct RingBuffers {
  std::unique_ptr<gloo::transport::UnboundBuffer> input;
  std::unique_ptr<gloo::transport::UnboundBuffer> partial;
  std::unique_ptr<gloo::transport::UnboundBuffer> received;
};

// What is left of the op's deadline, for one wait (at least 1 ms: Gloo reads 0 as "no limit").
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

void GlooProcessGroup::Impl::run_reduce_scatter(const void* input, void* output, std::size_t block,
                                                DType dtype, ReduceOp op, std::uint64_t seq) {
  if (block == 0) return;
  const std::size_t bytes = block * dtype_size(dtype);
  if (size == 1) {
    if (output != input) std::memmove(output, input, bytes);
    return;
  }
  if (hier != nullptr && hier->enabled()) {
    // A hierarchical group: its all-reduce of the whole input, then this rank's block. Those are
    // the sums the group's all-reduce makes, in its order, so ZeRO stage 2 ends on stage 0's bits
    // here too (Gloo's flat ring summed in another order). The price: the whole buffer crosses
    // the hosts where a reduce-scatter moves (n-1)/n of it, and a buffer of the input's size.
    std::uint8_t* whole = scratch_bytes(bytes * static_cast<std::size_t>(size));
    hier->run(whole, input, block * static_cast<std::size_t>(size), dtype, op, seq);
    std::memcpy(output, whole + static_cast<std::size_t>(rank) * bytes, bytes);
    return;
  }
  if (shm != nullptr && shm->enabled()) {
    shm->reduce_scatter(input, output, block, dtype, op, seq);  // divides once itself for avg
    return;
  }
  if (ring != nullptr && ring->enabled()) {
    ring->reduce_scatter(input, output, block, dtype, op, seq);
    if (op == ReduceOp::kAvg) divide_by(output, dtype, block, size);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  const auto mod = [n = size](int v) { return static_cast<std::size_t>(((v % n) + n) % n); };
  const int left = (rank - 1 + size) % size;
  const int right = (rank + 1) % size;
  auto* in = static_cast<std::uint8_t*>(const_cast<void*>(input));
  std::uint8_t* partial = scratch_bytes(2 * bytes);
  std::uint8_t* received = partial + bytes;
  const auto combine = gloo_reduce_function(op, dtype);  // avg: a sum here
  const gloo::Slot slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag(seq));

  auto buffers = std::make_shared<RingBuffers>();
  buffers->input =
      connection.context->createUnboundBuffer(in, bytes * static_cast<std::size_t>(size));
  buffers->partial = connection.context->createUnboundBuffer(partial, bytes);
  buffers->received = connection.context->createUnboundBuffer(received, bytes);
  try {
    for (int s = 0; s + 1 < size; ++s) {
      // Receive first, so the peer's send finds a posted buffer.
      buffers->received->recv(left, slot, 0, bytes);
      if (s == 0) {
        buffers->input->send(right, slot, mod(rank - 1) * bytes, bytes);
      } else {
        buffers->partial->send(right, slot, 0, bytes);
      }
      if (!buffers->received->waitRecv(left_until(deadline))) {
        fail("the receive from rank {} was aborted", left);
      }
      auto& sent = s == 0 ? buffers->input : buffers->partial;
      if (!sent->waitSend(left_until(deadline))) fail("the send to rank {} was aborted", right);
      const bool last = s + 2 == size;
      combine(last ? output : partial, received, in + mod(rank - s - 2) * bytes, block);
    }
  } catch (...) {
    keep_failed_gloo_op(std::move(buffers));
    throw;
  }
  if (op == ReduceOp::kAvg) divide_by(output, dtype, block, size);
}

void GlooProcessGroup::Impl::run_allgather(const void* input, void* output, std::size_t block,
                                           DType dtype, std::uint64_t seq) {
  if (block == 0) return;
  const std::size_t bytes = block * dtype_size(dtype);
  auto* out = static_cast<std::uint8_t*>(output);
  if (size == 1) {
    if (output != input) std::memmove(output, input, bytes);
    return;
  }
  if (shm != nullptr && shm->enabled()) {
    shm->allgather(input, output, block, dtype, seq);
    return;
  }
  if (ring != nullptr && ring->enabled()) {
    ring->allgather(input, output, block, dtype, seq);
    return;
  }
  auto opts = std::make_unique<gloo::AllgatherOptions>(connection.context);
  // In place (the input is our block of the output): Gloo then takes it from the output.
  if (input != out + static_cast<std::size_t>(rank) * bytes) {
    opts->setInput(static_cast<std::uint8_t*>(const_cast<void*>(input)), bytes);
  }
  opts->setOutput(out, bytes * static_cast<std::size_t>(size));
  opts->setTag(tag(seq));
  opts->setTimeout(options.timeout);
  run_gloo(std::move(opts), [](gloo::AllgatherOptions& o) { gloo::allgather(o); });
}

}  // namespace nanoddp::comm
