#pragma once
// The Reducer's instrumentation, kept beside it so that its algorithm (reducer.cpp) reads
// without a clock: when each bucket became ready and was launched, when each all-reduce ran,
// when backward ended, how long finalize waited, and the same moments in a Chrome trace.
//
// The Reducer tells it what happened (start_pass, gradient_ready, bucket_ready, ...); it keeps
// the times and turns them into ReducerStats. On a GPU the compute stream's times arrive only
// once the step has run: stats() picks them up when they are there.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/trace.h"

namespace nanoddp::comm {

// Timing of one step's communication, on the host's steady clock.
struct BucketStats {
  double ready_ms = 0;   // when the bucket became ready (from the first hook of the step)
  double launch_ms = 0;  // when its collective was launched
  // Launched at finalize, after backward ended (all buckets without overlap): none of its
  // all-reduce can have overlapped backward, so all of it is exposed.
  bool launched_after_backward = false;
  double start_ms = 0;  // when the collective started running (CPU backends)
  double end_ms = 0;    // when it finished
  double allreduce_ms() const { return end_ms - start_ms; }
};

struct ReducerStats {
  std::vector<BucketStats> buckets;
  // When the backward pass's last gradient was final: on the CPU the host's time; on a GPU
  // the compute stream's (known once the step has run, see Reducer::last_stats()).
  double backward_end_ms = 0;
  double comm_ms = 0;  // sum of the buckets' all-reduce durations
  // The part of comm_ms that ran after backward ended, i.e. that the overlap did not hide:
  // per bucket, its all-reduce time after backward_end_ms. 0 <= exposed_comm_ms <= comm_ms,
  // and without overlap (every bucket launched after backward) exposed_comm_ms == comm_ms.
  double exposed_comm_ms = 0;
  // How long the compute stream waited for communication at the end of backward: on the CPU
  // the host's wait in finalize; on a GPU the compute stream's stall between two events. It
  // also holds what is not communication (queueing, waking the worker), so it is not
  // exposed_comm_ms; it is what the host's backward() time contains on the CPU.
  double wait_ms = 0;
  // Share of the communication that ran while backward was still computing (0 without
  // overlap, and when there was no communication).
  double overlap_fraction() const {
    return comm_ms > 0 ? std::clamp(1.0 - exposed_comm_ms / comm_ms, 0.0, 1.0) : 0.0;
  }
  std::chrono::steady_clock::time_point origin;  // the first hook of the step
};

class ReducerTimeline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ReducerTimeline(Device device);
  // How many buckets the passes reduce (again when they are rebuilt).
  void set_bucket_count(std::size_t buckets);

  // The first gradient of a synchronized pass: statistics start over (those of the previous
  // step not asked for by now are dropped).
  void start_pass(Clock::time_point now);
  void gradient_ready(Clock::time_point now) { last_gradient_ = now; }
  void bucket_ready(std::size_t bucket, Clock::time_point now);
  void bucket_launched(std::size_t bucket, std::int64_t numel, bool after_backward);
  // finalize_backward begins: backward's work ended with the last gradient (on a GPU, where
  // the compute stream reaches this point).
  void backward_ended();

  // finalize_backward's waits, bracketed by events on the compute stream. In a trace they are
  // "wait for <collective>" spans ("wait for all-reduce"; under ZeRO-2 "wait for
  // reduce-scatter"): one for all buckets, or one per bucket when the bucket-reduced hook's work
  // lies between them.
  void begin_waits(bool per_bucket, const char* collective);
  void before_wait(std::size_t bucket);
  void after_wait(std::size_t bucket);

  // The pass is over: its collectives' timings are collected now (CPU) or once they have
  // run on their stream (GPU). `numels` and `comm_hook` label the trace's all-reduce spans.
  void end_pass(const std::vector<std::shared_ptr<Work>>& works, std::vector<std::int64_t> numels,
                const char* comm_hook);
  // A failed pass: nothing of it is kept waiting.
  void end_failed_pass();

  const ReducerStats& stats();

 private:
  double wait_ms() const;  // the bucket waits' events, once they have happened
  void collect();
  void compute_exposed();

  Device device_;
  ReducerStats stats_;
  Clock::time_point last_gradient_;
  // The last step's collectives whose timings are not yet in stats_ (and where to trace them).
  std::vector<std::shared_ptr<Work>> timed_works_;
  std::vector<std::int64_t> numels_;
  const char* comm_hook_ = "";
  Tracer* tracer_ = nullptr;
  // Recorded on the compute stream just before and just after finalize makes it wait for each
  // bucket: the intervals add up to wait_ms, on any device.
  std::vector<Event> wait_begin_;
  std::vector<Event> wait_end_;
  std::optional<TraceSpan> all_waits_;
  std::optional<TraceSpan> bucket_wait_;
  std::string wait_name_;  // "wait for all-reduce", or the collective ZeRO-2 runs instead
  bool per_bucket_ = false;
  // Recorded on the compute stream when finalize starts: on a GPU, where backward really ended.
  Event backward_end_event_;
  bool exposed_pending_ = false;  // a GPU step whose exposed time is not read yet
  // GPU: maps the compute stream's backward end onto the host clock, where the collectives'
  // timings are. Renewed now and then (event times are float milliseconds).
  std::unique_ptr<ClockAnchor> anchor_;
};

}  // namespace nanoddp::comm
