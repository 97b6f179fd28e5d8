#include "nanoddp/nn/flat_parameters.h"

#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {

FlatParameters::FlatParameters(const Module& module, Device device) {
  std::vector<NamedTensor> params = module.named_parameters();
  if (params.empty()) fail("the model has no parameters to train");
  std::int64_t total = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (it->tensor.dtype() != DType::kF32) {
      fail("parameter '{}' is {}; flat parameter buffers hold float32", it->name,
           dtype_name(it->tensor.dtype()));
    }
    slots_.push_back(
        {.name = it->name, .param = it->tensor, .offset = total, .numel = it->tensor.numel()});
    total += it->tensor.numel();
  }
  values_ = Tensor::empty({total}, device);
  const NoGrad no_grad;  // moving the parameters' values is no step of the model's function
  for (ParameterSlot& slot : slots_) {
    Tensor value = values_.view(slot.offset, slot.param.shape());
    value.copy_from(slot.param);
    slot.param.set_data(value);
    slot.param.set_name(slot.name);
  }
  restore_gradient_buffer();
}

bool FlatParameters::current() const {
  for (const ParameterSlot& slot : slots_) {
    if (slot.param.storage() != values_.storage() ||
        slot.param.storage_offset() != values_.storage_offset() + slot.offset) {
      return false;
    }
  }
  return true;
}

void FlatParameters::require_current(const char* user) const {
  for (const ParameterSlot& slot : slots_) {
    if (slot.param.storage() != values_.storage() ||
        slot.param.storage_offset() != values_.storage_offset() + slot.offset) {
      fail(
          "{} was built over a FlatParameters whose parameters have moved since ('{}' is no "
          "longer in its buffer: another FlatParameters was built over the same model?), so it "
          "would update a copy the model does not read. Build one FlatParameters per model, and "
          "the optimizer and DDP over that one",
          user, slot.name);
    }
  }
}

void FlatParameters::require_parameters_of(const Module& module, const char* user) const {
  require_current(user);
  const std::vector<NamedTensor> own = module.named_parameters();
  bool same = own.size() == slots_.size();
  for (std::size_t i = 0; same && i < own.size(); ++i) {
    same = own[i].tensor.is_same(slots_[slots_.size() - 1 - i].param);  // slots are reversed
  }
  if (!same) {
    fail(
        "{}: the FlatParameters given holds other parameters than the model's ({} against the "
        "model's {}: built over another model?). Build it over this model: "
        "FlatParameters(model, device)",
        user, slots_.size(), own.size());
  }
}

const Tensor& FlatParameters::grads() const {
  if (!grads_.defined()) {
    fail(
        "the flat gradient buffer is released: under ZeRO stage 2 no rank holds the whole "
        "gradient (each parameter's .grad is gone once its bucket is reduced). This rank's shard "
        "of the averaged gradients is DistributedDataParallel::zero()->averaged_gradients()");
  }
  return grads_;
}

void FlatParameters::restore_gradient_buffer() {
  grads_ = Tensor::zeros({values_.numel()}, values_.device());
  for (ParameterSlot& slot : slots_) {
    slot.param.set_grad(grads_.view(slot.offset, slot.param.shape()));
    slot.param.zero_grad();  // the buffer, but no gradient yet
  }
}

void FlatParameters::zero_grad() {
  for (ParameterSlot& slot : slots_) slot.param.zero_grad();
}

void FlatParameters::zero_missing_grads() {
  if (!grads_.defined()) return;  // released: a parameter without a gradient has no memory
  for (ParameterSlot& slot : slots_) {
    if (!slot.param.has_grad()) {
      Tensor grad = grads_.view(slot.offset, slot.param.shape());
      grad.zero();
    }
  }
}

void FlatParameters::release_gradient_buffer() {
  for (ParameterSlot& slot : slots_) slot.param.release_grad();
  grads_ = Tensor();
}

}  // namespace nanoddp::nn
