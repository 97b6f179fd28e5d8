#pragma once
// Optimizers over a FlatParameters: one fused kernel per step for the whole model.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nanoddp/kernels/types.h"
#include "nanoddp/nn/flat_parameters.h"

namespace nanoddp::nn {

// ZeRO (comm/zero.h): the part of the flat buffers one rank updates and keeps state for. Each
// range is `numel` elements of the flat buffers from `offset`, held in the shard's own buffers
// (the optimizer state, and with ZeRO-2 the averaged gradients) from `local`.
struct ShardRange {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  std::int64_t local = 0;
};
struct OptimizerShard {
  std::vector<ShardRange> ranges;  // ascending offsets, disjoint
  std::int64_t numel = 0;          // elements of each shard buffer (>= the ranges' end)
  // Defined (ZeRO-2): the gradients are read from here at shard-local offsets. Undefined: from
  // the flat gradient buffer at the flat offsets (the full averaged gradient is there).
  Tensor grads;
};

class Optimizer {
 public:
  explicit Optimizer(FlatParameters& params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One step over the parameters that received a gradient since zero_grad() (has_grad()). A
  // parameter without one is not touched: no weight decay, no momentum or moment update, and its
  // own step count stays, as PyTorch's optimizers skip a parameter whose .grad is None. When
  // every parameter has a gradient (the common case) this is one fused kernel over the flat
  // buffers.
  void step();
  // The step of a sharded optimizer (ZeRO: comm/zero.h calls it, then all-gathers); step()
  // refuses to run sharded.
  void step_shard();
  // The same step in pieces, for running the optimizer inside backward
  // (nn/optimizer_in_backward.h): begin_step() once, then update() once for each group of
  // parameters whose gradients are final. Groups that cover every parameter once make exactly
  // the step() above: the update is elementwise, so grouping changes when it runs, not what.
  void begin_step() { ++steps_; }
  // Updates the parameters `slots` (indices into params.slots()) that have a gradient.
  void update(std::span<const std::size_t> slots);
  void zero_grad() { params_.zero_grad(); }
  // The parameters it updates.
  const FlatParameters& parameters() const { return params_; }
  // Optimizer steps taken (begin_step() calls).
  std::int64_t steps() const { return steps_; }
  // Per parameter (slot order): the steps that updated it (PyTorch's state[p]["step"]); AdamW's
  // bias correction and SGD's first momentum step use it.
  const std::vector<std::int64_t>& param_steps() const { return param_steps_; }
  // The optimizer's state as named flat tensors (same layout as the parameters), for
  // checkpoints; `set_steps` restores the step counts that go with it (every parameter's is
  // `steps` unless `param_steps` is given).
  // Sharded, these are the shard's tensors (OptimizerShard::numel elements each).
  virtual std::vector<NamedTensor> state() const = 0;
  // Bytes of optimizer state this process holds.
  std::int64_t state_bytes() const;
  // ZeRO: from now on update only the elements of `shard` and keep state for them only; the
  // state held so far (fresh, or loaded from a checkpoint) is cut down to the shard's ranges.
  // Parameters outside the shard are left alone: whoever sharded the optimizer brings them up
  // to date (comm/zero.h all-gathers them). Per-parameter step counts stay whole (one number
  // per parameter, the same on every rank).
  void shard(OptimizerShard shard);
  bool sharded() const { return sharded_; }
  const OptimizerShard& shard_layout() const { return shard_; }
  void set_steps(std::int64_t steps, const std::vector<std::int64_t>& param_steps = {});
  virtual std::string describe() const = 0;

 protected:
  // Updates elements [offset, offset + numel) of the flat buffers, whose parameters take their
  // `step`-th step (1 for the first); their state (and gradients, see grad_at) start at `local`
  // in the shard's buffers (== offset unless sharded).
  virtual void update_slice(std::int64_t offset, std::int64_t local, std::int64_t numel,
                            std::int64_t step) = 0;
  // The state tensors, for shard() to cut down.
  virtual std::vector<Tensor*> mutable_state() = 0;
  const float* grad_at(std::int64_t offset, std::int64_t local) const {
    return shard_.grads.defined() ? shard_.grads.data() + local : params_.grads().data() + offset;
  }

  FlatParameters& params_;
  OptimizerShard shard_;  // unsharded: one range over the whole buffer
  bool sharded_ = false;
  std::int64_t steps_ = 0;
  std::vector<std::int64_t> param_steps_;
  std::vector<std::size_t> all_slots_;  // 0, 1, ..., for step()
};

using SgdOptions = kernels::SgdHyper;

class SGD final : public Optimizer {
 public:
  SGD(FlatParameters& params, const SgdOptions& options);
  std::vector<NamedTensor> state() const override;
  std::string describe() const override;

 private:
  void update_slice(std::int64_t offset, std::int64_t local, std::int64_t numel,
                    std::int64_t step) override;
  std::vector<Tensor*> mutable_state() override;

  SgdOptions options_;
  Tensor momentum_buffer_;  // only with momentum
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

class AdamW final : public Optimizer {
 public:
  AdamW(FlatParameters& params, const AdamWOptions& options);
  std::vector<NamedTensor> state() const override;
  std::string describe() const override;

 private:
  void update_slice(std::int64_t offset, std::int64_t local, std::int64_t numel,
                    std::int64_t step) override;
  std::vector<Tensor*> mutable_state() override;

  AdamWOptions options_;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

}  // namespace nanoddp::nn
