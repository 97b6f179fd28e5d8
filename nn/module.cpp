#include "nanoddp/nn/module.h"

#include <algorithm>

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
  std::vector<NamedTensor> all;
  collect("", all);
  // A module (or parameter) reachable twice, as in Sequential{lin, lin} or tied weights, is one
  // parameter, listed once under its first name, as PyTorch's named_parameters() does. Listed
  // twice it would get two slots in the flat buffer (one of them dead), two hooks and two
  // copies in every checkpoint.
  std::vector<NamedTensor> out;
  out.reserve(all.size());
  for (NamedTensor& p : all) {
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const NamedTensor& q) { return q.tensor.is_same(p.tensor); });
    if (!seen) out.push_back(std::move(p));
  }
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
