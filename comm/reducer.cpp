#include "nanoddp/comm/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <string>

#include "nanoddp/comm/bucket_assignment.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/trace.h"

namespace nanoddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

CommHook parse_comm_hook(const std::string& name) {
  if (name == "allreduce") return CommHook::kAllreduce;
  if (name == "bf16") return CommHook::kBf16;
  fail("unknown comm hook '{}': expected allreduce or bf16", name);
}

const char* comm_hook_name(CommHook hook) {
  return hook == CommHook::kBf16 ? "bf16" : "allreduce";
}

Reducer::Reducer(nn::FlatParameters& params, std::shared_ptr<ProcessGroup> group,
                 const ReducerOptions& options)
    : params_(params), group_(std::move(group)), options_(options) {
  // Cut the flat gradient buffer into buckets, in its (reverse registration) order
  // (bucket_assignment.h: the rule nanoddp-sim uses too).
  const auto& slots = params_.slots();
  std::vector<std::int64_t> numels;
  for (const auto& slot : slots) numels.push_back(slot.numel);
  bucket_of_slot_.resize(slots.size());
  for (const BucketRange& range :
       assign_buckets(numels, options.first_bucket_mb, options.bucket_cap_mb)) {
    Bucket bucket{.offset = slots[range.first].offset, .numel = range.numel};
    for (std::size_t i = range.first; i < range.first + range.count; ++i) {
      bucket.slots.push_back(i);
      bucket_of_slot_[i] = buckets_.size();
    }
    buckets_.push_back(std::move(bucket));
  }
  const Device device = params_.device();
  for (Bucket& bucket : buckets_) {
    bucket.grads = params_.grads().view(bucket.offset, {bucket.numel});
    if (options.comm_hook == CommHook::kBf16) {
      bucket.compressed = Tensor::empty({bucket.numel}, device, DType::kBF16);
    }
    wait_begin_.emplace_back(device);
    wait_end_.emplace_back(device);
  }
  backward_end_event_ = Event(device);
  if (device.is_cuda()) anchor_ = std::make_unique<ClockAnchor>(Stream::compute(device));
  if (options.check_steps && group_->size() > 1) {
    step_check_ = std::make_unique<StepCheck>(group_, device);
  }

  // The hooks hold a weak handle: a hook that outlives its Reducer does nothing.
  if (debug_enabled(DebugLevel::kInfo)) {
    debug_log(DebugLevel::kInfo, "reducer: {} buckets (first {} MiB, then {} MiB, overlap {})\n{}",
              buckets_.size(), options.first_bucket_mb, options.bucket_cap_mb,
              options.overlap ? "on" : "off", describe_buckets());
  }
  alive_ = std::make_shared<Reducer*>(this);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    Tensor param = slots[i].param;
    std::weak_ptr<Reducer*> weak = alive_;
    hooks_.push_back(param.register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (auto self = weak.lock()) (*self)->on_gradient_ready(i);
    }));
  }
  reset();
}

Reducer::~Reducer() {
  // Never leave a collective running on buffers we are about to stop tracking, nor a hook on
  // the parameters (a rebuilt Reducer registers its own).
  wait_for_launched();
  for (HookHandle& hook : hooks_) hook.remove_quietly();
}

void Reducer::reset() {
  in_backward_ = false;
  finalizing_ = false;
  pending_.assign(buckets_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = static_cast<int>(buckets_[b].slots.size());
  }
  slot_ready_.assign(params_.slots().size(), false);
  next_to_launch_ = 0;
  works_.assign(buckets_.size(), nullptr);
  used_work_ = nullptr;
}

