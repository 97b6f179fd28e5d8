#include "nanoddp/comm/shm_allreduce.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "nanoddp/comm/reduce_ops.h"
#include "nanoddp/comm/shm_segment.h"
#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/error.h"

// ================================================================================================
// The shared segment
// ================================================================================================
//
//   +----------------------------------------------------------+  offset 0
//   | Header: magic, version, world size, chunk bytes, size    |  one 128-byte line
//   +----------------------------------------------------------+
//   | RankLine 0: arrivals, sleepers, the op rank 0 is in      |  one 128-byte line per rank:
//   | RankLine 1                                               |  a rank writes only its own
//   | ...                                                      |  line, so ranks never fight
//   +----------------------------------------------------------+  over a cache line
//   | lane set 0: rank 0's lane | rank 1's lane | ...          |  chunk_bytes each
//   | lane set 1: rank 0's lane | rank 1's lane | ...          |  (4 KiB-aligned)
//   +----------------------------------------------------------+
//
// A buffer larger than one lane is reduced chunk by chunk. Within a chunk of m elements, the
// elements are cut into `size` partitions (cache-line aligned): partition p is rank p's job.
// One chunk on rank r:
//
//   1. copy in    for every p != r: my partition-p elements  -> my lane  (partition p)
//   2. barrier A  "everyone's data is in shared memory"
//   3. reduce     partition r: combine rank 0's, 1's, ... n-1's elements IN THAT ORDER (mine
//                 from my own buffer, the others' from their lanes), divide once for avg, and
//                 write the result to my buffer and to my lane (partition r, which step 1 left
//                 free)
//   4. barrier B  "every partition is reduced"
//   5. copy out   for every p != r: rank p's lane (partition p) -> my buffer (partition p)
//
// That is a reduce-scatter (steps 1-3) followed by an all-gather (step 5), the same split a ring
// all-reduce makes, but each byte crosses memory once per step instead of passing through two
// sockets. Each rank copies (n-1)/n of the buffer in and out, and reduces 1/n of it.
//
// Why a fixed reduction order. Float addition is not associative: (a + b) + c may differ from
// a + (b + c) in the last bit. Every element is combined by exactly one rank, always in rank
// order 0, 1, ..., n-1, and everybody then copies that one result. So all ranks end up with
// bit-identical values, and the values do not depend on which rank happened to arrive first.
// (Bit-identical gradients keep the replicas of a DDP model bit-identical, step after step.)
//
// Why two lane sets and no third barrier. Before rank r may overwrite its lane with the next
// chunk, every peer must have finished copying the previous chunk's results out of it. Chunk
// k uses lane set k % 2. A rank writes set k % 2 again only in chunk k + 2, after passing barrier
// A of chunk k + 1 — and every rank arrives at that barrier only after finishing chunk k's copy
// out. So the barrier that exists anyway doubles as the "lanes are free" barrier. The chunk
// counter runs across ops, so back-to-back all-reduces alternate sets the same way.
//
// ================================================================================================
// Barriers: arrival counters and futexes
// ================================================================================================
//
// Each rank owns one 32-bit counter, `arrivals`: the number of barriers it has reached. It only
// ever counts up (never reset, not even between ops), so barrier number g is passed when every
// rank's counter is >= g. Arriving is one atomic store. Waiting is: look at each peer's counter;
// if it is behind, spin briefly (the peer is usually microseconds away), then sleep in the
// kernel with futex(FUTEX_WAIT) on the peer's counter. The futex is the right tool because it
// sleeps on a *memory word*: "wake me when this word is no longer v". The kernel checks the
// value and puts us to sleep atomically, so a store that lands in between cannot be missed. We
// use the shared (not FUTEX_PRIVATE_FLAG) form because the word lives in memory that another
// process maps; the kernel then keys the wait on the physical page, not on our address space.
//
// A waker must call FUTEX_WAKE, a system call. Most barriers are passed while spinning, so each
// counter has a `sleepers` word: a waiter raises it before sleeping, and an arriving rank calls
// FUTEX_WAKE only when it is non-zero. Both sides use sequentially consistent operations, so
// either the waiter sees the new count (and does not sleep) or the arriver sees the sleeper
// (and wakes it); never neither.
//
// Never wait forever. Every sleep has a timeout (at most kPollSlice), and between sleeps the
// waiter checks the op's deadline and whether the peer it waits for is still alive. A peer that
// was killed cannot arrive and cannot say so: its counter simply stops. So the survivors look at
// /proc/<pid>/stat: a process that is gone (or a zombie, or a new process that reused its pid,
// told apart by its start time) is reported at once as "rank 1 ... has exited", without waiting
// for the timeout. A peer that is alive but stuck is reported when the timeout passes, with the
// op it is in — a rank in an earlier op "did not report reaching this op". A /proc that cannot
// be read (no file descriptor left: "too many open files") proves nothing: the peer counts as
// alive, and a timeout message says its state could not be checked, and why.

