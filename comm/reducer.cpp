#include "nanoddp/comm/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "nanoddp/comm/bucket_assignment.h"
#include "nanoddp/comm/zero.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/engine/trace.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {
// The gradient memory a bound bucket holds (ZeRO-2): its buffer and the bf16 hook's copy.
std::int64_t bound_bytes(const Bucket& bucket) {
  const auto bytes = [](const Tensor& t) {
    return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : std::int64_t{0};
  };
  return bytes(bucket.grads) + bytes(bucket.compressed);
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
    : params_(params), group_(std::move(group)), options_(options), timeline_(params.device()) {
  if (!params_.has_gradient_buffer()) {
    fail(
        "these parameters' flat gradient buffer is released by a ZeRO stage 2 "
        "DistributedDataParallel that still exists: destroy it before building another DDP on "
        "the same parameters");
  }
  // Cut the flat gradient buffer into buckets, in its (reverse registration) order
  // (bucket_assignment.h: the rule nanoddp-sim uses too).
  const auto& slots = params_.slots();
  std::vector<std::int64_t> numels;
  for (const auto& slot : slots) numels.push_back(slot.numel);
  std::vector<std::vector<std::size_t>> members;
  for (const BucketRange& range :
       assign_buckets(numels, options.first_bucket_mb, options.bucket_cap_mb)) {
    members.emplace_back();
    for (std::size_t i = range.first; i < range.first + range.count; ++i)
      members.back().push_back(i);
  }
  set_buckets(members);
  observing_ = options.rebuild_buckets && !options.find_unused_parameters;
  agree_order_ = [this](const std::vector<std::size_t>& observed) {
    std::vector<float> values(observed.begin(), observed.end());  // exact below 2^24
    Tensor order =
        Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}, params_.device());
    group_->broadcast(order, 0)->wait();
    std::vector<std::size_t> agreed;
    for (const float v : order.to_vector()) agreed.push_back(static_cast<std::size_t>(v));
    return agreed;
  };
  if (options.check_steps && group_->size() > 1) {
    std::vector<std::string> names;
    for (const auto& slot : slots) names.push_back(slot.name);
    step_check_ = std::make_unique<StepCheck>(group_, params_.device(), std::move(names));
  }
  if (debug_enabled(DebugLevel::kInfo)) {
    debug_log(DebugLevel::kInfo, "reducer: {} buckets (first {} MiB, then {} MiB, overlap {})\n{}",
              buckets_.size(), options.first_bucket_mb, options.bucket_cap_mb,
              options.overlap ? "on" : "off", describe_buckets());
  }

  // The autograd hooks hold a weak handle: one that outlives its Reducer does nothing.
  params_.attach();
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
  if (scatter_) {
    // The parameters go back to a flat gradient buffer (another DDP may be built on them).
    for (const nn::ParameterSlot& slot : params_.slots()) {
      Tensor param = slot.param;
      param.set_grad_source(nullptr);
    }
    // What a bound bucket holds (no_sync micro-batches, a pass cut short) goes into the new
    // buffer. A gradient that lives only in the shard (reduced, no step since) cannot: no rank
    // holds it whole; it is dropped (docs/ddp-internals.md, ZeRO).
    try {
      std::vector<char> kept(params_.slots().size(), 0);
      for (std::size_t i = 0; i < kept.size(); ++i) {
        kept[i] = bound_[bucket_of_slot_[i]] && params_.slots()[i].param.has_grad() ? 1 : 0;
      }
      std::vector<Bucket> bound;
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        if (bound_[b]) bound.push_back(buckets_[b]);
      }
      params_.restore_gradient_buffer();
      for (const Bucket& bucket : bound) {
        params_.grads().view(bucket.offset, {bucket.numel}).copy_from(bucket.grads);
      }
      for (std::size_t i = 0; i < kept.size(); ++i) {
        const nn::ParameterSlot& slot = params_.slots()[i];
        Tensor param = slot.param;
        if (kept[i]) param.set_grad(params_.grads().view(slot.offset, slot.param.shape()));
      }
    } catch (...) {  // out of memory in a destructor: the parameters stay without one
    }
  }
  params_.detach();
}

