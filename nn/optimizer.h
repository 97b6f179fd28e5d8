#pragma once
// Optimizers over a FlatParameters: one fused kernel per step for the whole model.

#include <cstdint>
#include <string>
#include <vector>

#include "nanoddp/kernels/types.h"
#include "nanoddp/nn/flat_parameters.h"

namespace nanoddp::nn {

class Optimizer {
 public:
  explicit Optimizer(FlatParameters& params) : params_(params) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One step over every parameter (a parameter that received no gradient counts as zero).
  void step();
  // The same step in pieces, for running the optimizer inside backward
  // (nn/optimizer_in_backward.h): begin_step() once, then update() once for each slice of the
  // flat buffers whose gradients are final. Slices that cover every parameter once make exactly
  // the step() above: the update is elementwise, so slicing changes when it runs, not what.
  void begin_step() { ++steps_; }
  void update(std::int64_t offset, std::int64_t numel);
  void zero_grad() { params_.zero_grad(); }
  std::int64_t steps() const { return steps_; }
  // The optimizer's state as named flat tensors (same layout as the parameters), for
  // checkpoints; `set_steps` restores the step count that goes with it.
  virtual std::vector<NamedTensor> state() const = 0;
  void set_steps(std::int64_t steps) { steps_ = steps; }
  virtual std::string describe() const = 0;

 protected:
  // Updates elements [offset, offset + numel) of the flat buffers; steps_ already counts the
  // step being taken.
  virtual void update_slice(std::int64_t offset, std::int64_t numel) = 0;

  FlatParameters& params_;
  std::int64_t steps_ = 0;
};

using SgdOptions = kernels::SgdHyper;

class SGD final : public Optimizer {
 public:
  SGD(FlatParameters& params, const SgdOptions& options);
  std::vector<NamedTensor> state() const override;
  std::string describe() const override;

 private:
  void update_slice(std::int64_t offset, std::int64_t numel) override;

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
  void update_slice(std::int64_t offset, std::int64_t numel) override;

  AdamWOptions options_;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

}  // namespace nanoddp::nn
