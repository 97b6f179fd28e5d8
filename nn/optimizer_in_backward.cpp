#include "nanoddp/nn/optimizer_in_backward.h"

#include <algorithm>

#include "nanoddp/engine/backend.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/trace.h"

namespace nanoddp::nn {

OptimizerInBackward::OptimizerInBackward(Optimizer& optimizer, FlatParameters& params,
                                         const OptimizerInBackwardOptions& options)
    : optimizer_(optimizer),
      params_(params),
      updated_(params.slots().size(), false),
      nonfinite_(
          Tensor::zeros({static_cast<std::int64_t>(params.slots().size())}, params.device())) {
  alive_ = std::make_shared<OptimizerInBackward*>(this);
  if (!options.hook_parameters) return;
  for (std::size_t i = 0; i < params_.slots().size(); ++i) {
    Tensor param = params_.slots()[i].param;
    std::weak_ptr<OptimizerInBackward*> weak = alive_;
    // Autograd runs this hook after the last backward node that uses the parameter has
    // finished, so nothing in this backward pass reads the old value any more: updating it in
    // place is safe (a Linear's input gradient, which reads the weight, is computed in the same
    // node as its weight gradient).
    hooks_.push_back(param.register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (auto self = weak.lock()) (*self)->update_slot(i);
    }));
  }
}

OptimizerInBackward::~OptimizerInBackward() {
  // Leave nothing on the parameters: a new optimizer (or none) can take over.
  for (HookHandle& hook : hooks_) hook.remove_quietly();
}

void OptimizerInBackward::arm() {
  NANODDP_CHECK(!armed_, "OptimizerInBackward::arm() twice without finish()");
  std::fill(updated_.begin(), updated_.end(), false);
  nonfinite_.zero();
  optimizer_.begin_step();
  armed_ = true;
}

void OptimizerInBackward::update_slot(std::size_t slot) {
  const ParameterSlot& s = params_.slots()[slot];
  update_range(s.offset, s.numel, std::span<const std::size_t>(&slot, 1));
}

void OptimizerInBackward::update_range(std::int64_t offset, std::int64_t numel,
                                       std::span<const std::size_t> slots) {
  if (!armed_) return;
  std::int64_t covered = 0;
  for (const std::size_t slot : slots) {
    NANODDP_CHECK(slot < updated_.size(), "parameter {} of {} in update_range", slot,
                  updated_.size());
    NANODDP_CHECK(!updated_[slot], "parameter '{}' updated twice in one optimizer step",
                  params_.slots()[slot].name);
    updated_[slot] = true;
    covered += params_.slots()[slot].numel;
  }
  NANODDP_CHECK(
      slots.empty() || (params_.slots()[slots.front()].offset == offset && covered == numel),
      "update_range [{}, {}) does not match its parameters", offset, offset + numel);
  if (slots.empty()) return;
  TraceSpan span("optimizer update", TraceTrack::kCompute, params_.device());
  // Count NaN/Inf over each run of neighbouring parameters that have a gradient (the others are
  // skipped by the optimizer and their buffers hold nothing of this step).
  Backend& backend = backend_for(params_.device());
  std::size_t run_first = 0;
  std::int64_t run_offset = 0, run_numel = 0;
  auto flush = [&] {
    if (run_numel > 0) {
      backend.count_nonfinite(params_.grads().data() + run_offset, run_numel,
                              nonfinite_.data() + static_cast<std::int64_t>(run_first));
    }
    run_numel = 0;
  };
  for (const std::size_t slot : slots) {
    const ParameterSlot& s = params_.slots()[slot];
    if (!s.param.has_grad()) {
      flush();
      continue;
    }
    if (run_numel > 0 && run_offset + run_numel != s.offset) flush();
    if (run_numel == 0) {
      run_first = slot;
      run_offset = s.offset;
    }
    run_numel += s.numel;
  }
  flush();
  optimizer_.update(slots);
}

std::size_t OptimizerInBackward::finish() {
  NANODDP_CHECK(armed_, "OptimizerInBackward::finish() without arm()");
  // A parameter whose gradient came only from earlier micro-batches (not from the backward that
  // ran armed) is updated here; one without a gradient is skipped, as optimizer.step() skips it.
  std::size_t late = 0;
  for (std::size_t i = 0; i < updated_.size(); ++i) {
    if (updated_[i] || !params_.slots()[i].param.has_grad()) continue;
    update_slot(i);
    ++late;
  }
  armed_ = false;
  return late;
}

std::int64_t OptimizerInBackward::nonfinite_gradients() const {
  // Each count is exact in a float; their sum is taken in double on the host.
  double total = 0;
  for (const float count : nonfinite_.to_vector()) total += count;
  return static_cast<std::int64_t>(total);
}

}  // namespace nanoddp::nn
