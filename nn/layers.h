#pragma once
// The building blocks of an MLP: Linear, the activations, Sequential, and the MLP builder.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::nn {

// y = x W^T + b with PyTorch's default initialisation: W ~ U(-1/sqrt(in), 1/sqrt(in)) (what
// kaiming_uniform_(a=sqrt(5)) works out to) and b ~ U(-1/sqrt(in), 1/sqrt(in)). Each tensor
// draws from its own Philox stream of `generator`.
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Generator& generator,
         bool bias = true);
  Tensor forward(const Tensor& x) override { return linear(x, weight_, bias_); }
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_;
  Tensor bias_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string describe() const override { return "ReLU()"; }
};

class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return gelu(x); }
  std::string describe() const override { return "GELU(approximate='tanh')"; }
};

// Children are named "0", "1", ... like torch.nn.Sequential.
class Sequential : public Module {
 public:
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  std::size_t size() const { return children().size(); }
};

struct MlpOptions {
  std::int64_t in_features = 1024;
  std::int64_t out_features = 1024;
  std::int64_t hidden = 1024;
  // Hidden layers: L + 1 Linear modules (in->hidden, L-1 x hidden->hidden, hidden->out);
  // 0 means a single Linear(in, out).
  std::int64_t layers = 3;
  Activation activation = Activation::kRelu;
  std::uint64_t seed = 0;
};

// The MLP, as `layers` = Sequential(Linear, act, Linear, act, ..., Linear), so its parameters
// are named like PyTorch's: layers.0.weight, layers.0.bias, layers.2.weight, ...
class Mlp : public Module {
 public:
  explicit Mlp(const MlpOptions& options);
  Tensor forward(const Tensor& x) override { return (*layers_)(x); }
  std::string describe() const override;
  const MlpOptions& options() const { return options_; }

 private:
  MlpOptions options_;
  std::shared_ptr<Sequential> layers_;
};

Activation parse_activation(const std::string& name);
std::string activation_name(Activation act);

}  // namespace nanoddp::nn

namespace nanoddp::nn {

// PyTorch's nn.MSELoss() (mean reduction), as a callable object.
struct MSELoss {
  Tensor operator()(const Tensor& pred, const Tensor& target) const {
    return mse_loss(pred, target);
  }
};

}  // namespace nanoddp::nn
