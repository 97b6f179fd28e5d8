#include "nanoddp/nn/module.h"

#include <algorithm>

#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {

// The defaults call each other; `bridging_` turns a module that overrides neither into an
// Error instead of an endless recursion.
Tensor Module::forward(const Tensor& x) {
  if (bridging_) fail("{} implements neither forward(x) nor forward_many(inputs)", describe());
  bridging_ = true;
  std::vector<Tensor> out;
  try {
    out = forward_many(std::span<const Tensor>(&x, 1));
  } catch (...) {
    bridging_ = false;
    throw;
  }
  bridging_ = false;
  if (out.size() != 1) {
    fail("{} returns {} outputs; call it with forward_many (or module(a, b)) to get them all",
         describe(), out.size());
  }
  return out.front();
}

std::vector<Tensor> Module::forward_many(std::span<const Tensor> inputs) {
  if (bridging_) fail("{} implements neither forward(x) nor forward_many(inputs)", describe());
  if (inputs.size() != 1) {
    fail("{} takes one input (it implements forward(x)), but was given {}", describe(),
         inputs.size());
  }
  bridging_ = true;
  std::vector<Tensor> out;
  try {
    out.push_back(forward(inputs.front()));
  } catch (...) {
    bridging_ = false;
    throw;
  }
  bridging_ = false;
  return out;
}

std::uint64_t Module::register_forward_pre_hook(ForwardHook hook) {
  pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

std::uint64_t Module::register_forward_hook(ForwardHook hook) {
  post_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_forward_hook(std::uint64_t id) {
  std::erase_if(pre_hooks_, [id](const auto& h) { return h.first == id; });
  std::erase_if(post_hooks_, [id](const auto& h) { return h.first == id; });
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
}

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
