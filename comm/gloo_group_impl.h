#pragma once
// The Gloo group's state (internal, not installed): GlooProcessGroup::Impl, its queue of jobs
// and the Work it hands out. gloo_process_group.cpp issues the collectives and runs them on
// the worker thread; gloo_group_failures.cpp turns a failed op into a message that names the
// rank to look at.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/gloo_helpers.h"
#include "nanoddp/comm/gloo_process_group.h"
#include "nanoddp/comm/hierarchical_allreduce.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/comm/tcp_ring.h"

namespace nanoddp::comm {

// ---- Work ---------------------------------------------------------------------------------

// The error travels as text, and every thread that asks for it gets an exception object of its
// own. Handing the worker's exception object itself to the waiting thread (rethrow of a shared
// exception_ptr) would leave two threads sharing one object whose lifetime is counted inside
// the C++ runtime, out of ThreadSanitizer's sight: it reported the worker freeing the message
// a waiter had printed.
class GlooWork final : public Work {
 public:
  GlooWork(std::uint64_t sequence_number, std::string op_name)
      : sequence_number_(sequence_number), op_name_(std::move(op_name)) {}

  void wait() override {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return done_; });
    if (error_message_) throw CommError(*error_message_);
  }
  bool is_completed() override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  std::exception_ptr error() override {
    std::lock_guard lock(mutex_);
    if (!error_message_) return nullptr;
    return std::make_exception_ptr(CommError(*error_message_));
  }
  std::uint64_t sequence_number() const override { return sequence_number_; }
  const std::string& op_name() const override { return op_name_; }
  std::optional<WorkTiming> timing() const override {
    std::lock_guard lock(mutex_);
    if (!done_) return std::nullopt;
    return timing_;
  }

  // `error`: what went wrong, or nullopt on success.
  void finish(std::optional<std::string> error, WorkTiming timing) {
    {
      std::lock_guard lock(mutex_);
      error_message_ = std::move(error);
      timing_ = timing;
      done_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  const std::uint64_t sequence_number_;
  const std::string op_name_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::optional<std::string> error_message_;
  WorkTiming timing_;
};

struct GlooProcessGroup::Impl {
  struct Job {
    std::shared_ptr<GlooWork> work;
    std::string description;  // "allreduce #7 (sum, 1237 x float32)"
    std::function<void(std::uint64_t sequence_number)> run;
  };

  GlooProcessGroup* owner = nullptr;  // records every op's fingerprint
  int rank = 0;
  int size = 1;
  ProcessGroupOptions options;
  GlooConnection connection;
  // Same host: allreduce, reduce-scatter and allgather go through shared memory instead of
  // Gloo's TCP ring. Runs on the worker thread like every op, so order, sequence numbers,
  // Work and timings are unchanged. Null or disabled: everything goes over TCP.
  std::unique_ptr<ShmAllreduce> shm;
  // Several hosts, some with several ranks: shared memory within each, TCP across them
  // (hierarchical_allreduce.h). When enabled, `shm` is not made (it would span hosts).
  std::unique_ptr<HierarchicalAllreduce> hier;
  // Neither: allreduce goes around nanoddp's own TCP ring (tcp_ring.h) unless a rank opted out
  // ($NANODDP_TCP_RING=0), then around Gloo's.
  std::unique_ptr<TcpRing> ring;
  std::shared_ptr<Store> diagnostics;  // "<name>/gloo/diag/...": timeout reports only

  std::mutex mutex;  // guards everything below
  std::condition_variable queue_cv;
  std::deque<Job> queue;
  bool stopping = false;
  std::uint64_t last_sequence_number = 0;

  // Touched by the worker thread only.
  std::string first_failure;          // set by the first failed op: later ops fail fast
  std::vector<std::uint8_t> scratch;  // reduce-scatter ring, coalesced packing; kept, reused

  std::thread worker;

  std::uint32_t tag(std::uint64_t sequence_number) const {
    // A distinct tag per op (Gloo slots are built from it), so messages of op N can never be
    // mistaken for messages of op N+1, even if ranks drift out of step.
    return static_cast<std::uint32_t>(sequence_number);
  }

  // Runs one Gloo collective on `opts` (worker thread). When it fails (a peer died or timed
  // out), Gloo's transport thread may still complete a send on the op's buffers later, under a
  // lock the failed op never took again: destroying the options then is a use after free
  // (ThreadSanitizer caught UnboundBuffer's destructor destroying the condition variable that
  // handleSendCompletion was signalling). The buffers also hold the transport context, so no
  // destruction order inside the group helps. A failed group is done anyway (later ops fail
  // fast) and the job is ending, so a failed op's options are kept for the life of the process.
  template <typename Options, typename Collective>
  void run_gloo(std::unique_ptr<Options> opts, Collective collective) {
    try {
      collective(*opts);
    } catch (...) {
      keep_failed_gloo_op(std::shared_ptr<Options>(std::move(opts)));
      throw;
    }
  }

  std::uint8_t* scratch_bytes(std::size_t nbytes) {
    // Grows to the largest size seen and stays: first touch of fresh memory is slow here.
    if (scratch.size() < nbytes) scratch.resize(nbytes);
    return scratch.data();
  }

  std::shared_ptr<Work> enqueue(OpRecord record, const std::string& detail,
                                std::function<void(std::uint64_t)> run);

  void worker_loop();

  // Which ranks are behind? Gloo's timeout only says "a recv did not complete". On a timeout
  // (the failure path only, never per op), every rank that timed out in op `seq` checks in
  // under "timeout/<seq>/<rank>" and looks, for a short grace period, for the others. A rank
  // stuck before the op (in a long computation, a deadlock, a different op) never checks in:
  // that is the rank to look at.
  std::vector<int> ranks_without_report(std::uint64_t seq) const;

  std::string explain(const std::string& description, std::uint64_t seq,
                      const std::string& what) const;

  std::string explain_ring(const std::string& description, std::uint64_t seq,
                           const TcpRingError& e) const;
  // What explain and explain_ring share: `peer` (-1: unknown) at `address` ("" : unknown) lost
  // its connection, or the op timed out (then the ranks that did not report reaching it are
  // named instead). `quoted` is the transport's own message, with its name.
  std::string explain_failure(const std::string& description, std::uint64_t seq, int peer,
                              const std::string& address, bool timed_out,
                              const std::string& quoted) const;

  // The shared-memory path knows exactly who is missing (their arrival counters are behind,
  // or their process is gone), so no store round is needed to find out.
  std::string explain_shm(const std::string& description, const ShmError& e) const;

  // ---- the Gloo calls (worker thread) ----

  void run_allreduce(void* data, std::size_t n, DType dtype, ReduceOp op, std::uint64_t seq,
                     const void* input = nullptr);
  // gloo_collectives.cpp: shared memory when the group has it; a hierarchical group's
  // reduce-scatter is its all-reduce, cut; else (TCP) nanoddp's ring, or a ring reduce-scatter
  // on Gloo's unbound buffers and gloo::allgather (also a hierarchical group's all-gather).
  // `output` may alias block `rank` of `input` / the other way round.
  void run_reduce_scatter(const void* input, void* output, std::size_t block, DType dtype,
                          ReduceOp op, std::uint64_t seq);
  void run_allgather(const void* input, void* output, std::size_t block, DType dtype,
                     std::uint64_t seq);
};

}  // namespace nanoddp::comm
