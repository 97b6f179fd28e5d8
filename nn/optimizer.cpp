#include "nanoddp/nn/optimizer.h"

#include <algorithm>

#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {

namespace {

void check_lr(float lr) {
  if (!(lr > 0.0f)) fail("the learning rate must be positive, got {}", lr);
}

}  // namespace

Optimizer::Optimizer(FlatParameters& params)
    : params_(params), param_steps_(params.slots().size(), 0), all_slots_(params.slots().size()) {
  for (std::size_t i = 0; i < all_slots_.size(); ++i) all_slots_[i] = i;
  shard_.ranges = {{.offset = 0, .numel = params.numel(), .local = 0}};
  shard_.numel = params.numel();
}

std::int64_t Optimizer::state_bytes() const {
  std::int64_t bytes = 0;
  for (const NamedTensor& s : state()) bytes += static_cast<std::int64_t>(s.tensor.nbytes());
  return bytes;
}

void Optimizer::shard(OptimizerShard shard) {
  if (sharded_) {
    fail(
        "this optimizer is sharded already, by a ZeRO DistributedDataParallel (perhaps one that "
        "is gone: a sharded optimizer stays sharded). Build a new optimizer for the new DDP, "
        "from a checkpoint to keep its state");
  }
  std::int64_t end = 0;
  for (const ShardRange& r : shard.ranges) {
    NANODDP_CHECK(r.numel >= 0 && r.offset >= end && r.offset + r.numel <= params_.numel() &&
                      r.local >= 0 && r.local + r.numel <= shard.numel,
                  "optimizer shard range [{}, +{}) at {} does not fit", r.offset, r.numel, r.local);
    end = r.offset + r.numel;
  }
  NANODDP_CHECK(!shard.grads.defined() || shard.grads.numel() >= shard.numel,
                "optimizer shard gradients hold {} elements, the shard {}", shard.grads.numel(),
                shard.numel);
  for (Tensor* state : mutable_state()) {
    if (!state->defined()) continue;
    Tensor part = Tensor::zeros({shard.numel}, params_.device());
    for (const ShardRange& r : shard.ranges) {
      if (r.numel > 0) part.view(r.local, {r.numel}).copy_from(state->view(r.offset, {r.numel}));
    }
    *state = part;
  }
  shard_ = std::move(shard);
  sharded_ = true;
}

void Optimizer::step() {
  if (sharded_) {
    // Called by a training loop written for DDP: it would update this rank's share alone, and
    // the ranks would drift apart with nothing to notice it.
    fail(
        "Optimizer::step() on a ZeRO-sharded optimizer: it updates only this rank's share of the "
        "parameters. Call DistributedDataParallel::zero()->step(), which updates the share and "
        "all-gathers the parameters on every rank");
  }
  // The update writes the parameters through raw pointers, which no access observer sees: said
  // first (a second optimizer stepping beside ZeRO's must not write into gathers in flight).
  notify_tensor_access(params_.values(), /*before=*/true);
  step_shard();
}

void Optimizer::step_shard() {
  begin_step();
  update(all_slots_);
}

void Optimizer::update(std::span<const std::size_t> slots) {
  NANODDP_CHECK(steps_ > 0, "optimizer update() before the first begin_step()");
  if (!params_.current()) params_.require_current(describe().c_str());
  const std::vector<ParameterSlot>& all = params_.slots();
  // Runs of parameters that are neighbours in the flat buffers, all with a gradient and at the
  // same step, go to one kernel: with every parameter used, the whole model is one run.
  std::int64_t run_offset = 0, run_numel = 0, run_step = 0;
  // Each run is cut to the shard's ranges (unsharded: the one range of the whole buffer).
  auto flush = [&] {
    for (const ShardRange& r : shard_.ranges) {
      const std::int64_t from = std::max(run_offset, r.offset);
      const std::int64_t to = std::min(run_offset + run_numel, r.offset + r.numel);
      if (from < to) update_slice(from, r.local + (from - r.offset), to - from, run_step);
    }
    run_numel = 0;
  };
  for (const std::size_t i : slots) {
    NANODDP_CHECK(i < all.size(), "optimizer update of parameter {}, but there are {}", i,
                  all.size());
    const ParameterSlot& slot = all[i];
    // PyTorch: .grad is None, the parameter is skipped. (Under ZeRO-2 has_grad() holds for a
    // gradient that lives in the shard, its buffer gone.)
    if (!slot.param.has_grad()) continue;
    // Written in place through the flat buffer: a forward that saved it before this step cannot
    // be backpropagated any more (engine/autograd.h, SavedTensor).
    slot.param.increment_version();
    const std::int64_t step = ++param_steps_[i];
    if (run_numel > 0 && (run_offset + run_numel != slot.offset || run_step != step)) flush();
    if (run_numel == 0) {
      run_offset = slot.offset;
      run_step = step;
    }
    run_numel += slot.numel;
  }
  flush();
}