void Reducer::set_bucket_reduced_hook(BucketReducedHook hook) {
  if (zero_ != nullptr && hook) {
    fail(
        "the bucket-reduced hook (the optimizer in backward) does not combine with ZeRO: under "
        "ZeRO each rank updates its shard after backward; use zero stage 0 or no hook");
  }
  bucket_reduced_hook_ = std::move(hook);
}

void Reducer::set_zero(Zero* zero) {
  NANODDP_CHECK(!observing_ && !rebuilt_, "ZeRO needs buckets that are never rebuilt");
  if (zero != nullptr && bucket_reduced_hook_) {
    fail("ZeRO does not combine with the bucket-reduced hook (the optimizer in backward)");
  }
  zero_ = zero;
  scatter_ = zero != nullptr && zero->stage() == 2;
  if (!scatter_) return;
  // Stage 2: no flat gradient buffer; memory one bucket at a time (reducer.h, set_zero).
  NANODDP_CHECK(params_.attached() == 1,
                "ZeRO stage 2 frees the flat gradient buffer, which another Reducer still uses");
  params_.release_gradient_buffer();
  for (Bucket& bucket : buckets_) {
    bucket.grads = Tensor();
    bucket.compressed = Tensor();
  }
  bound_.assign(buckets_.size(), false);
  bound_count_ = 0;
  for (std::size_t i = 0; i < params_.slots().size(); ++i) {
    Tensor param = params_.slots()[i].param;
    std::weak_ptr<Reducer*> weak = alive_;
    param.set_grad_source([weak, i]() -> Tensor {
      if (auto self = weak.lock()) return (*self)->gradient_buffer(i);
      return Tensor();
    });
  }
}

Tensor Reducer::gradient_buffer(std::size_t slot) {
  const std::size_t b = bucket_of_slot_[slot];
  if (!bound_[b]) bind(b);
  const Bucket& bucket = buckets_[b];
  const nn::ParameterSlot& s = params_.slots()[slot];
  return bucket.grads.view(s.offset - bucket.offset, s.param.shape());
}

void Reducer::bind(std::size_t b) {
  // At most kBoundBuckets hold memory while an older one is on the wire: wait for it first.
  while (bound_count_ >= kBoundBuckets && next_to_finish_ < next_to_launch_) finish_oldest();
  Bucket& bucket = buckets_[b];
  bucket.grads = Tensor::empty({bucket.numel}, params_.device());
  if (options_.comm_hook == CommHook::kBf16) {
    bucket.compressed = Tensor::empty({bucket.numel}, params_.device(), DType::kBF16);
  }
  for (const std::size_t i : bucket.slots) {
    const nn::ParameterSlot& slot = params_.slots()[i];
    Tensor param = slot.param;
    // A parameter whose gradient lives in the shard (no zero_grad() since it was reduced)
    // accumulates from zero here, and its reduction adds to the shard, as the flat buffer
    // would add to what it holds; any other gets a stale buffer that the first write overwrites.
    const bool adds = param.has_grad();
    Tensor view = bucket.grads.view(slot.offset - bucket.offset, slot.param.shape());
    if (adds) view.zero();
    param.set_grad(view);
    if (!adds) param.zero_grad();
    zero_->set_adds(i, adds);
  }
  bound_[b] = true;
  ++bound_count_;
  zero_->gradient_memory_changed(bound_bytes(bucket));
}

void Reducer::finish_oldest() {
  // Inside backward: the compute thread waits for this bucket's reduce-scatter (the trace shows
  // it), then its chunk goes to the shard and its memory is freed. finalize skips it.
  const std::size_t b = next_to_finish_++;
  {
    TraceSpan span("wait for reduce-scatter", TraceTrack::kCompute, params_.device());
    works_[b]->wait();  // a failure fails the pass (abort() waits for the rest)
  }
  zero_->bucket_scattered(b, buckets_[b]);
  release(b);
}

