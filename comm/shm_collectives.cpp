// Reduce-scatter and all-gather over the shared segment of ShmAllreduce: the same lanes, lane
// sets and barriers as the all-reduce (shm_allreduce.cpp), with the same failure handling (a
// dead or late peer fails the barrier, naming it; ranks in different ops are told apart at the
// first barrier). What differs is which bytes go where: each moves only what it must.
//
// Reduce-scatter, one step on rank r (a step covers `per` elements of every block):
//
//   1. copy in   for every p != r: my share of block p -> my lane, slot s(p)
//                (the lane holds size-1 slots: one per other rank; rank r's own block stays home)
//   2. barrier   "every contribution to this step is in shared memory"
//   3. reduce    block r, this step's elements: rank 0's, 1's, ... n-1's contributions IN THAT
//                ORDER (mine from my input, the others' from their lanes' slot for r) -> output
//
// So each rank writes (n-1)/n of its input once and reads (n-1) shares of its block: the least a
// reduce-scatter can move, against the all-reduce's copy in, copy out and reduce of the whole
// buffer (and n times the reduction work).
//
// All-gather, one step on rank r (a step covers up to one lane of the block):
//
//   1. copy in   my block's elements -> my lane; and (while the others catch up) into my output
//   2. barrier   "every rank's share is in shared memory"
//   3. copy out  for every q != r: rank q's lane -> output block q
//
// One barrier per step is enough for both. Step k writes lane set k % 2, and reads the lanes of
// that set only before its rank's next arrival; set k % 2 is written again in step k + 2, after
// the barrier of step k + 1, which every rank reaches only once done reading step k's lanes. The
// step counter is the all-reduce's chunk counter, so the argument holds across ops of all kinds.
//
// The op check reads every rank's published op right after the first barrier. With a single
// step, a fast peer could finish the op and publish its next op before a slow one has looked,
// so single-step ops take one more barrier after the check (multi-step ops are held back by the
// next step's barrier anyway).

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/comm/shm_segment.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

using namespace shm;

void ShmAllreduce::wait_copied_in(std::chrono::steady_clock::time_point& deadline, std::size_t step,
                                  std::size_t steps, std::uint64_t seq, std::uint64_t count,
                                  std::uint32_t kind) {
  wait_for_all(generation_, deadline, "copy-in", step, steps);
  if (step != 0) return;
  check_same_op(seq, count, kind);
  if (steps == 1) {
    arrive();
    wait_for_all(generation_, deadline, "op-check", step, steps);
  }
}

void ShmAllreduce::reduce_scatter(const void* input, void* output, std::size_t block, DType dtype,
                                  ReduceOp op, std::uint64_t seq) {
  if (!enabled()) fail("ShmAllreduce::reduce_scatter: the shared segment is not in use");
  if (block == 0) return;
  checked_in_ = std::chrono::steady_clock::now();
  auto deadline = checked_in_ + timeout_;  // moved by a stop (still_running)
  const std::uint32_t kind = op_kind(Collective::kReduceScatter, dtype, op);
  publish_op(seq, block, kind);

  // One slot per other rank in each lane; slots start on a cache line where the lane allows it,
  // so two ranks' reductions never share a line.
  const std::size_t elem = dtype_size(dtype);
  const std::size_t slots = static_cast<std::size_t>(size_ - 1);
  const std::size_t align = kLine / elem;
  std::size_t per = chunk_bytes_ / elem / slots;
  if (per >= align) per = per / align * align;
  if (per == 0) {
    fail(
        "shared-memory reduce_scatter: a {} KiB lane cannot hold {} slots of one element; raise "
        "NANODDP_SHM_CHUNK_KB",
        chunk_bytes_ / 1024, slots);
  }
  const std::size_t steps = (block + per - 1) / per;
  const auto slot_of = [&](int dest, int writer) {
    return static_cast<std::size_t>(dest < writer ? dest : dest - 1);
  };
  const auto* in = static_cast<const std::uint8_t*>(input);
  auto* out = static_cast<std::uint8_t*>(output);
  std::vector<const std::uint8_t*> sources(static_cast<std::size_t>(size_));

  for (std::size_t s = 0; s < steps; ++s) {
    const std::size_t first = s * per;
    const std::size_t m = std::min(per, block - first);
    const std::uint64_t set = chunks_done_ & 1;
    std::uint8_t* my_lane = segment_->lane(set, rank_);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      std::memcpy(my_lane + slot_of(p, rank_) * per * elem,
                  in + (static_cast<std::size_t>(p) * block + first) * elem, m * elem);
    }
    arrive();
    wait_copied_in(deadline, s, steps, seq, block, kind);
    for (int q = 0; q < size_; ++q) {
      sources[static_cast<std::size_t>(q)] =
          q == rank_ ? in + (static_cast<std::size_t>(rank_) * block + first) * elem
                     : segment_->lane(set, q) + slot_of(rank_, q) * per * elem;
    }
    reduce_in_rank_order(sources.data(), size_, m, dtype, op, out + first * elem, nullptr);
    ++chunks_done_;
  }
}

void ShmAllreduce::allgather(const void* input, void* output, std::size_t block, DType dtype,
                             std::uint64_t seq) {
  if (!enabled()) fail("ShmAllreduce::allgather: the shared segment is not in use");
  if (block == 0) return;
  checked_in_ = std::chrono::steady_clock::now();
  auto deadline = checked_in_ + timeout_;  // moved by a stop (still_running)
  const std::uint32_t kind = op_kind(Collective::kAllgather, dtype, ReduceOp::kSum);
  publish_op(seq, block, kind);

  const std::size_t elem = dtype_size(dtype);
  const std::size_t per = chunk_bytes_ / elem;
  const std::size_t steps = (block + per - 1) / per;
  const auto* in = static_cast<const std::uint8_t*>(input);
  auto* out = static_cast<std::uint8_t*>(output);
  const auto block_at = [&](int q, std::size_t first) {
    return out + (static_cast<std::size_t>(q) * block + first) * elem;
  };

  for (std::size_t s = 0; s < steps; ++s) {
    const std::size_t first = s * per;
    const std::size_t bytes = std::min(per, block - first) * elem;
    const std::uint64_t set = chunks_done_ & 1;
    std::memcpy(segment_->lane(set, rank_), in + first * elem, bytes);
    arrive();
    // My own block needs nobody: copied while the others arrive (not at all when in place).
    if (block_at(rank_, first) != in + first * elem) {
      std::memcpy(block_at(rank_, first), in + first * elem, bytes);
    }
    wait_copied_in(deadline, s, steps, seq, block, kind);
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(block_at(q, first), segment_->lane(set, q), bytes);
    }
    ++chunks_done_;
  }
}

}  // namespace nanoddp::comm