namespace nanoddp::comm {

using namespace shm;

namespace {

// Spin this long before sleeping: a barrier between ranks doing the same work is usually
// passed within microseconds, and a futex sleep + wake-up costs tens of them. Kept short
// because on a machine with few cores the spinning thread takes a core from the computation.
constexpr std::chrono::microseconds kSpin{20};
// Longest single futex sleep: how often a waiter checks the deadline and the peer's process.
constexpr std::chrono::milliseconds kPollSlice{50};
// A slice this much longer than kPollSlice: the waiting process was not running meanwhile.
constexpr std::chrono::seconds kNotRunning{1};
// Elements per reduction block: the block's accumulator lives on the stack, in L1.
constexpr std::size_t kBlock = 2048;

// Wrap-around-safe "count >= target" (the counters are 32-bit; 2^31 barriers is far away, but
// the comparison costs nothing).
bool reached(std::uint32_t count, std::uint32_t target) {
  return static_cast<std::int32_t>(count - target) >= 0;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();  // tells the core we spin: saves power, frees the sibling hyper-thread
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(std::uint32_t* word, int op, std::uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

// ---- the reduction: sources[0..n) in rank order, combined element-wise ----------------------

using detail::Max;
using detail::Min;
using detail::Sum;

using kernels::bf16_to_float;  // the rounding of kernels/bf16.h
using kernels::float_to_bf16;

// Block by block: acc = s0; acc = op(acc, s1); ...; (avg: acc /= n); then write the block to
// both outputs. The simple inner loops over a block vectorise. Writing only after the whole
// block is read lets an output alias source `own` (in-place all-reduce).
template <typename Op>
void reduce_f32(const std::uint8_t* const* sources, int n, std::size_t count, bool average,
                std::uint8_t* out_a, std::uint8_t* out_b) {
  alignas(64) float acc[kBlock];
  const float divisor = static_cast<float>(n);
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t m = std::min(kBlock, count - base);
    const float* s0 = reinterpret_cast<const float*>(sources[0]) + base;
    for (std::size_t i = 0; i < m; ++i) acc[i] = s0[i];
    for (int q = 1; q < n; ++q) {
      const float* s = reinterpret_cast<const float*>(sources[q]) + base;
      for (std::size_t i = 0; i < m; ++i) acc[i] = Op{}(acc[i], s[i]);
    }
    if (average) {
      for (std::size_t i = 0; i < m; ++i) acc[i] /= divisor;
    }
    std::memcpy(out_a + base * sizeof(float), acc, m * sizeof(float));
    if (out_b != nullptr) std::memcpy(out_b + base * sizeof(float), acc, m * sizeof(float));
  }
}

// bf16 is reduced through float32: widen every source, combine in float, round once at the end
// (the TCP ring instead rounds after every pairwise step, so results can differ in the last bit).
template <typename Op>
void reduce_bf16(const std::uint8_t* const* sources, int n, std::size_t count, bool average,
                 std::uint8_t* out_a, std::uint8_t* out_b) {
  alignas(64) float acc[kBlock];
  alignas(64) std::uint16_t rounded[kBlock];
  const float divisor = static_cast<float>(n);
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t m = std::min(kBlock, count - base);
    const auto* s0 = reinterpret_cast<const std::uint16_t*>(sources[0]) + base;
    for (std::size_t i = 0; i < m; ++i) acc[i] = bf16_to_float(s0[i]);
    for (int q = 1; q < n; ++q) {
      const auto* s = reinterpret_cast<const std::uint16_t*>(sources[q]) + base;
      for (std::size_t i = 0; i < m; ++i) acc[i] = Op{}(acc[i], bf16_to_float(s[i]));
    }
    if (average) {
      for (std::size_t i = 0; i < m; ++i) acc[i] /= divisor;
    }
    for (std::size_t i = 0; i < m; ++i) rounded[i] = float_to_bf16(acc[i]);
    std::memcpy(out_a + base * 2, rounded, m * 2);
    if (out_b != nullptr) std::memcpy(out_b + base * 2, rounded, m * 2);
  }
}

// Partition p of a chunk of m elements: [begin(p), end(p)). Boundaries are multiples of a
// cache line, so two ranks never write into the same line of a buffer.
struct Partition {
  std::size_t per = 0;
  std::size_t m = 0;
  Partition(std::size_t m_, int size, std::size_t elem) : m(m_) {
    const std::size_t align = kLine / elem;
    const std::size_t n = static_cast<std::size_t>(size);
    per = ((m + n - 1) / n + align - 1) / align * align;
  }
  std::size_t begin(int p) const { return std::min(m, static_cast<std::size_t>(p) * per); }
  std::size_t end(int p) const { return std::min(m, static_cast<std::size_t>(p + 1) * per); }
};

}  // namespace

// ---- the reduction and the op check, shared with shm_collectives.cpp ------------------------

namespace shm {

void reduce_in_rank_order(const std::uint8_t* const* sources, int n, std::size_t count, DType dtype,
                          ReduceOp op, std::uint8_t* out_a, std::uint8_t* out_b) {
  const bool avg = op == ReduceOp::kAvg;
  const bool f32 = dtype == DType::kF32;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return f32 ? reduce_f32<Sum>(sources, n, count, avg, out_a, out_b)
                 : reduce_bf16<Sum>(sources, n, count, avg, out_a, out_b);
    case ReduceOp::kMax:
      return f32 ? reduce_f32<Max>(sources, n, count, false, out_a, out_b)
                 : reduce_bf16<Max>(sources, n, count, false, out_a, out_b);
    case ReduceOp::kMin:
      return f32 ? reduce_f32<Min>(sources, n, count, false, out_a, out_b)
                 : reduce_bf16<Min>(sources, n, count, false, out_a, out_b);
  }
}

std::string describe_op_kind(std::uint32_t kind, std::uint64_t count) {
  const auto collective = static_cast<Collective>(kind >> 16);
  const auto dtype = dtype_name(static_cast<DType>(kind & 0xff));
  const char* op = reduce_op_name(static_cast<ReduceOp>((kind >> 8) & 0xff));
  switch (collective) {
    case Collective::kAllreduce:
      return fmt::format("allreduce, {} x {}, {}", count, dtype, op);
    case Collective::kReduceScatter:
      return fmt::format("reduce_scatter, {} x {} per rank, {}", count, dtype, op);
    case Collective::kAllgather:
      return fmt::format("allgather, {} x {} per rank", count, dtype);
  }
  return fmt::format("unknown collective {}, {} x {}", kind >> 16, count, dtype);
}

}  // namespace shm