void Reducer::release(std::size_t b) {
  Bucket& bucket = buckets_[b];
  for (const std::size_t i : bucket.slots) {
    Tensor param = params_.slots()[i].param;
    param.drop_grad_buffer();  // has_grad() stays: the gradient lives in the shard now
  }
  zero_->gradient_memory_changed(-bound_bytes(bucket));
  bucket.grads = Tensor();
  bucket.compressed = Tensor();
  bound_[b] = false;
  --bound_count_;
}

void Reducer::set_buckets(const std::vector<std::vector<std::size_t>>& members) {
  const auto& slots = params_.slots();
  buckets_.clear();
  pieces_.clear();
  bucket_of_slot_.assign(slots.size(), 0);
  for (std::vector<std::size_t> bucket_slots : members) {
    std::sort(bucket_slots.begin(), bucket_slots.end());
    Bucket bucket;
    for (std::size_t i : bucket_slots) {
      bucket.numel += slots[i].numel;
      bucket_of_slot_[i] = buckets_.size();
    }
    // Contiguous runs of the flat gradient buffer: one (a view, nothing copied) unless the
    // bucket was cut in an observed order that differs from the layout.
    std::vector<Bucket> runs;
    for (std::size_t i : bucket_slots) {
      if (runs.empty() || runs.back().slots.back() + 1 != i) {
        runs.push_back(Bucket{.offset = slots[i].offset});
      }
      runs.back().slots.push_back(i);
      runs.back().numel += slots[i].numel;
    }
    for (Bucket& run : runs) run.grads = params_.grads().view(run.offset, {run.numel});
    bucket.slots = std::move(bucket_slots);
    if (runs.size() == 1) {
      bucket.offset = runs[0].offset;
      bucket.grads = runs[0].grads;
      runs.clear();
    } else {
      bucket.offset = -1;
      bucket.packed = true;
      bucket.grads = Tensor::empty({bucket.numel}, params_.device());
    }
    if (options_.comm_hook == CommHook::kBf16) {
      bucket.compressed = Tensor::empty({bucket.numel}, params_.device(), DType::kBF16);
    }
    buckets_.push_back(std::move(bucket));
    pieces_.push_back(std::move(runs));
  }
  timeline_.set_bucket_count(buckets_.size());
}

void Reducer::pack(std::size_t b) {
  Bucket& bucket = buckets_[b];
  std::int64_t at = 0;
  for (const Bucket& run : pieces_[b]) {
    bucket.grads.view(at, {run.numel}).copy_from(run.grads);
    at += run.numel;
  }
}

void Reducer::unpack(std::size_t b) {
  Bucket& bucket = buckets_[b];
  std::int64_t at = 0;
  for (Bucket& run : pieces_[b]) {
    run.grads.copy_from(bucket.grads.view(at, {run.numel}));
    at += run.numel;
  }
}

void Reducer::hand_on(std::size_t b) {
  if (!buckets_[b].packed) return bucket_reduced_hook_(buckets_[b]);
  for (const Bucket& run : pieces_[b]) bucket_reduced_hook_(run);
}

std::vector<std::size_t> Reducer::observed_order() const {
  // By the number of autograd nodes run when the gradient became final; gradients finished by
  // the same node keep their layout order, so a model whose backward order is its reverse
  // registration order (an MLP) observes exactly its layout.
  std::vector<std::size_t> order(ready_node_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return ready_node_[a] < ready_node_[b]; });
  return order;
}

void Reducer::agree_on_order() {
  // Every rank takes rank 0's order (PyTorch broadcasts rank 0's bucket assignment the same
  // way): a rank whose autograd happened to finish two gradients the other way round must not
  // cut other buckets, or its collectives would pair with the others' different ones.
  std::vector<std::size_t> order = agree_order_(observed_order());
  std::vector<bool> seen(params_.slots().size(), false);
  bool valid = order.size() == seen.size();
  for (const std::size_t i : order) {
    valid = valid && i < seen.size() && !seen[i];
    if (valid) seen[i] = true;
  }
  if (!valid) {
    fail("rebuild_buckets: rank 0's gradient order is not a permutation of the {} parameters",
         seen.size());
  }
  agreed_order_ = std::move(order);
}

