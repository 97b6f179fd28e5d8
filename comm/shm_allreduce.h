#pragma once
// All-reduce through shared memory, for the ranks of a group that all live on one host.
//
// Why. Gloo's ring all-reduce sends every byte through a TCP socket even when both ends are on
// the same machine: user buffer -> kernel socket buffer -> the peer's user buffer, twice per
// byte and ring step, and those kernel copies compete with the training computation for the
// same cores. NCCL solves this inside a node with shared memory, and so does this class: the
// ranks map one segment of memory, copy their data in, each reduces a slice, and each copies
// the reduced result out. No kernel on the data path; two barriers per chunk.
//
// How the segment is made (the constructor, a collective through the store):
//   1. every rank publishes its host identity (host name, kernel boot id, network namespace)
//      and whether it wants shared memory ($NANODDP_SHM=0 says no);
//   2. if all identities match and all want it, rank 0 creates a POSIX shared-memory object
//      (shm_open with a random name, O_EXCL, mode 0600), sizes it, maps it and publishes the name;
//   3. the others open and map it and report "ok" or why not;
//   4. everyone reads everyone's report; rank 0 then unlinks the name at once, so nothing is
//      left in /dev/shm when the job ends — however it ends: the memory lives on only as long
//      as some process still maps it.
// Every rank decides from the same published facts, so all agree: either all use shared memory
// or all fall back to TCP (one line on stderr says why).
//
// How one all-reduce runs, and what happens when a peer dies: see shm_allreduce.cpp. The same
// segment, lanes and barriers also carry a reduce-scatter and an all-gather that move only the
// bytes each needs (shm_collectives.cpp).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/engine/dtype.h"

namespace nanoddp::comm {

// A shared-memory all-reduce failed: a peer did not arrive in time, died, or is running a
// different op. what() is the cause; `suspects` are the ranks to look at (may be empty).
// What each rank publishes as its host: host name, kernel boot id and network namespace. Ranks
// share /dev/shm (and so the shared-memory all-reduce) only when theirs are equal.
std::string shm_host_identity();

class ShmError : public CommError {
 public:
  ShmError(const std::string& cause, std::vector<int> suspects)
      : CommError(cause), suspects_(std::move(suspects)) {}
  const std::vector<int>& suspects() const { return suspects_; }

 private:
  std::vector<int> suspects_;
};

// One rank's lane, i.e. the chunk size. Large enough that the two barriers per chunk cost
// little; small enough that both lane sets of 2 ranks (4 lanes, 2 MiB) stay in a core's L2 and
// the last-level cache while peers read them. Measured on the 2-core dev VM (16 MiB float32,
// 2 ranks): 256 KiB ~1.1 ms, 512 KiB ~0.96 ms, 1 MiB ~1.03 ms, 2 MiB ~1.4 ms, 4 MiB ~2.0 ms.
// $NANODDP_SHM_CHUNK_KB overrides it (rank 0's value wins: it is written into the segment).
inline constexpr std::size_t kShmDefaultChunkBytes = std::size_t{512} << 10;

class ShmAllreduce {
 public:
  // Collective: every rank of the group constructs one at the same point, with the same `name`
  // (keys live under "<name>/shm/" in `store`; like Gloo's rendezvous, one group per name). Never
  // throws for a segment that cannot be made (that is a fallback: enabled() is false); throws
  // StoreError if the store fails. `timeout` bounds every later op, and the set-up exchange.
  ShmAllreduce(Store& store, int rank, int size, std::chrono::milliseconds timeout,
               const std::string& name);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Whether the shared segment is in use; if not, why not ("NANODDP_SHM=0", "rank 1 is on
  // another host", ...). All ranks of the group agree.
  bool enabled() const { return segment_ != nullptr; }
  const std::string& fallback_reason() const { return fallback_reason_; }
  // Bytes of one rank's lane (a chunk): buffers larger than this are reduced chunk by chunk.
  std::size_t chunk_bytes() const { return chunk_bytes_; }

  // In place over `data` (or from `input`, when given, into `data`): `count` elements of
  // float32 or bfloat16. `seq` is the op's sequence number (for messages, and to check that
  // every rank runs the same op). Requires enabled(). Throws ShmError (peer dead, timed out,
  // mismatched op) — after which the segment's state is unknown and it must not be used again.
  void run(void* data, const void* input, std::size_t count, DType dtype, ReduceOp op,
           std::uint64_t seq);
  // `input` holds size() blocks of `block` elements; `output` gets the reduction of block
  // rank() (it may alias that block of `input`). Each rank writes the blocks of the others
  // into its lane once and reduces only its own block. Same errors as run().
  void reduce_scatter(const void* input, void* output, std::size_t block, DType dtype, ReduceOp op,
                      std::uint64_t seq);
  // `output` holds size() blocks of `block` elements: rank r's `input` lands in block r (input
  // may alias that block). Each rank writes its block into its lane once; all read it.
  void allgather(const void* input, void* output, std::size_t block, DType dtype,
                 std::uint64_t seq);

 private:
  struct Segment;
  struct Peer {
    long pid = 0;
    std::uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells a reused pid apart
    bool checkable = false;        // same pid namespace: /proc/<pid> is really that process
  };

  void set_up(Store& store, const std::string& prefix);
  // Publishes the op this rank enters (its line), and checks after the first barrier that every
  // rank entered the same one (ShmError naming the first that did not).
  void publish_op(std::uint64_t seq, std::uint64_t count, std::uint32_t kind);
  void check_same_op(std::uint64_t seq, std::uint64_t count, std::uint32_t kind);
  void arrive();
  // Moves `deadline` by the time since the last check-in when this process did not run.
  void still_running(std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point& deadline);
  std::chrono::steady_clock::time_point checked_in_;
  void wait_for_all(std::uint32_t target, std::chrono::steady_clock::time_point& deadline,
                    const char* phase, std::size_t chunk, std::size_t chunks);
  // Reduce-scatter's and all-gather's barrier after step `step`'s copy-in, with the op check at
  // the first step (and, for a single-step op, the extra barrier it needs: shm_collectives.cpp).
  void wait_copied_in(std::chrono::steady_clock::time_point& deadline, std::size_t step,
                      std::size_t steps, std::uint64_t seq, std::uint64_t count,
                      std::uint32_t kind);
  [[noreturn]] void fail_waiting(std::uint32_t target, const std::string& what_happened,
                                 const char* phase, std::size_t chunk, std::size_t chunks);

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string fallback_reason_;
  std::size_t chunk_bytes_ = 0;
  std::unique_ptr<Segment> segment_;
  std::vector<Peer> peers_;
  std::uint32_t generation_ = 0;   // this rank's barrier count (mirrors its arrival counter)
  std::uint64_t chunks_done_ = 0;  // chunks over the segment's life: picks the lane set
  std::uint64_t op_seq_ = 0;       // the op being run, for messages
};

}  // namespace nanoddp::comm
