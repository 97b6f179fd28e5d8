// Step health: every rank's loss and whether the averaged gradients are finite, exchanged in one
// small all-reduce per step and read by the host only where it must; the NaN/Inf policy.
#include "trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/trace.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/checkpoint.h"
#include "trainer_internal.h"

namespace nanoddp::train {

// The NaN/Inf policy for a read health (the first bad kept step's, else this step's): the
// optimizer step, or a skipped step, or the end of the run. Returns the loss averaged over the
// ranks.
float Trainer::apply_health(const StepHealth& health, std::int64_t step) {
  std::vector<int> bad_ranks;
  for (int r = 0; r < world_size_; ++r) {
    if (!std::isfinite(health.losses[static_cast<std::size_t>(r)])) bad_ranks.push_back(r);
  }
  double loss_sum_all = 0;
  for (const float l : health.losses) loss_sum_all += l;
  const auto loss = static_cast<float>(loss_sum_all / world_size_);
  if (bad_ranks.empty() && health.grads_finite) {
    if (!optimizer_in_backward_) {
      TraceSpan span("optimizer step", TraceTrack::kCompute, device_);
      optimizer_step();
    }
  } else {
    // "nan", not "-nan": the sign of a NaN means nothing.
    const auto text = [](float v) {
      return std::isnan(v) ? std::string("nan") : fmt::format("{}", v);
    };
    const std::string what =
        !bad_ranks.empty()
            ? fmt::format("the loss became {} at step {} on rank{} {}",
                          text(health.losses[static_cast<std::size_t>(bad_ranks.front())]),
                          health.step, bad_ranks.size() > 1 ? "s" : "", fmt::join(bad_ranks, ", "))
            : fmt::format(
                  "the gradients became non-finite at step {} (averaged over the ranks; "
                  "the loss was finite on every rank): {}{}",
                  health.step, describe_nonfinite_grads(),
                  health.step == step ? "" : fmt::format(" (counted at step {})", step));
    if (optimizer_in_backward_) {
      fail(
          "{} (with --optimizer-in-backward this step's update is already applied). Lower --lr "
          "or check the data.",
          what);
    }
    if (!o_.skip_nonfinite) {
      const std::string message = fmt::format(
          "{}. Lower --lr, check the data, or pass --skip-nonfinite to skip such steps.", what);
      // Where the loss is finite here, the failure is the first bad rank's: a launcher names
      // that rank as the one that failed first, not whichever rank exits first.
      if (!bad_ranks.empty() &&
          std::find(bad_ranks.begin(), bad_ranks.end(), rank_) == bad_ranks.end()) {
        throw comm::PeerFailedError(bad_ranks.front(), message);
      }
      fail("{}", message);
    }
    ++skipped_steps_;
    if (is_main()) {
      fmt::print(stderr,
                 "nanoddp-train: warning: {}: skipped this optimizer step on every rank "
                 "({} skipped so far)\n",
                 what, skipped_steps_);
      std::fflush(stderr);
    }
  }
  return loss;
}

Tensor Trainer::gather_health(const Tensor& local_loss, const Tensor& local_correct) {
  params_->zero_missing_grads();  // a parameter without a gradient this step counts as zero
  // [loss of rank 0, ..., loss of rank W-1, non-finite gradient values on rank 0, ...], built
  // on the device: each rank writes its own entries (the loss copied, the count written by the
  // kernel), and the sum hands everyone all of them (x + 0 keeps NaN and Inf). No host read
  // here: read_health reads it, with the kept rows of earlier steps, in one copy. --task
  // classify adds a third block, each rank's correct predictions, for the accuracy: the same
  // all-reduce, so every rank reads the same figure without a collective of its own.
  const auto w = static_cast<std::size_t>(distributed_ ? world_size_ : 1);
  const auto me = static_cast<std::size_t>(distributed_ ? rank_ : 0);
  const std::size_t blocks = classify() ? 3 : 2;
  Tensor values = Tensor::zeros({static_cast<std::int64_t>(blocks * w)}, device_);
  Backend& backend = backend_for(device_);
  backend.copy(values.data() + me, local_loss.data(), sizeof(float));
  if (classify()) backend.copy(values.data() + 2 * w + me, local_correct.data(), sizeof(float));
  if (optimizer_in_backward_) {
    // The gradients were counted as they were applied (a host read of its own).
    backend.fill(values.data() + w + me, 1,
                 static_cast<float>(optimizer_in_backward_->nonfinite_gradients()));
  } else {
    // Under --zero 2 this rank holds only its shard of the averaged gradients: the all-reduce
    // below sums the ranks' counts into the count of the whole.
    const Tensor grads =
        ddp_ && ddp_->zero() != nullptr ? ddp_->zero()->averaged_gradients() : params_->grads();
    backend.count_nonfinite(grads.data(), grads.numel(), values.data() + w + me);
  }
  if (distributed_ && world_size_ > 1) {  // a world of one holds every entry already
    // Traced, so that the timeline names this per-step collective instead of showing a gap.
    TraceSpan span("health all-reduce", TraceTrack::kCommunication, device_);
    dist_->group->allreduce(values, comm::ReduceOp::kSum)->wait();
  }
  return values;
}

bool Trainer::is_log_step(std::int64_t step) const {
  return step % o_.log_every == 0 || step == steps_ || step == start_step_ + 1;
}

// The host reads the health where it needs it: a logged step (its loss is printed), a
// checkpoint (nothing poisoned is saved), every step under --skip-nonfinite (the step is skipped
// or taken on the spot) and --optimizer-in-backward (its NaN/Inf count is a host read anyway),
// and when kKeptHealthRows steps are waiting.
bool Trainer::reads_health_at(std::int64_t step) const {
  return o_.skip_nonfinite || optimizer_in_backward_ != nullptr || is_log_step(step) ||
         (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) ||
         static_cast<std::int64_t>(unread_steps_.size()) + 1 >= kKeptHealthRows;
}

void Trainer::keep_health(const Tensor& values, std::int64_t step) {
  const std::int64_t width = values.numel();
  if (!health_rows_.defined()) health_rows_ = Tensor::empty({kKeptHealthRows * width}, device_);
  health_rows_.view(static_cast<std::int64_t>(unread_steps_.size()) * width, {width})
      .copy_from(values);
  unread_steps_.push_back(step);
}

Trainer::StepHealth Trainer::read_health(const Tensor& values, std::int64_t step) {
  const std::int64_t width = values.numel();
  const auto kept = static_cast<std::int64_t>(unread_steps_.size());
  std::vector<float> host;  // the kept rows, then this step's: the one host synchronization
  if (kept == 0) {
    host = values.to_vector();
  } else {
    health_rows_.view(kept * width, {width}).copy_from(values);
    host = health_rows_.view(0, {(kept + 1) * width}).to_vector();
  }
  std::vector<std::int64_t> steps = std::move(unread_steps_);
  unread_steps_.clear();
  steps.push_back(step);
  const std::size_t blocks = classify() ? 3 : 2;
  const auto w = static_cast<std::size_t>(width) / blocks;
  if (classify()) {
    // Every read row counts, including rows after a bad one; a row whose loss is not finite on
    // some rank predicted from NaN/Inf logits: its rows are left out of the accuracy.
    for (std::size_t row = 0; row < steps.size(); ++row) {
      const auto losses = host.begin() + static_cast<std::ptrdiff_t>(row * blocks * w);
      const bool finite = std::all_of(losses, losses + static_cast<std::ptrdiff_t>(w),
                                      [](float l) { return std::isfinite(l); });
      if (!finite) {
        unlogged_nonfinite_samples_ += world_size_ * rows_in_step(steps[row]);
        continue;
      }
      const auto correct = losses + static_cast<std::ptrdiff_t>(2 * w);
      for (std::size_t r = 0; r < w; ++r)
        unlogged_correct_ += correct[static_cast<std::ptrdiff_t>(r)];
    }
  }
  StepHealth health;
  for (std::size_t row = 0; row < steps.size(); ++row) {
    const auto first = host.begin() + static_cast<std::ptrdiff_t>(row * blocks * w);
    health.step = steps[row];
    health.losses.assign(first, first + static_cast<std::ptrdiff_t>(w));
    health.grads_finite = true;
    for (std::size_t r = 0; r < w; ++r) health.grads_finite &= first[w + r] == 0.0f;
    bool finite = health.grads_finite;
    for (const float l : health.losses) finite &= std::isfinite(l);
    if (!finite) break;  // the first bad step is the one to report
  }
  return health;
}

// Which parameters hold the NaN/Inf values, for the error message (a rare path: one count per
// parameter). After the all-reduce the gradients are the same on every rank.
std::string Trainer::describe_nonfinite_grads() const {
  if (ddp_ && ddp_->zero() != nullptr && ddp_->zero()->stage() == 2) {
    // No rank holds the whole averaged gradient, so no per-parameter count.
    return fmt::format(
        "{} NaN/Inf value(s) in rank {}'s shard of the averaged gradients (--zero 2)",
        count_nonfinite(ddp_->zero()->averaged_gradients()), rank_);
  }
  std::vector<std::string> parts;
  for (const nn::ParameterSlot& slot : params_->slots()) {
    if (!slot.param.has_grad()) continue;
    const std::int64_t bad = count_nonfinite(slot.param.grad());
    if (bad > 0) parts.push_back(fmt::format("{} has {} of {}", slot.name, bad, slot.numel));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace nanoddp::train