void Reducer::rebuild_buckets() {
  std::vector<std::int64_t> numels;
  for (std::size_t i : agreed_order_) numels.push_back(params_.slots()[i].numel);
  std::vector<std::vector<std::size_t>> members;
  for (const BucketRange& range :
       assign_buckets(numels, options_.first_bucket_mb, options_.bucket_cap_mb)) {
    members.emplace_back(
        agreed_order_.begin() + static_cast<std::ptrdiff_t>(range.first),
        agreed_order_.begin() + static_cast<std::ptrdiff_t>(range.first + range.count));
  }
  agreed_order_.clear();
  rebuilt_ = true;
  bool same = members.size() == buckets_.size();
  for (std::size_t b = 0; same && b < members.size(); ++b) {
    std::sort(members[b].begin(), members[b].end());
    same = members[b] == buckets_[b].slots;
  }
  if (same) return;  // the layout already was the observed order
  set_buckets(members);
  debug_log(DebugLevel::kInfo, "reducer: buckets rebuilt in the observed gradient order\n{}",
            describe_buckets());
}

void Reducer::reset() {
  in_backward_ = false;
  finalizing_ = false;
  pending_.assign(buckets_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = static_cast<int>(buckets_[b].slots.size());
  }
  slot_ready_.assign(params_.slots().size(), false);
  used_.assign(params_.slots().size(), false);
  marked_unused_.assign(params_.slots().size(), false);
  next_to_launch_ = 0;
  next_to_finish_ = 0;
  works_.assign(buckets_.size(), nullptr);
  used_work_ = nullptr;
  missing_.clear();
}

void Reducer::autograd_hook(std::size_t slot) {
  // Only the backward that follows DDP's forward reduces (PyTorch's expect_autograd_hooks_):
  // a graph built by calling the module directly, or under no_sync, accumulates locally.
  if (!expect_autograd_hooks_) return;
  if (in_backward_ && current_backward_pass() != backward_pass_) {
    // The previous pass died before its end and nobody told us (abort() below normally runs):
    // drop its state and start over with this pass.
    abort();
  }
  if (!in_backward_) {
    if (!agreed_order_.empty()) {
      rebuild_buckets();
      reset();
    }
    if (observing_) ready_node_.assign(params_.slots().size(), 0);
    backward_pass_ = current_backward_pass();
    in_backward_ = true;
    timeline_.start_pass(ReducerTimeline::Clock::now());
    // Runs once autograd has finished the whole pass (or, if it throws, abort()).
    queue_backward_callback([this] { finalize_backward(); },
                            [this] {
                              expect_autograd_hooks_ = false;  // the failed pass consumed it
                              abort();
                            });
  }
  // find_unused_parameters: what the forward's output does not reach gets no gradient; its
  // bucket must not wait for it.
  for (const std::size_t i : unused_after_forward_) mark_unused_ready(i);
  unused_after_forward_.clear();
  mark_variable_ready(slot);
}

void Reducer::prepare_for_backward(std::span<const Tensor> outputs) {
  // PyTorch's rule: a forward under no_sync or without gradients arms nothing, and leaves an
  // earlier forward's arming as it was.
  if (!sync_ || !NoGrad::grad_enabled()) return;
  expect_autograd_hooks_ = true;
  unused_after_forward_.clear();
  if (!options_.find_unused_parameters) return;
  const auto reached = reachable_leaves(outputs);
  for (std::size_t i = 0; i < params_.slots().size(); ++i) {
    if (!reached.contains(params_.slots()[i].param.impl())) unused_after_forward_.push_back(i);
  }
}

