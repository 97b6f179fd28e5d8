#pragma once
// Module: what models are written with. A module owns named parameters and named child
// modules; `named_parameters()` walks them in registration order with dotted names
// ("layers.0.weight"), exactly as PyTorch names them, so a checkpoint's names line up with an
// equivalent PyTorch model. A parameter reachable twice (a module used twice) is listed once,
// under its first name, as in PyTorch.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
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

  // One input, one output: what most modules implement.
  virtual Tensor forward(const Tensor& x);
  // Several inputs and/or several outputs (two towers over a shared encoder, an auxiliary
  // head). The two forms bridge each other: forward_many({x}) calls forward(x), and forward(x)
  // calls forward_many({x}) and expects one output; a module overrides at least one of them.
  virtual std::vector<Tensor> forward_many(std::span<const Tensor> inputs);
  // Calling a module runs its forward pre-hooks, forward, then its forward hooks. Composites
  // call their children this way (child(x), not child.forward(x)), so that hooks see every
  // layer run.
  Tensor operator()(const Tensor& x) {
    run_hooks(pre_hooks_);
    Tensor out = forward(x);
    run_hooks(post_hooks_);
    return out;
  }
  std::vector<Tensor> operator()(std::span<const Tensor> inputs) {
    run_hooks(pre_hooks_);
    std::vector<Tensor> out = forward_many(inputs);
    run_hooks(post_hooks_);
    return out;
  }
  template <typename... Ts>
    requires(sizeof...(Ts) >= 2 && (std::is_convertible_v<const Ts&, const Tensor&> && ...))
  std::vector<Tensor> operator()(const Ts&... inputs) {
    const Tensor all[] = {inputs...};
    return (*this)(std::span<const Tensor>(all));
  }

  // Functions run before (PyTorch's register_forward_pre_hook) and after (register_forward_hook)
  // every call of this module through operator(), without access to its inputs and outputs; not
  // after a forward that throws. ZeRO's all-gather overlap waits in them for the parameters a
  // module is about to read (comm/zero_overlap.h). Each returns an id for remove_forward_hook.
  using ForwardHook = std::function<void(Module&)>;
  std::uint64_t register_forward_pre_hook(ForwardHook hook);
  std::uint64_t register_forward_hook(ForwardHook hook);
  void remove_forward_hook(std::uint64_t id);

  // Training or evaluation mode, for this module and its children (PyTorch's train() / eval()):
  // what Dropout looks at. Modules start in training mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

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
  using Hooks = std::vector<std::pair<std::uint64_t, ForwardHook>>;
  void run_hooks(const Hooks& hooks) {
    for (const auto& [id, hook] : hooks) hook(*this);
  }
  Hooks pre_hooks_, post_hooks_;
  std::uint64_t next_hook_id_ = 0;
  std::vector<NamedTensor> parameters_;
  bool training_ = true;
  bool bridging_ = false;  // inside a default forward / forward_many (see module.cpp)
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace nanoddp::nn
