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

  virtual void step() = 0;
  void zero_grad() { params_.zero_grad(); }
  std::int64_t steps() const { return steps_; }
  // The optimizer's state as named flat tensors (same layout as the parameters), for
  // checkpoints; `set_steps` restores the step count that goes with it.
  virtual std::vector<NamedTensor> state() const = 0;
  void set_steps(std::int64_t steps) { steps_ = steps; }
  virtual std::string describe() const = 0;

 protected:
  FlatParameters& params_;
  std::int64_t steps_ = 0;
};

using SgdOptions = kernels::SgdHyper;

class SGD final : public Optimizer {
 public:
  SGD(FlatParameters& params, const SgdOptions& options);
  void step() override;
  std::vector<NamedTensor> state() const override;
  std::string describe() const override;

 private:
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
  void step() override;
  std::vector<NamedTensor> state() const override;
  std::string describe() const override;

 private:
  AdamWOptions options_;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

}  // namespace nanoddp::nn