void Reducer::on_gradient_ready(std::size_t slot) {
  if (!sync_) return;  // no_sync: the gradient just accumulates locally
  const Clock::time_point now = Clock::now();
  if (in_backward_ && current_backward_pass() != backward_pass_) {
    // The previous pass died before its end and nobody told us (abort() below normally runs):
    // drop its state and start over with this pass.
    abort();
  }
  if (!in_backward_) {
    backward_pass_ = current_backward_pass();
    in_backward_ = true;
    stats_ = ReducerStats{};
    stats_.origin = now;
    exposed_pending_ = false;
    timed_works_.clear();  // timings of the previous step not asked for by now are dropped
    stats_.buckets.assign(buckets_.size(), BucketStats{});
    // Runs once autograd has finished the whole pass (or, if it throws, abort()).
    queue_backward_callback([this] { finalize(); }, [this] { abort(); });
  }
  if (slot_ready_[slot]) {
    fail(
        "parameter '{}' received its gradient twice in one backward pass; this Reducer "
        "expects each parameter to be finished once per pass",
        params_.slots()[slot].name);
  }
  slot_ready_[slot] = true;
  last_gradient_ = now;
  const std::size_t b = bucket_of_slot_[slot];
  if (--pending_[b] == 0) {
    stats_.buckets[b].ready_ms = ms_between(stats_.origin, now);
    if (Tracer* tracer = active_tracer()) {
      tracer->instant_on(params_.device(), now, fmt::format("bucket {} ready", b),
                         TraceTrack::kMarkers);
    }
    if (options_.overlap) launch_ready_buckets();
  }
}

void Reducer::wait_for_launched() {
  // On a path that fails anyway (or tears down), a collective's own error adds nothing: the
  // point is only that nothing still writes into the buckets afterwards.
  for (auto& work : works_) {
    if (!work) continue;
    try {
      work->wait();
    } catch (...) {
    }
  }
  if (used_work_) {
    try {
      used_work_->wait();
    } catch (...) {
    }
  }
}

void Reducer::abort() {
  // Collectives already launched keep writing into the gradient buckets: wait for them (their
  // errors are moot, the pass failed anyway) before anyone computes into those buffers again.
  wait_for_launched();
  reset();
}

void Reducer::launch_ready_buckets() {
  // Strictly in index order: bucket b+1 waits for bucket b even when it is ready first.
  while (next_to_launch_ < buckets_.size() && pending_[next_to_launch_] == 0) {
    launch(next_to_launch_++);
  }
}

void Reducer::launch(std::size_t b) {
  Bucket& bucket = buckets_[b];
  stats_.buckets[b].launch_ms = ms_between(stats_.origin, Clock::now());
  stats_.buckets[b].launched_after_backward = finalizing_;
  debug_log(DebugLevel::kDetail, "reducer: bucket {} ({} elements) launched at +{:.3f} ms", b,
            bucket.numel, stats_.buckets[b].launch_ms);
  if (options_.comm_hook == CommHook::kBf16) {
    backend_for(bucket.grads.device())
        .f32_to_bf16(bucket.grads.data(), static_cast<std::uint16_t*>(bucket.compressed.raw_data()),
                     bucket.numel);
    works_[b] = group_->allreduce(bucket.compressed, ReduceOp::kAvg);
  } else {
    works_[b] = group_->allreduce(bucket.grads, ReduceOp::kAvg);
  }
}

void Reducer::handle_unused() {
  std::vector<std::string> unused;
  for (std::size_t i = 0; i < slot_ready_.size(); ++i) {
    if (!slot_ready_[i]) unused.push_back(params_.slots()[i].name);
  }
  if (unused.empty()) return;
  if (!options_.find_unused_parameters) {
    // Let the buckets already in flight finish (the other ranks launched them too) before
    // reporting, so no collective is left half done.
    wait_for_launched();
    reset();
    fail(
        "{} parameter(s) received no gradient in this backward pass, so their buckets could "
        "never be reduced: {}. Make every parameter take part in the loss, or construct "
        "DistributedDataParallel with find_unused_parameters = true.",
        unused.size(), fmt::join(unused, ", "));
  }
  // find_unused_parameters: mark an unused parameter ready so its bucket is reduced with the
  // others (another rank may have used it). Its gradient on this rank is what it holds: the sum
  // of earlier no_sync micro-batches that did use it (kept, as PyTorch does), or, when nothing
  // wrote it since zero_grad(), zero (the buffer's stale contents must not be reduced).
  for (std::size_t i = 0; i < slot_ready_.size(); ++i) {
    if (slot_ready_[i]) continue;
    const nn::ParameterSlot& slot = params_.slots()[i];
    if (!slot.param.has_grad()) {
      Tensor grad = params_.grads().view(slot.offset, slot.param.shape());
      grad.zero();
      Tensor param = slot.param;
      param.set_grad(grad);
    }
    slot_ready_[i] = true;
    const std::size_t b = bucket_of_slot_[i];
    if (--pending_[b] == 0) stats_.buckets[b].ready_ms = ms_between(stats_.origin, Clock::now());
  }
}

