#include "nanoddp/comm/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include "nanoddp/comm/bucket_assignment.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

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
    : params_(params), group_(std::move(group)), options_(options), timeline_(params.device()) {
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
  for (Bucket& bucket : buckets_) {
    bucket.grads = params_.grads().view(bucket.offset, {bucket.numel});
    if (options.comm_hook == CommHook::kBf16) {
      bucket.compressed = Tensor::empty({bucket.numel}, params_.device(), DType::kBF16);
    }
  }
  timeline_.set_bucket_count(buckets_.size());
  if (options.check_steps && group_->size() > 1) {
    step_check_ = std::make_unique<StepCheck>(group_, params_.device());
  }
  if (debug_enabled(DebugLevel::kInfo)) {
    debug_log(DebugLevel::kInfo, "reducer: {} buckets (first {} MiB, then {} MiB, overlap {})\n{}",
              buckets_.size(), options.first_bucket_mb, options.bucket_cap_mb,
              options.overlap ? "on" : "off", describe_buckets());
  }

  // The autograd hooks hold a weak handle: one that outlives its Reducer does nothing.
  alive_ = std::make_shared<Reducer*>(this);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    Tensor param = slots[i].param;
    std::weak_ptr<Reducer*> weak = alive_;
    autograd_hooks_.push_back(param.register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (auto self = weak.lock()) (*self)->autograd_hook(i);
    }));
  }
  reset();
}

Reducer::~Reducer() {
  // Never leave a collective running on buffers we are about to stop tracking, nor a hook on
  // the parameters (a rebuilt Reducer registers its own).
  wait_for_launched();
  for (HookHandle& hook : autograd_hooks_) hook.remove_quietly();
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

void Reducer::autograd_hook(std::size_t slot) {
  if (!sync_) return;  // no_sync: the gradient just accumulates locally
  if (in_backward_ && current_backward_pass() != backward_pass_) {
    // The previous pass died before its end and nobody told us (abort() below normally runs):
    // drop its state and start over with this pass.
    abort();
  }
  if (!in_backward_) {
    backward_pass_ = current_backward_pass();
    in_backward_ = true;
    timeline_.start_pass(ReducerTimeline::Clock::now());
    // Runs once autograd has finished the whole pass (or, if it throws, abort()).
    queue_backward_callback([this] { finalize_backward(); }, [this] { abort(); });
  }
  mark_variable_ready(slot);
}

void Reducer::mark_variable_ready(std::size_t slot) {
  if (slot_ready_[slot]) {
    fail(
        "parameter '{}' received its gradient twice in one backward pass; this Reducer "
        "expects each parameter to be finished once per pass",
        params_.slots()[slot].name);
  }
  slot_ready_[slot] = true;
  const auto now = ReducerTimeline::Clock::now();
  timeline_.gradient_ready(now);
  const std::size_t b = bucket_of_slot_[slot];
  if (--pending_[b] == 0) {
    timeline_.bucket_ready(b, now);
    if (options_.overlap) launch_ready_buckets();
  }
}

void Reducer::launch_ready_buckets() {
  // Strictly in index order: bucket b+1 waits for bucket b even when it is ready first.
  while (next_to_launch_ < buckets_.size() && pending_[next_to_launch_] == 0) {
    all_reduce_bucket(next_to_launch_++);
  }
}

void Reducer::all_reduce_bucket(std::size_t b) {
  Bucket& bucket = buckets_[b];
  timeline_.bucket_launched(b, bucket.numel, finalizing_);
  if (options_.comm_hook == CommHook::kBf16) {
    backend_for(bucket.grads.device())
        .f32_to_bf16(bucket.grads.data(), static_cast<std::uint16_t*>(bucket.compressed.raw_data()),
                     bucket.numel);
    works_[b] = group_->allreduce(bucket.compressed, ReduceOp::kAvg);
  } else {
    works_[b] = group_->allreduce(bucket.grads, ReduceOp::kAvg);
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
  timeline_.end_failed_pass();
  reset();
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
    timeline_.end_failed_pass();
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
    if (--pending_[b] == 0) timeline_.bucket_ready(b, ReducerTimeline::Clock::now());
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

void Reducer::finalize_backward() {
  timeline_.backward_ended();
  finalizing_ = true;
  // Which parameters this rank used (got a gradient since zero_grad(), in this pass or in
  // no_sync ones), before handle_unused() gives the others a zero gradient to reduce.
  std::vector<float> used;
  if (options_.find_unused_parameters) {
    for (std::size_t i = 0; i < slot_ready_.size(); ++i) {
      used.push_back(slot_ready_[i] || params_.slots()[i].param.has_grad() ? 1.0f : 0.0f);
    }
  }
  handle_unused();
  launch_ready_buckets();  // what is left
  NANODDP_CHECK(next_to_launch_ == buckets_.size(), "finalize: bucket {} was never launched",
                next_to_launch_);
  // After every bucket, so that every rank issues the collectives in the same order.
  if (options_.find_unused_parameters) launch_used_map(used);
  // Right behind the last bucket (and the used-parameter count): one small op's latency.
  ++synchronized_passes_;
  if (step_check_) step_check_->launch(synchronized_passes_, forward_calls_);
  // The parameters unused on every rank are known before the first bucket-reduced hook (the
  // optimizer in backward must skip them), or else before finalize returns.
  const std::size_t resolve_after = bucket_reduced_hook_ ? 0 : buckets_.size() - 1;

  // Wait for each bucket in order, and hand it on as soon as its average is in place. After a
  // failure the gradients are garbage: wait for the rest (never leave a collective running on
  // buffers we stop tracking), but run nothing on them.
  std::exception_ptr failure;
  timeline_.begin_waits(/*per_bucket=*/static_cast<bool>(bucket_reduced_hook_));
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    timeline_.before_wait(b);
    try {
      works_[b]->wait();
      if (b == resolve_after) resolve_unused();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    timeline_.after_wait(b);
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
  if (failure) {
    wait_for_launched();  // the count of used parameters may still be in flight
    timeline_.end_failed_pass();
    reset();
    std::rethrow_exception(failure);
  }
  std::vector<std::int64_t> numels;
  for (const Bucket& bucket : buckets_) numels.push_back(bucket.numel);
  timeline_.end_pass(works_, std::move(numels), comm_hook_name(options_.comm_hook));
  reset();
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