void Reducer::mark_variable_ready(std::size_t slot) {
  if (marked_unused_[slot]) {
    fail(
        "parameter '{}' received a gradient although DDP's forward output does not depend on "
        "it (find_unused_parameters marked it unused): compute the loss from the output of "
        "DistributedDataParallel::forward only",
        params_.slots()[slot].name);
  }
  if (slot_ready_[slot]) {
    fail(
        "parameter '{}' received its gradient twice in one backward pass; this Reducer "
        "expects each parameter to be finished once per pass",
        params_.slots()[slot].name);
  }
  slot_ready_[slot] = true;
  used_[slot] = true;
  if (observing_) ready_node_[slot] = backward_nodes_run();
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
  if (scatter_) {
    // ZeRO-2: this rank keeps only the average of its own chunk (zero.h).
    works_[b] = zero_->reduce_scatter(b, bucket);
    return;
  }
  if (bucket.packed) pack(b);
  if (options_.comm_hook == CommHook::kBf16) {
    backend_for(bucket.grads.device())
        .f32_to_bf16(bucket.grads.data(), static_cast<std::uint16_t*>(bucket.compressed.raw_data()),
                     bucket.numel);
    works_[b] = average(bucket.compressed);
  } else {
    works_[b] = average(bucket.grads);
  }
}

std::shared_ptr<Work> Reducer::average(Tensor& tensor) {
  // A world of one: the average of one rank's gradients is those gradients. No collective, so
  // DDP over one rank costs what no DDP costs (the comm hook's rounding still applies: the
  // gradients are what a larger world would have reduced). PyTorch still runs the all-reduce.
  if (skips_collectives()) return completed_work("allreduce (a world of one)");
  return group_->allreduce(tensor, ReduceOp::kAvg);
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
    if (step_check_) {
      // The other ranks wait for these buckets: reduce them with zeros and report through the
      // step check, which fails every rank at once naming the parameters (the others used to
      // wait in this all-reduce until their timeout). finalize throws after the check.
      for (std::size_t i = 0; i < slot_ready_.size(); ++i) {
        if (!slot_ready_[i]) {
          missing_.push_back(i);
          mark_unused_ready(i);
        }
      }
      return;
    }
    // Let the buckets already in flight finish (the other ranks launched them too) before
    // reporting, so no collective is left half done.
    wait_for_launched();
    timeline_.end_failed_pass();
    reset();
    fail("{}", missing_gradients_message(unused));
  }
  for (std::size_t i = 0; i < slot_ready_.size(); ++i) {
    if (!slot_ready_[i]) mark_unused_ready(i);
  }
}

std::string Reducer::missing_gradients_message(const std::vector<std::string>& names) const {
  return fmt::format(
      "{} parameter(s) received no gradient in this backward pass, so their buckets could "
      "never be reduced: {}. Make every parameter take part in the loss, or construct "
      "DistributedDataParallel with find_unused_parameters = true.",
      names.size(), fmt::join(names, ", "));
}

void Reducer::mark_unused_ready(std::size_t i) {
  // Ready so its bucket is reduced with the others (another rank may have used it). Its gradient
  // on this rank is what it holds: the sum of earlier no_sync micro-batches that did use it
  // (kept, as PyTorch does), or, when nothing wrote it since zero_grad(), zero (the buffer's
  // stale contents must not be reduced).
  const nn::ParameterSlot& slot = params_.slots()[i];
  // Under ZeRO-2 the bucket gets its memory now if no gradient of it came (its reduction reads
  // it); a gradient averaged by an earlier pass lives on in the shard and counts as used.
  if (scatter_) gradient_buffer(i);
  used_[i] = slot.param.has_grad();
  if (!slot.param.has_grad()) {
    Tensor grad =
        scatter_ ? gradient_buffer(i) : params_.grads().view(slot.offset, slot.param.shape());
    grad.zero();
    Tensor param = slot.param;
    param.set_grad(grad);
  }
  slot_ready_[i] = true;
  marked_unused_[i] = true;
  const std::size_t b = bucket_of_slot_[i];
  if (--pending_[b] == 0) {
    timeline_.bucket_ready(b, ReducerTimeline::Clock::now());
    if (options_.overlap && !finalizing_) launch_ready_buckets();
  }
}

