#include "nanoddp/nn/optimizer.h"

#include "nanoddp/engine/backend.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {

namespace {

void check_lr(float lr) {
  if (!(lr > 0.0f)) fail("the learning rate must be positive, got {}", lr);
}

}  // namespace

void Optimizer::step() {
  params_.materialize_grads();
  begin_step();
  update(0, params_.numel());
}

void Optimizer::update(std::int64_t offset, std::int64_t numel) {
  NANODDP_CHECK(offset >= 0 && numel >= 0 && offset + numel <= params_.numel(),
                "optimizer update of elements [{}, {}) outside the {} parameters", offset,
                offset + numel, params_.numel());
  NANODDP_CHECK(steps_ > 0, "optimizer update() before the first begin_step()");
  if (numel > 0) update_slice(offset, numel);
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

void SGD::update_slice(std::int64_t offset, std::int64_t numel) {
  // PyTorch starts the momentum buffer from the first gradient.
  const bool first_step = steps_ == 1;
  backend_for(params_.device())
      .sgd_step(params_.values().data() + offset, params_.grads().data() + offset,
                momentum_buffer_.defined() ? momentum_buffer_.data() + offset : nullptr, numel,
                options_, first_step);
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

void AdamW::update_slice(std::int64_t offset, std::int64_t numel) {
  const kernels::AdamWHyper hyper{.lr = options_.lr,
                                  .beta1 = options_.beta1,
                                  .beta2 = options_.beta2,
                                  .eps = options_.eps,
                                  .weight_decay = options_.weight_decay,
                                  .step = steps_};
  backend_for(params_.device())
      .adamw_step(params_.values().data() + offset, params_.grads().data() + offset,
                  exp_avg_.data() + offset, exp_avg_sq_.data() + offset, numel, hyper);
}

std::vector<NamedTensor> AdamW::state() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

std::string AdamW::describe() const {
  return fmt::format("AdamW(lr={}, betas=({}, {}), eps={}, weight_decay={})", options_.lr,
                     options_.beta1, options_.beta2, options_.eps, options_.weight_decay);
}

}  // namespace nanoddp::nn