void ShmAllreduce::publish_op(std::uint64_t seq, std::uint64_t count, std::uint32_t kind) {
  op_seq_ = seq;
  RankLine& mine = segment_->line(rank_);
  // Relaxed is enough: the release of our next arrival publishes these with it.
  atomic(mine.op_seq).store(seq, std::memory_order_relaxed);
  atomic(mine.op_count).store(count, std::memory_order_relaxed);
  atomic(mine.op_kind).store(kind, std::memory_order_relaxed);
}

void ShmAllreduce::check_same_op(std::uint64_t seq, std::uint64_t count, std::uint32_t kind) {
  for (int q = 0; q < size_; ++q) {
    RankLine& line = segment_->line(q);
    const std::uint64_t its_seq = atomic(line.op_seq).load(std::memory_order_relaxed);
    const std::uint64_t its_count = atomic(line.op_count).load(std::memory_order_relaxed);
    const std::uint32_t its_kind = atomic(line.op_kind).load(std::memory_order_relaxed);
    if (its_seq != seq || its_count != count || its_kind != kind) {
      throw ShmError(fmt::format("ranks are out of step: rank {} runs op #{} ({}) while rank {} "
                                 "runs op #{} ({})",
                                 q, its_seq, describe_op_kind(its_kind, its_count), rank_, seq,
                                 describe_op_kind(kind, count)),
                     {q});
    }
  }
}

