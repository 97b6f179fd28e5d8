#include "nanoddp/nn/module.h"

namespace nanoddp::nn {

Tensor& Module::register_parameter(std::string name, Tensor tensor) {
  tensor.set_requires_grad(true);
  parameters_.push_back({std::move(name), std::move(tensor)});
  return parameters_.back().tensor;
}

void Module::collect(const std::string& prefix, std::vector<NamedTensor>& out) const {
  for (const NamedTensor& p : parameters_) out.push_back({prefix + p.name, p.tensor});
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (NamedTensor& p : named_parameters()) out.push_back(std::move(p.tensor));
  return out;
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.zero_grad();
}

}  // namespace nanoddp::nn