void Reducer::launch_used_map(const std::vector<float>& used) {
  used_map_ = Tensor::from_vector(used, {static_cast<std::int64_t>(used.size())}, params_.device());
  used_work_ = skips_collectives() ? completed_work("allreduce (a world of one)")
                                   : group_->allreduce(used_map_, ReduceOp::kSum);
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
  expect_autograd_hooks_ = false;  // the next backward reduces only after another DDP forward
  timeline_.backward_ended();
  finalizing_ = true;
  launch_rest();
  std::exception_ptr failure = wait_for_buckets();
  failure = end_of_pass_checks(failure);
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

void Reducer::launch_rest() {
  handle_unused();
  // Which parameters this rank used: got a gradient since zero_grad(), in this pass or in
  // no_sync ones (not the zero an unused one was given to reduce).
  std::vector<float> used;
  if (options_.find_unused_parameters) {
    for (std::size_t i = 0; i < used_.size(); ++i) used.push_back(used_[i] ? 1.0f : 0.0f);
  }
  launch_ready_buckets();  // every bucket not launched during backward
  NANODDP_CHECK(next_to_launch_ == buckets_.size(), "finalize: bucket {} was never launched",
                next_to_launch_);
  // After every bucket, so that every rank issues the collectives in the same order.
  if (options_.find_unused_parameters) launch_used_map(used);
  // Right behind the last bucket (and the used-parameter count): one small op's latency.
  ++synchronized_passes_;
  if (step_check_) step_check_->launch(synchronized_passes_, forward_calls_, missing_);
}

std::exception_ptr Reducer::wait_for_buckets() {
  // The parameters unused on every rank are known before the first bucket-reduced hook (the
  // optimizer in backward must skip them), or else before finalize returns.
  const std::size_t resolve_after = bucket_reduced_hook_ ? 0 : buckets_.size() - 1;
  // In order, each handed on as soon as its average is in place. After a failure the gradients
  // are garbage: wait for the rest (never leave a collective running on buffers we stop
  // tracking), but run nothing on them.
  std::exception_ptr failure;
  timeline_.begin_waits(/*per_bucket=*/static_cast<bool>(bucket_reduced_hook_),
                        scatter_ ? "reduce-scatter" : "all-reduce");
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
    bucket_reduced(b);
    if (bucket_reduced_hook_ && missing_.empty()) {  // nothing is applied in a failing pass
      try {
        hand_on(b);
      } catch (...) {
        failure = std::current_exception();
      }
    }
  }
  return failure;
}

void Reducer::bucket_reduced(std::size_t b) {
  // all_reduce_bucket's preparation undone: back to float32, back into the flat buffer.
  Bucket& bucket = buckets_[b];
  if (scatter_) {
    if (b < next_to_finish_) return;  // released during backward already (finish_oldest)
    zero_->bucket_scattered(b, bucket);
    return release(b);
  }
  if (options_.comm_hook == CommHook::kBf16) {
    backend_for(bucket.grads.device())
        .bf16_to_f32(static_cast<const std::uint16_t*>(bucket.compressed.raw_data()),
                     bucket.grads.data(), bucket.numel);
  }
  if (bucket.packed) unpack(b);
}

std::exception_ptr Reducer::end_of_pass_checks(std::exception_ptr failure) {
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
  // Parameters without a gradient on this rank alone fail the check above on every rank; on
  // every rank alike they pass it, and each rank reports its own.
  if (!failure && !missing_.empty()) {
    std::vector<std::string> names;
    for (const std::size_t i : missing_) names.push_back(params_.slots()[i].name);
    failure = std::make_exception_ptr(Error(missing_gradients_message(names)));
  }
  // The first synchronized pass's gradient order, agreed now (even after a failure: every rank
  // takes part) and applied when the next synchronized pass starts.
  if (observing_) {
    observing_ = false;
    try {
      agree_on_order();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  return failure;
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
