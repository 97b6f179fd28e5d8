#include "nanoddp/nn/layers.h"

#include <cmath>

#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, Generator& generator,
               bool bias) {
  if (in_features <= 0 || out_features <= 0) {
    fail("Linear({}, {}): feature counts must be positive", in_features, out_features);
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  weight_ = register_parameter(
      "weight", Tensor::uniform({out_features, in_features}, -bound, bound, generator.next()));
  if (bias) {
    bias_ = register_parameter("bias",
                               Tensor::uniform({out_features}, -bound, bound, generator.next()));
  }
}

std::string Linear::describe() const {
  return fmt::format("Linear(in={}, out={}, bias={})", weight_.size(1), weight_.size(0),
                     bias_.defined());
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(children().size()), std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [name, child] : children()) h = (*child)(h);
  return h;
}

std::string Sequential::describe() const {
  std::string out = "Sequential(";
  for (const auto& [name, child] : children()) {
    out += fmt::format("{}{}: {}", name == "0" ? "" : ", ", name, child->describe());
  }
  return out + ")";
}

namespace {

std::shared_ptr<Module> make_activation(Activation act) {
  switch (act) {
    case Activation::kRelu:
      return std::make_shared<ReLU>();
    case Activation::kGelu:
      return std::make_shared<GELU>();
    case Activation::kNone:
      break;
  }
  fail("an MLP needs an activation between its layers (relu or gelu)");
}

}  // namespace

Mlp::Mlp(const MlpOptions& options) : options_(options) {
  if (options.layers < 0) fail("MLP: layers must be >= 0, got {}", options.layers);
  if (options.layers > 0 && options.hidden <= 0) {
    fail("MLP: hidden must be positive, got {}", options.hidden);
  }
  Generator generator(options.seed);
  layers_ = register_module("layers", std::make_shared<Sequential>());
  std::int64_t width = options.in_features;
  for (std::int64_t i = 0; i < options.layers; ++i) {
    layers_->push_back(std::make_shared<Linear>(width, options.hidden, generator));
    layers_->push_back(make_activation(options.activation));
    width = options.hidden;
  }
  layers_->push_back(std::make_shared<Linear>(width, options.out_features, generator));
}

std::string Mlp::describe() const {
  // One Linear(in, out): no hidden width and no activation take part, so none is named (an
  // --init check would otherwise refuse a file over a setting that changes nothing).
  if (options_.layers == 0) {
    return fmt::format("MLP(in={}, out={}, layers=0)", options_.in_features, options_.out_features);
  }
  return fmt::format("MLP(in={}, out={}, hidden={}, layers={}, activation={})",
                     options_.in_features, options_.out_features, options_.hidden, options_.layers,
                     activation_name(options_.activation));
}

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  fail("unknown activation '{}': expected relu or gelu", name);
}

std::string activation_name(Activation act) {
  switch (act) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kNone:
      break;
  }
  return "none";
}

}  // namespace nanoddp::nn
