#pragma once
// Optimizer in backward: each parameter is updated as soon as backward has finished its
// gradient, instead of in one pass over all parameters after backward returns.
//
// Why: an optimizer step is pure memory traffic (it reads the weights, the gradients and the
// optimizer state, and writes the weights and the state). Right after a Linear layer's backward
// its weight (just read by the input-gradient GEMM) and its gradient (just written by the
// weight-gradient GEMM) are still in the cache; a separate step after backward finds them
// evicted by the earlier layers' GEMMs. PyTorch offers the same as
// `_apply_optimizer_in_backward`, driven by post-accumulate-grad hooks, as here.
//
// The parameters end bit-for-bit where optimizer.step() after backward would take them: the
// optimizers are elementwise, so updating slice by slice changes when each element is updated,
// not how (tests/nn/test_optimizer_in_backward.cpp holds the two against each other).
//
// What it gives up: the step cannot be skipped once backward has run (a NaN gradient is already
// applied; the trainer still detects it and stops), and nothing can look at all gradients before
// the update (clipping by the global norm). And it relies on what autograd guarantees for
// gradients, not for values: a parameter's hook runs after every node with an edge to it, so
// no node that differentiates through it reads it afterwards; a node that captured a parameter
// through .detach() (a view, no edge) and runs later would see the new value. nanoddp's ops
// never do that, and the version counters catch it (engine/autograd.h, SavedTensor), as
// PyTorch's do.
//
//   nn::OptimizerInBackward fused(optimizer, params, {.hook_parameters = true});
//   for (...) {
//     optimizer.zero_grad();
//     fused.arm();               // the next backward ends the step (the last micro-batch)
//     loss.backward();           // parameters are updated during this call
//     fused.finish();            // parameters whose gradient came from earlier micro-batches
//   }
//
// Under DDP a gradient is final only once its bucket is averaged across ranks, so the hooks on
// the parameters stay off and the Reducer hands over each bucket as its all-reduce completes
// (update_range() from Reducer::set_bucket_reduced_hook; the trainer wires the two).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/optimizer.h"

namespace nanoddp::nn {

struct OptimizerInBackwardOptions {
  // Update each parameter from its own post-accumulate-grad hook (single process). Off when
  // something else (the DDP Reducer) calls update_range() when gradients are final.
  bool hook_parameters = true;
};

class OptimizerInBackward {
 public:
  OptimizerInBackward(Optimizer& optimizer, FlatParameters& params,
                      const OptimizerInBackwardOptions& options);
  ~OptimizerInBackward();
  OptimizerInBackward(const OptimizerInBackward&) = delete;
  OptimizerInBackward& operator=(const OptimizerInBackward&) = delete;

  // Starts an optimizer step that the next backward pass carries out. Backward passes run while
  // not armed (the earlier micro-batches of gradient accumulation) only accumulate gradients.
  void arm();
  bool armed() const { return armed_; }
  // Updates the flat-buffer slice [offset, offset + numel), which holds exactly the parameters
  // `slots` (indices into params.slots()), if armed; the ones without a gradient are skipped, as
  // by Optimizer::step(). Each slot is updated at most once per step.
  void update_range(std::int64_t offset, std::int64_t numel, std::span<const std::size_t> slots);
  // Ends the step: parameters with a gradient that backward did not finish while armed (it came
  // from earlier micro-batches only) are updated now; parameters without one are skipped, as
  // optimizer.step() skips them. Then disarms. Returns how many parameters were updated here.
  std::size_t finish();
  // How many of the step's gradients were NaN or Inf, counted slice by slice just before each
  // update, while the gradients were in cache (so no separate pass over them is needed). Valid
  // after finish(); waits for the device.
  std::int64_t nonfinite_gradients() const;

 private:
  void update_slot(std::size_t slot);

  Optimizer& optimizer_;
  FlatParameters& params_;
  bool armed_ = false;
  std::vector<bool> updated_;                    // per slot, this step
  Tensor nonfinite_;                             // per slot: NaN/Inf count of the range it started
  std::shared_ptr<OptimizerInBackward*> alive_;  // the hooks hold weak handles to it
  std::vector<HookHandle> hooks_;                 // removed by the destructor
};

}  // namespace nanoddp::nn
