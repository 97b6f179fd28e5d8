#pragma once
// Module: what models are written with. A module owns named parameters and named child
// modules; `named_parameters()` walks them in registration order with dotted names
// ("layers.0.weight"), exactly as PyTorch names them, so a checkpoint's names line up with an
// equivalent PyTorch model. A parameter reachable twice (a module used twice) is listed once,
// under its first name, as in PyTorch.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/engine/tensor.h"

namespace nanoddp::nn {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Every parameter of this module and its children, depth first in registration order.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  void zero_grad();
  // A short description, e.g. "Linear(in=5, out=3)".
  virtual std::string describe() const = 0;

 protected:
  Tensor& register_parameter(std::string name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedTensor>& out) const;
  std::vector<NamedTensor> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace nanoddp::nn