void Reducer::launch_used_map(const std::vector<float>& used) {
  used_map_ = Tensor::from_vector(used, {static_cast<std::int64_t>(used.size())}, params_.device());
  used_work_ = group_->allreduce(used_map_, ReduceOp::kSum);
}

void Reducer::resolve_unused() {
  if (!used_work_) return;
  used_work_->wait();
  used_work_ = nullptr;
  const std::vector<float> global = used_map_.to_vector();
  for (std::size_t i = 0; i < global.size(); ++i) {
    // Unused on every rank: its gradient goes back to none, so the optimizer skips it (as
    // PyTorch's DDP leaves .grad None for a globally unused parameter).
    if (global[i] == 0.0f) {
      Tensor param = params_.slots()[i].param;
      param.zero_grad();
    }
  }
}

void Reducer::finalize() {
  // Backward's useful work ends with the last gradient: what runs between it and this callback
  // is autograd's bookkeeping, and an all-reduce running then hides behind nothing (counting
  // from here read overlap 1.0 for a last bucket reduced in that gap). On a GPU the event below
  // marks the end on the compute stream instead (collect_timings).
  stats_.backward_end_ms = ms_between(stats_.origin, last_gradient_);
  finalizing_ = true;
  backward_end_event_.record(Stream::compute(params_.device()));
  // Which parameters this rank used (got a gradient since zero_grad(), in this pass or in
  // no_sync ones), before handle_unused() gives the others a zero gradient to reduce.
  std::vector<float> used;
  if (options_.find_unused_parameters) {
    for (std::size_t i = 0; i < slot_ready_.size(); ++i) {
      used.push_back(slot_ready_[i] || params_.slots()[i].param.has_grad() ? 1.0f : 0.0f);
    }
  }
  handle_unused();
  launch_ready_buckets();
  NANODDP_CHECK(next_to_launch_ == buckets_.size(), "finalize: bucket {} was never launched",
                next_to_launch_);
  // After every bucket, so that every rank issues the collectives in the same order.
  if (options_.find_unused_parameters) launch_used_map(used);
  // Right behind the last bucket (and the used-parameter count), so it costs one small op's
  // latency.
  ++synchronized_passes_;
  if (step_check_) step_check_->launch(synchronized_passes_, forward_calls_);
  // The parameters unused on every rank are known before the first bucket hook (the optimizer
  // in backward must skip them), or else before finalize returns; the wait counts as exposed.
  const std::size_t resolve_after = bucket_reduced_hook_ ? 0 : buckets_.size() - 1;

  // wait_ms is what the compute stream waits for here, so two events on it bracket each
  // bucket's wait. On the CPU the "stream" is this thread and the events are host
  // times: the host's wait. On a GPU Work::wait() only makes the compute stream wait (the host
  // goes on at once), and the intervals, read once the step has run, are the GPU stalling for
  // the all-reduce. Without a bucket hook the intervals follow each other without a gap; with
  // one, the hook's work (the optimizer) lies between them and is not counted.
  const Stream compute = Stream::compute(params_.device());
  Tracer* tracer = active_tracer();
  // In a trace, the waits are "wait for all-reduce" spans on the compute track: one span for
  // all of them, or with a bucket hook one per bucket (the hook's work lies between them). On
  // a GPU they are the compute stream's stalls, not the host's (instant) enqueue of the waits.
  std::optional<TraceSpan> all_waits;
  if (tracer && !bucket_reduced_hook_) {
    all_waits.emplace(tracer, "wait for all-reduce", TraceTrack::kCompute, params_.device());
  }
  std::exception_ptr failure;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    {
      std::optional<TraceSpan> bucket_wait;
      if (tracer && bucket_reduced_hook_) {
        bucket_wait.emplace(tracer, "wait for all-reduce", TraceTrack::kCompute, params_.device(),
                            std::map<std::string, std::string>{{"bucket", std::to_string(b)}});
      }
      wait_begin_[b].record(compute);
      try {
        works_[b]->wait();
        if (b == resolve_after) resolve_unused();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      wait_end_[b].record(compute);
    }
    if (b + 1 == buckets_.size()) all_waits.reset();
    // After a failure the gradients are garbage: wait for the rest (never leave a collective
    // running on buffers we stop tracking), but run nothing on them.
    if (failure) continue;
    Bucket& bucket = buckets_[b];
    if (options_.comm_hook == CommHook::kBf16) {
      backend_for(bucket.grads.device())
          .bf16_to_f32(static_cast<const std::uint16_t*>(bucket.compressed.raw_data()),
                       bucket.grads.data(), bucket.numel);
    }
    if (bucket_reduced_hook_) {
      try {
        bucket_reduced_hook_(bucket);
      } catch (...) {
        failure = std::current_exception();
      }
    }
  }
  if (step_check_) {
    if (failure) {
      step_check_->wait_quietly();
    } else {
      try {
        step_check_->verify();
      } catch (...) {
        failure = std::current_exception();
      }
    }
  }
  // A GPU's events are not done yet (reading them now would fail): collect_timings() reads them.
  exposed_pending_ = params_.device().is_cuda();
  stats_.wait_ms = exposed_pending_ ? 0.0 : exposed_wait_ms();
  if (failure) {
    wait_for_launched();  // the count of used parameters may still be in flight
    reset();
    std::rethrow_exception(failure);
  }
  // Timings: a CPU collective has finished by now; a CUDA one may still be running on its
  // stream (the host did not wait), so its timing is picked up later by last_stats().
  timed_works_ = works_;
  timed_tracer_ = tracer;
  collect_timings();
  reset();
}

