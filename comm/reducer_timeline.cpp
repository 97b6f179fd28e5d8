#include "nanoddp/comm/reducer_timeline.h"

#include <fmt/format.h>

#include <map>

#include "nanoddp/engine/debug_log.h"

namespace nanoddp::comm {

namespace {

double ms_between(ReducerTimeline::Clock::time_point from, ReducerTimeline::Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

ReducerTimeline::ReducerTimeline(Device device) : device_(device), backward_end_event_(device) {
  if (device.is_cuda()) anchor_ = std::make_unique<ClockAnchor>(Stream::compute(device));
}

void ReducerTimeline::set_bucket_count(std::size_t buckets) {
  wait_begin_.clear();
  wait_end_.clear();
  for (std::size_t b = 0; b < buckets; ++b) {
    wait_begin_.emplace_back(device_);
    wait_end_.emplace_back(device_);
  }
  stats_.buckets.assign(buckets, BucketStats{});
  timed_works_.clear();
}

void ReducerTimeline::start_pass(Clock::time_point now) {
  stats_ = ReducerStats{};
  stats_.origin = now;
  stats_.buckets.assign(wait_begin_.size(), BucketStats{});
  exposed_pending_ = false;
  timed_works_.clear();
}

void ReducerTimeline::bucket_ready(std::size_t bucket, Clock::time_point now) {
  stats_.buckets[bucket].ready_ms = ms_between(stats_.origin, now);
  if (Tracer* tracer = active_tracer()) {
    tracer->instant_on(device_, now, fmt::format("bucket {} ready", bucket), TraceTrack::kMarkers);
  }
}

void ReducerTimeline::bucket_launched(std::size_t bucket, std::int64_t numel, bool after_backward) {
  BucketStats& s = stats_.buckets[bucket];
  s.launch_ms = ms_between(stats_.origin, Clock::now());
  s.launched_after_backward = after_backward;
  debug_log(DebugLevel::kDetail, "reducer: bucket {} ({} elements) launched at +{:.3f} ms", bucket,
            numel, s.launch_ms);
}

void ReducerTimeline::backward_ended() {
  // Backward's useful work ends with the last gradient: what runs between it and finalize is
  // autograd's bookkeeping, and an all-reduce running then hides behind nothing (counting from
  // finalize read overlap 1.0 for a last bucket reduced in that gap). On a GPU the event marks
  // the end on the compute stream instead (collect()).
  stats_.backward_end_ms = ms_between(stats_.origin, last_gradient_);
  backward_end_event_.record(Stream::compute(device_));
}

void ReducerTimeline::begin_waits(bool per_bucket, const char* collective) {
  // On a GPU these spans are the compute stream's stalls, not the host's (instant) enqueue of
  // the waits.
  tracer_ = active_tracer();
  wait_name_ = fmt::format("wait for {}", collective);
  if (tracer_ && !per_bucket) {
    all_waits_.emplace(tracer_, wait_name_, TraceTrack::kCompute, device_);
  }
  per_bucket_ = per_bucket;
}

void ReducerTimeline::before_wait(std::size_t bucket) {
  if (tracer_ && per_bucket_) {
    bucket_wait_.emplace(tracer_, wait_name_, TraceTrack::kCompute, device_,
                         std::map<std::string, std::string>{{"bucket", std::to_string(bucket)}});
  }
  // On the CPU the "stream" is this thread and the events are host times: the host's wait. On
  // a GPU Work::wait() only makes the compute stream wait (the host goes on at once), and the
  // intervals, read once the step has run, are the GPU stalling for the all-reduce.
  wait_begin_[bucket].record(Stream::compute(device_));
}

void ReducerTimeline::after_wait(std::size_t bucket) {
  wait_end_[bucket].record(Stream::compute(device_));
  bucket_wait_.reset();
  if (bucket + 1 == wait_end_.size()) all_waits_.reset();
}

void ReducerTimeline::end_pass(const std::vector<std::shared_ptr<Work>>& works,
                               std::vector<std::int64_t> numels, const char* comm_hook) {
  // A GPU's events are not done yet (reading them now would fail): collect() reads them later.
  exposed_pending_ = device_.is_cuda();
  stats_.wait_ms = exposed_pending_ ? 0.0 : wait_ms();
  // A CPU collective has finished by now; a CUDA one may still be running on its stream (the
  // host did not wait), so its timing is picked up later by stats().
  timed_works_ = works;
  numels_ = std::move(numels);
  comm_hook_ = comm_hook;
  collect();
}

void ReducerTimeline::end_failed_pass() {
  all_waits_.reset();
  bucket_wait_.reset();
  exposed_pending_ = false;
  timed_works_.clear();
}

double ReducerTimeline::wait_ms() const {
  double total = 0;
  for (std::size_t b = 0; b < wait_begin_.size(); ++b) {
    total += wait_begin_[b].elapsed_ms(wait_end_[b]);
  }
  return total;
}

void ReducerTimeline::collect() {
  if (exposed_pending_ && wait_end_.back().query()) {
    stats_.wait_ms = wait_ms();
    // The GPU's backward ended when the compute stream reached finalize.
    stats_.backward_end_ms = ms_between(stats_.origin, anchor_->host_time_of(backward_end_event_));
    exposed_pending_ = false;
    // Event times are float milliseconds since the anchor: renew it every minute (this waits
    // for the compute stream once).
    if (Clock::now() - anchor_->host_time() > std::chrono::minutes(1)) {
      anchor_ = std::make_unique<ClockAnchor>(Stream::compute(device_));
    }
  }
  for (std::size_t b = 0; b < timed_works_.size(); ++b) {
    if (!timed_works_[b]) continue;
    const auto timing = timed_works_[b]->timing();
    if (!timing) continue;
    BucketStats& s = stats_.buckets[b];
    s.start_ms = ms_between(stats_.origin, timing->start);
    s.end_ms = ms_between(stats_.origin, timing->end);
    stats_.comm_ms += s.allreduce_ms();
    if (tracer_) {
      // ZeRO-2 reduce-scatters its buckets (zero.h): the span says which collective ran.
      const bool scattered = timed_works_[b]->op_name().starts_with("reduce_scatter");
      tracer_->span(fmt::format("{} bucket {}", scattered ? "reduce-scatter" : "all-reduce", b),
                    TraceTrack::kCommunication, timing->start, timing->end,
                    {{"elements", std::to_string(numels_[b])},
                     {"sequence", std::to_string(timed_works_[b]->sequence_number())},
                     {"comm_hook", comm_hook_}});
    }
    timed_works_[b] = nullptr;  // counted once
  }
  compute_exposed();
}

void ReducerTimeline::compute_exposed() {
  if (exposed_pending_) return;
  for (const auto& work : timed_works_) {
    if (work) return;  // a timing still to come
  }
  // Each bucket's all-reduce time after backward ended; a bucket launched or started after it
  // (all of them without overlap) counts whole, computed exactly as comm_ms counts it.
  double exposed = 0;
  for (const BucketStats& s : stats_.buckets) {
    if (s.launched_after_backward || s.start_ms >= stats_.backward_end_ms) {
      exposed += s.allreduce_ms();
    } else if (s.end_ms > stats_.backward_end_ms) {
      exposed += s.end_ms - stats_.backward_end_ms;
    }
  }
  stats_.exposed_comm_ms = std::min(exposed, stats_.comm_ms);
}

const ReducerStats& ReducerTimeline::stats() {
  collect();
  return stats_;
}

}  // namespace nanoddp::comm