// ---- barriers --------------------------------------------------------------------------------

void ShmAllreduce::arrive() {
  RankLine& mine = segment_->line(rank_);
  ++generation_;
  atomic(mine.arrivals).store(generation_, std::memory_order_seq_cst);
  if (atomic(mine.sleepers).load(std::memory_order_seq_cst) != 0) {
    futex(&mine.arrivals, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void ShmAllreduce::still_running(std::chrono::steady_clock::time_point now,
                                 std::chrono::steady_clock::time_point& deadline) {
  // Within an op this process checks in every few milliseconds (a chunk's copy, a slice of
  // sleep); a gap far longer means it did not run: stopped (Ctrl-Z under nanoddp-run stops
  // every rank, and a stop longer than the timeout failed the job at once on SIGCONT, an
  // outside tester's find) or starved. That time is not a peer's lateness: it moves the deadline.
  if (now - checked_in_ > kPollSlice + kNotRunning) deadline += now - checked_in_ - kPollSlice;
  checked_in_ = now;
}

void ShmAllreduce::wait_for_all(std::uint32_t target,
                                std::chrono::steady_clock::time_point& deadline, const char* phase,
                                std::size_t chunk, std::size_t chunks) {
  using Clock = std::chrono::steady_clock;
  still_running(Clock::now(), deadline);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    RankLine& peer = segment_->line(p);
    auto count = atomic(peer.arrivals);
    if (reached(count.load(std::memory_order_acquire), target)) continue;
    // Spin: check the clock only every 64 pauses (reading it costs more than a pause).
    const auto spin_until = Clock::now() + kSpin;
    bool arrived = false;
    for (int i = 1;; ++i) {
      cpu_relax();
      if (reached(count.load(std::memory_order_acquire), target)) {
        arrived = true;
        break;
      }
      if (i % 64 == 0 && Clock::now() >= spin_until) break;
    }
    // Sleep in slices until the peer arrives, dies, or the deadline passes.
    while (!arrived) {
      const auto now = Clock::now();
      still_running(now, deadline);
      if (now >= deadline && reached(count.load(std::memory_order_acquire), target)) break;
      if (now >= deadline) {
        fail_waiting(
            target,
            fmt::format("timed out after {:.1f} s", static_cast<double>(timeout_.count()) / 1000.0),
            phase, chunk, chunks);
      }
      const Peer& info = peers_[static_cast<std::size_t>(p)];
      if (info.checkable && known_dead(probe_process(info.pid), info.start_time)) {
        // It may have arrived just before it died: its arrival still counts (the next barrier
        // finds it gone). Only a peer that died without arriving fails this barrier.
        if (reached(count.load(std::memory_order_acquire), target)) break;
        fail_waiting(target, "a peer's process ended", phase, chunk, chunks);
      }
      const auto slice = std::min<Clock::duration>(deadline - now, kPollSlice);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      auto sleepers = atomic(peer.sleepers);
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = count.load(std::memory_order_seq_cst);
      if (!reached(seen, target)) futex(&peer.arrivals, FUTEX_WAIT, seen, &ts);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      arrived = reached(count.load(std::memory_order_acquire), target);
    }
  }
}

void ShmAllreduce::fail_waiting(std::uint32_t target, const std::string& what_happened,
                                const char* phase, std::size_t chunk, std::size_t chunks) {
  // Who is behind, and why. A dead process explains everything: the live ranks that have not
  // arrived yet are then most likely just slower, and naming them would send the reader to
  // the wrong place. Without a dead one, every live straggler is a suspect.
  std::vector<int> dead;
  std::vector<int> late;
  std::vector<std::string> dead_why;
  std::vector<std::string> late_why;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    RankLine& line = segment_->line(q);
    if (reached(atomic(line.arrivals).load(std::memory_order_acquire), target)) continue;
    const Peer& info = peers_[static_cast<std::size_t>(q)];
    const std::uint64_t its_seq = atomic(line.op_seq).load(std::memory_order_relaxed);
    const ProcessProbe probe = info.checkable ? probe_process(info.pid) : ProcessProbe{};
    if (info.checkable && known_dead(probe, info.start_time)) {
      dead.push_back(q);
      dead_why.push_back(fmt::format(
          "rank {} did not arrive: its process (pid {}) has exited (crashed, killed, or ended "
          "its training loop with fewer collectives than this rank?)",
          q, info.pid));
    } else if (info.checkable && probe.state == ProcessProbe::State::kUnknown) {
      late.push_back(q);
      late_why.push_back(fmt::format(
          "rank {} did not arrive, and whether its process (pid {}) is alive could not be "
          "checked ({})",
          q, info.pid, probe.why_unknown));
    } else if (its_seq < op_seq_) {
      late.push_back(q);
      late_why.push_back(fmt::format(
          "rank {} did not report reaching this op (the last shared-memory op it entered is #{}; "
          "crashed or stuck?)",
          q, its_seq));
    } else {
      late.push_back(q);
      late_why.push_back(
          fmt::format("rank {} is in this op but did not arrive (crashed or stuck?)", q));
    }
  }
  if (dead.empty() && late.empty()) {
    // Everyone arrived after all (a peer's last arrival raced with its death): say so rather
    // than naming nobody.
    late_why.push_back(
        "every rank had arrived by the time this was checked; one of them has "
        "since ended");
  }
  const bool any_dead = !dead.empty();
  throw ShmError(fmt::format("{} at the {} barrier of chunk {} of {}: {}", what_happened, phase,
                             chunk + 1, chunks, fmt::join(any_dead ? dead_why : late_why, "; ")),
                 any_dead ? std::move(dead) : std::move(late));
}

// ---- one all-reduce -----------------------------------------------------------------------

void ShmAllreduce::run(void* data, const void* input, std::size_t count, DType dtype, ReduceOp op,
                       std::uint64_t seq) {
  if (!enabled()) fail("ShmAllreduce::run: the shared segment is not in use");
  if (count == 0) return;
  checked_in_ = std::chrono::steady_clock::now();
  auto deadline = checked_in_ + timeout_;  // moved by a stop (still_running)
  const std::uint32_t kind = op_kind(Collective::kAllreduce, dtype, op);
  publish_op(seq, count, kind);

  const std::size_t elem = dtype_size(dtype);
  const std::size_t chunk_elems = chunk_bytes_ / elem;
  const std::size_t chunks = (count + chunk_elems - 1) / chunk_elems;
  auto* out = static_cast<std::uint8_t*>(data);
  const auto* src = static_cast<const std::uint8_t*>(input != nullptr ? input : data);
  std::vector<const std::uint8_t*> sources(static_cast<std::size_t>(size_));

  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t first = c * chunk_elems;
    const Partition part(std::min(chunk_elems, count - first), size_, elem);
    const std::uint64_t set = chunks_done_ & 1;
    std::uint8_t* my_lane = segment_->lane(set, rank_);
    const auto bytes_of = [&](int p) { return (part.end(p) - part.begin(p)) * elem; };

    // 1. Copy in: the partitions the other ranks reduce.
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || bytes_of(p) == 0) continue;
      std::memcpy(my_lane + part.begin(p) * elem, src + (first + part.begin(p)) * elem,
                  bytes_of(p));
    }
    arrive();
    wait_for_all(generation_, deadline, "copy-in", c, chunks);

    if (c == 0) {
      // Every rank is past its copy-in of this op's first chunk, so every rank has published
      // which op it runs: a mismatch (ranks out of step) is reported here, not as wrong numbers.
      check_same_op(seq, count, kind);
    }

    // 3. Reduce my partition over all ranks, in rank order.
    if (bytes_of(rank_) > 0) {
      const std::size_t begin = part.begin(rank_);
      for (int q = 0; q < size_; ++q) {
        sources[static_cast<std::size_t>(q)] =
            q == rank_ ? src + (first + begin) * elem : segment_->lane(set, q) + begin * elem;
      }
      reduce_in_rank_order(sources.data(), size_, part.end(rank_) - begin, dtype, op,
                           out + (first + begin) * elem, my_lane + begin * elem);
    }
    arrive();
    wait_for_all(generation_, deadline, "reduce", c, chunks);

    // 5. Copy out: every other rank's reduced partition.
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || bytes_of(p) == 0) continue;
      std::memcpy(out + (first + part.begin(p)) * elem,
                  segment_->lane(set, p) + part.begin(p) * elem, bytes_of(p));
    }
    ++chunks_done_;
  }
}

}  // namespace nanoddp::comm