void Optimizer::set_steps(std::int64_t steps, const std::vector<std::int64_t>& param_steps) {
  if (!param_steps.empty() && param_steps.size() != param_steps_.size()) {
    fail("optimizer state has step counts for {} parameters, but the model has {}",
         param_steps.size(), param_steps_.size());
  }
  steps_ = steps;
  if (param_steps.empty()) {
    std::fill(param_steps_.begin(), param_steps_.end(), steps);
  } else {
    param_steps_ = param_steps;
  }
}

SGD::SGD(FlatParameters& params, const SgdOptions& options) : Optimizer(params), options_(options) {
  check_lr(options.lr);
  if (options.momentum < 0.0f) fail("SGD momentum must be >= 0, got {}", options.momentum);
  if (options.weight_decay < 0.0f) {
    fail("SGD weight decay must be >= 0, got {}", options.weight_decay);
  }
  if (options.nesterov && (options.momentum <= 0.0f || options.dampening != 0.0f)) {
    fail("Nesterov momentum requires a momentum > 0 and zero dampening");
  }
  if (options.momentum != 0.0f) momentum_buffer_ = Tensor::zeros({params.numel()}, params.device());
}

void SGD::update_slice(std::int64_t offset, std::int64_t local, std::int64_t numel,
                       std::int64_t step) {
  // PyTorch starts the momentum buffer from the parameter's first gradient.
  const bool first_step = step == 1;
  backend_for(params_.device())
      .sgd_step(params_.values().data() + offset, grad_at(offset, local),
                momentum_buffer_.defined() ? momentum_buffer_.data() + local : nullptr, numel,
                options_, first_step);
}

std::vector<Tensor*> SGD::mutable_state() {
  return {&momentum_buffer_};
}

std::vector<NamedTensor> SGD::state() const {
  if (!momentum_buffer_.defined()) return {};
  return {{"momentum_buffer", momentum_buffer_}};
}

std::string SGD::describe() const {
  return fmt::format("SGD(lr={}, momentum={}, dampening={}, weight_decay={}, nesterov={})",
                     options_.lr, options_.momentum, options_.dampening, options_.weight_decay,
                     options_.nesterov);
}

AdamW::AdamW(FlatParameters& params, const AdamWOptions& options)
    : Optimizer(params), options_(options) {
  check_lr(options.lr);
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f &&
        options.beta2 < 1.0f)) {
    fail("AdamW betas must lie in [0, 1), got ({}, {})", options.beta1, options.beta2);
  }
  if (options.weight_decay < 0.0f) {
    fail("AdamW weight decay must be >= 0, got {}", options.weight_decay);
  }
  exp_avg_ = Tensor::zeros({params.numel()}, params.device());
  exp_avg_sq_ = Tensor::zeros({params.numel()}, params.device());
}

void AdamW::update_slice(std::int64_t offset, std::int64_t local, std::int64_t numel,
                         std::int64_t step) {
  const kernels::AdamWHyper hyper{.lr = options_.lr,
                                  .beta1 = options_.beta1,
                                  .beta2 = options_.beta2,
                                  .eps = options_.eps,
                                  .weight_decay = options_.weight_decay,
                                  .step = step};
  backend_for(params_.device())
      .adamw_step(params_.values().data() + offset, grad_at(offset, local), exp_avg_.data() + local,
                  exp_avg_sq_.data() + local, numel, hyper);
}

std::vector<Tensor*> AdamW::mutable_state() {
  return {&exp_avg_, &exp_avg_sq_};
}

std::vector<NamedTensor> AdamW::state() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

std::string AdamW::describe() const {
  return fmt::format("AdamW(lr={}, betas=({}, {}), eps={}, weight_decay={})", options_.lr,
                     options_.beta1, options_.beta2, options_.eps, options_.weight_decay);
}

}  // namespace nanoddp::nn
