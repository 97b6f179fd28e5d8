#pragma once
// All of a model's parameters in one flat buffer per device, and all their gradients in a
// second one with the same layout.
//
// Why flat: the optimizer step becomes one kernel over one buffer instead of a launch per
// parameter, and a contiguous run of parameters is a contiguous run of gradients. The layout
// is the REVERSE of registration order (the last layer first) because that is the order in
// which backward produces gradients; DDP's buckets are then plain contiguous slices of the
// gradient buffer, filled front to back as backward proceeds.
//
// Each parameter (and each handle to it held by a module) becomes a view into the buffer, and
// each parameter's `.grad` a view into the gradient buffer, so autograd writes gradients
// in place: no copies in or out.

#include <cstdint>
#include <string>
#include <vector>

#include "nanoddp/engine/tensor.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::nn {

struct ParameterSlot {
  std::string name;
  Tensor param;
  std::int64_t offset = 0;  // elements from the start of the flat buffers
  std::int64_t numel = 0;
};

class FlatParameters {
 public:
  // Moves `module`'s parameters onto `device` (copying their current values).
  FlatParameters(const Module& module, Device device);

  Device device() const { return values_.device(); }
  std::int64_t numel() const { return values_.numel(); }
  const Tensor& values() const { return values_; }
  // The flat gradient buffer. An error while it is released (release_gradient_buffer: under
  // ZeRO stage 2 no rank holds whole gradients; DistributedDataParallel::zero()->
  // averaged_gradients() is this rank's shard of the averages).
  const Tensor& grads() const;
  bool has_gradient_buffer() const { return grads_.defined(); }
  // In layout order (reverse registration order).
  const std::vector<ParameterSlot>& slots() const { return slots_; }

  // Marks every gradient stale without touching memory: the next backward overwrites instead
  // of accumulating (see Tensor::zero_grad). A parameter then has no gradient (has_grad() is
  // false, PyTorch's .grad is None) until a backward gives it one, and the optimizers skip it.
  // A new FlatParameters starts so.
  void zero_grad();
  // Zero-fills the memory of the gradients no backward wrote since zero_grad() (parameters
  // unused in this step), so that the flat gradient buffer can be read as a whole (a NaN
  // check, a gradient norm). They still have no gradient: the optimizers skip them.
  void zero_missing_grads();
  // Frees the flat gradient buffer: every parameter is left without a gradient or a buffer, and
  // grads() is an error until restore_gradient_buffer(). ZeRO-2 (comm/reducer.h) hands gradient
  // memory out one bucket at a time meanwhile.
  void release_gradient_buffer();
  // A new flat gradient buffer, each parameter's .grad a view into it again (no gradient yet).
  void restore_gradient_buffer();
  // The DDP Reducers that read the flat buffer's layout (their buckets are views of it): ZeRO-2
  // may release the buffer only when it is the one user.
  void attach() { ++attached_; }
  void detach() { --attached_; }
  int attached() const { return attached_; }

  // Whether the parameters still live in this object's buffer: a second FlatParameters over the
  // same model moves them into its own, and an optimizer or DDP built over the first would then
  // update and reduce a copy nobody reads, training nothing without a word (an outside
  // tester's). An Error naming `user` ("SGD", "DistributedDataParallel") when they do not.
  void require_current(const char* user) const;
  bool current() const;
  // And that they are `module`'s parameters, all of them: DDP given another model's
  // FlatParameters would reduce that model's gradients.
  void require_parameters_of(const Module& module, const char* user) const;

 private:
  Tensor values_;
  Tensor grads_;
  std::vector<ParameterSlot> slots_;
  int attached_ = 0;
};

}  // namespace nanoddp::nn