double Reducer::exposed_wait_ms() const {
  double total = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    total += wait_begin_[b].elapsed_ms(wait_end_[b]);
  }
  return total;
}

void Reducer::collect_timings() {
  if (exposed_pending_ && wait_end_.back().query()) {
    stats_.wait_ms = exposed_wait_ms();
    // The GPU's backward ended when the compute stream reached finalize.
    stats_.backward_end_ms = ms_between(stats_.origin, anchor_->host_time_of(backward_end_event_));
    exposed_pending_ = false;
    // Event times are float milliseconds since the anchor: renew it every minute (this waits
    // for the compute stream once).
    if (Clock::now() - anchor_->host_time() > std::chrono::minutes(1)) {
      anchor_ = std::make_unique<ClockAnchor>(Stream::compute(params_.device()));
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
    if (timed_tracer_) {
      timed_tracer_->span(fmt::format("all-reduce bucket {}", b), TraceTrack::kCommunication,
                          timing->start, timing->end,
                          {{"elements", std::to_string(buckets_[b].numel)},
                           {"sequence", std::to_string(timed_works_[b]->sequence_number())},
                           {"hook", comm_hook_name(options_.comm_hook)}});
    }
    timed_works_[b] = nullptr;  // counted once
  }
  compute_exposed();
}

void Reducer::compute_exposed() {
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

const ReducerStats& Reducer::last_stats() {
  collect_timings();
  return stats_;
}

std::string Reducer::describe_buckets() const {
  std::string out;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<std::string> names;
    for (std::size_t slot : buckets_[b].slots) names.push_back(params_.slots()[slot].name);
    out += fmt::format("bucket {}: {} elements ({:.2f} MiB): {}\n", b, buckets_[b].numel,
                       static_cast<double>(buckets_[b].numel) * 4.0 / (1024.0 * 1024.0),
                       fmt::join(names, ", "));
  }
  return out;
}

}  // namespace nanoddp::comm
