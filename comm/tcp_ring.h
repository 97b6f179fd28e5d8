#pragma once
// The flat all-reduce over TCP on nanoddp's own sockets: a ring, as NCCL's socket transport
// runs one (internal, not installed).
//
// Why not Gloo's ring, which carried it before (and still does with $NANODDP_TCP_RING=0)?
// Gloo's unbound buffers hand every message through its event-loop thread: the receiver
// announces "ready to receive", the sender's loop thread sees that and writes, the receiver's
// loop thread reads and wakes the op's thread. Each ring step is several hand-offs between
// threads on each rank, and where cores are few those are wake-ups of threads that compete with
// the training for them. Here the group's worker thread itself writes to the next rank and reads
// from the previous one, on two non-blocking sockets, and reduces each piece as it arrives.
// It also carries reduce-scatter, all-gather (ZeRO), broadcast and barrier; Gloo still connects
// the group.
//
// Set-up (a collective, right after Gloo connected; every rank constructs one at the same
// point): each rank listens on the address its Gloo device uses and publishes "<name>/ring/<r>"
// = its address and a random nonce (or why it does not take part). If every rank takes part,
// rank r connects to rank r+1 and says hello (its rank and nonce); it accepts from rank r-1 and
// drops any connection whose hello is not rank r-1's (a port scanner, a stray client). All
// ranks decide from the same published entries, so all use the ring or none does.
//
// One all-reduce of n elements on W ranks: the buffer is cut into W chunks. Reduce-scatter:
// W-1 steps; in step s rank r sends its partial of chunk (r - s - 1) and receives rank r-1's
// partial of chunk (r - s - 2), combining it with its own as the bytes arrive. Rank r then holds
// chunk r reduced over all ranks. All-gather: W-1 more steps pass the reduced chunks on. Each
// chunk is reduced once, by one rank, and copied to the others, so every rank ends with the same
// bits; and a reduce-scatter (ZeRO stage 2) sums in the same order as the all-reduce (stage 0).
//
// Every message starts with a header naming its op (sequence number), step and size: data of
// another op, or of another size, is an error that says so, never summed in.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/comm/unique_fd.h"
#include "nanoddp/engine/dtype.h"

namespace nanoddp::comm {

// An op on the ring failed: a socket to `peer` failed (kConnectionLost), the op's time ran out
// waiting for `peer` (kTimedOut), or `peer` sent data of another op or size (kMismatch). `peer`
// is -1 when none is known; `address` is its end of the socket, as "[ip]:port".
class TcpRingError : public CommError {
 public:
  enum class Kind { kConnectionLost, kTimedOut, kMismatch };
  TcpRingError(const std::string& cause, Kind kind, int peer, std::string address)
      : CommError(cause), kind_(kind), peer_(peer), address_(std::move(address)) {}
  Kind kind() const { return kind_; }
  int peer() const { return peer_; }
  const std::string& address() const { return address_; }

 private:
  Kind kind_;
  int peer_;
  std::string address_;
};

class TcpRing {
 public:
  // Collective (see above). `bind_ip` is the address this rank's Gloo device uses; keys live
  // under "<name>/ring/" in `store`. A rank that does not take part ($NANODDP_TCP_RING=0, one
  // rank only) makes every rank fall back to Gloo (enabled() false). A ring that cannot be
  // connected within `timeout` throws CommError naming the rank. `timeout` bounds every op.
  // `names`: what messages call ring member i (rank names[i] of the whole group, for a ring
  // of some of its ranks); empty: i itself. TcpRingError::peer() is always the ring's own index.
  TcpRing(Store& store, int rank, int size, std::chrono::milliseconds timeout,
          const std::string& name, const std::string& bind_ip, std::vector<int> names = {});
  TcpRing(const TcpRing&) = delete;
  TcpRing& operator=(const TcpRing&) = delete;

  bool enabled() const { return enabled_; }
  const std::string& fallback_reason() const { return fallback_reason_; }
  // "to rank 1 at [127.0.0.1]:40123, from rank 1 at [127.0.0.1]:40124"
  std::string describe() const;

  // data = op over every rank's data (or `input`, when given: out of place), n elements of
  // float32 or bfloat16. kAvg sums: the caller divides once (divide_by). Throws TcpRingError.
  void allreduce(void* data, const void* input, std::size_t n, DType dtype, ReduceOp op,
                 std::uint64_t seq);
  // ProcessGroup's reduce_scatter and allgather over `block` elements per rank (`output` may
  // be block `rank` of `input`, or the other way round). kAvg sums: the caller divides once.
  void reduce_scatter(const void* input, void* output, std::size_t block, DType dtype, ReduceOp op,
                      std::uint64_t seq);
  void allgather(const void* input, void* output, std::size_t block, DType dtype,
                 std::uint64_t seq);
  // `data` (n elements) of rank `root` to every rank. Throws TcpRingError.
  void broadcast(void* data, std::size_t n, DType dtype, int root, std::uint64_t seq);
  // Returns once every rank has entered it (so a rank in a barrier and one in an all-reduce of
  // the same op number are told apart at once, not by the timeout).
  void barrier(std::uint64_t seq);

 private:
  using Clock = std::chrono::steady_clock;
  // Set-up step 3: next_ and prev_ (CommError when either cannot be made by `deadline`).
  void connect_ring(int listener, const std::string& next_ip, const std::string& next_port,
                    std::uint64_t nonce, std::uint64_t prev_nonce, const std::string& name,
                    Clock::time_point deadline);
  struct Transfer;
  struct Chunks;
  void exchange(Transfer& t, Clock::time_point& deadline);
  // Checks in: a gap since the last check-in far longer than a wait slice was time this process
  // did not run (stopped, starved), and moves `deadline` by it.
  void still_running(Clock::time_point& deadline);
  std::size_t chunk(int c) const;  // c mod size
  void reduce_scatter_steps(const std::uint8_t* input, std::uint8_t* out, const Chunks& chunks,
                            DType dtype, ReduceOp op, std::uint64_t seq, std::uint32_t& step,
                            Clock::time_point& deadline, bool ends_op);
  void allgather_steps(std::uint8_t* data, const Chunks& chunks, std::uint64_t seq,
                       std::uint32_t& step, Clock::time_point& deadline);

  int rank_name(int i) const { return names_.empty() ? i : names_[static_cast<std::size_t>(i)]; }

  int rank_;
  int size_;
  std::vector<int> names_;
  std::chrono::milliseconds timeout_;
  bool enabled_ = false;
  std::string fallback_reason_;
  UniqueFd next_;  // to rank + 1
  UniqueFd prev_;  // from rank - 1
  std::string next_address_;
  std::string prev_address_;
  Clock::time_point checked_in_;       // see still_running
  std::vector<std::uint8_t> scratch_;  // a received chunk, and two partials (3 ranks or more)
};

}  // namespace nanoddp::comm
