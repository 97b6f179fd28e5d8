#pragma once
// The shared segment of ShmAllreduce (internal, not installed): the words the ranks share in it,
// where each part lies, and what a rank can learn about a peer's process. shm_setup.cpp makes
// and maps the segment; shm_allreduce.cpp runs the all-reduce over it (and draws the layout).

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "nanoddp/comm/shm_allreduce.h"

namespace nanoddp::comm {
namespace shm {

inline constexpr std::uint64_t kMagic = 0x6e616e6f64647073ull;  // "nanoddps"
inline constexpr std::uint32_t kVersion = 1;
// Two 64-byte cache lines: x86 cores prefetch lines in adjacent pairs, so 64 bytes apart is
// still close enough for two ranks' counters to disturb each other.
inline constexpr std::size_t kLine = 128;

struct alignas(kLine) Header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t size;
  std::uint64_t chunk_bytes;
  std::uint64_t total_bytes;
};

struct alignas(kLine) RankLine {
  std::uint32_t arrivals;  // barriers reached (the futex word)
  std::uint32_t sleepers;  // peers sleeping on `arrivals`
  std::uint64_t op_seq;    // the op this rank is in (its sequence number; 0 = none yet)
  std::uint64_t op_count;  // its element count
  std::uint32_t op_kind;   // op_kind(): dtype | reduce op << 8 | collective << 16
};

// Which collective a rank is in: all-reduce is 0, so its op_kind word is what it always was.
enum class Collective : std::uint32_t { kAllreduce = 0, kReduceScatter = 1, kAllgather = 2 };
inline std::uint32_t op_kind(Collective c, DType dtype, ReduceOp op) {
  return static_cast<std::uint32_t>(dtype) | (static_cast<std::uint32_t>(op) << 8) |
         (static_cast<std::uint32_t>(c) << 16);
}
// "reduce_scatter, 5 x float32 per rank, sum"
std::string describe_op_kind(std::uint32_t kind, std::uint64_t count);

// sources[0..n) combined element-wise IN RANK ORDER (shm_allreduce.cpp explains why), divided
// once by n for avg, written to out_a and (when not null) out_b. An output may alias a source.
void reduce_in_rank_order(const std::uint8_t* const* sources, int n, std::size_t count, DType dtype,
                          ReduceOp op, std::uint8_t* out_a, std::uint8_t* out_b);

// The segment's words are plain integers accessed through std::atomic_ref: no C++ object has
// to be "constructed" in memory that another process created.
static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);
static_assert(alignof(RankLine) >= std::atomic_ref<std::uint64_t>::required_alignment);

inline std::atomic_ref<std::uint32_t> atomic(std::uint32_t& word) {
  return std::atomic_ref<std::uint32_t>(word);
}
inline std::atomic_ref<std::uint64_t> atomic(std::uint64_t& word) {
  return std::atomic_ref<std::uint64_t>(word);
}

inline std::size_t round_up(std::size_t value, std::size_t to) {
  return (value + to - 1) / to * to;
}

// Byte offsets of the parts of a segment for `size` ranks.
struct Layout {
  std::size_t lines = 0;  // first RankLine
  std::size_t lanes = 0;  // lane set 0, rank 0
  std::size_t total = 0;
  Layout(int size, std::size_t chunk_bytes) {
    lines = kLine;
    lanes = round_up(lines + static_cast<std::size_t>(size) * sizeof(RankLine), 4096);
    total = lanes + 2 * static_cast<std::size_t>(size) * chunk_bytes;
  }
};

// What /proc/<pid>/stat says about a process: running (with its start time, field 22, in clock
// ticks since boot), gone (no such process, or a zombie waiting to be reaped), or unknown: the
// file could not be read for another reason (EMFILE, ENOMEM, ...), which says nothing about
// the process.
struct ProcessProbe {
  enum class State { kRunning, kGone, kUnknown } state = State::kUnknown;
  std::uint64_t start_time = 0;
  std::string why_unknown;
};

ProcessProbe probe_process(long pid);

// Whether the peer is known to have ended: gone, or its pid now belongs to another process.
inline bool known_dead(const ProcessProbe& probe, std::uint64_t start_time) {
  return probe.state == ProcessProbe::State::kGone ||
         (probe.state == ProcessProbe::State::kRunning && probe.start_time != start_time);
}

}  // namespace shm

// The mapping: unmapped when the object goes (the name was unlinked long before).
struct ShmAllreduce::Segment {
  std::uint8_t* base = nullptr;
  std::size_t bytes = 0;
  int size = 0;
  std::size_t chunk_bytes = 0;
  shm::Layout layout{1, 0};

  ~Segment() {
    if (base != nullptr) munmap(base, bytes);
  }
  shm::Header& header() const { return *reinterpret_cast<shm::Header*>(base); }
  shm::RankLine& line(int r) const {
    return reinterpret_cast<shm::RankLine*>(base + layout.lines)[static_cast<std::size_t>(r)];
  }
  std::uint8_t* lane(std::uint64_t set, int r) const {
    return base + layout.lanes +
           (static_cast<std::size_t>(set) * static_cast<std::size_t>(size) +
            static_cast<std::size_t>(r)) *
               chunk_bytes;
  }
};

}  // namespace nanoddp::comm
