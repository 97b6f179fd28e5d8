#pragma once
// Modules for research MLPs beyond layers.h: LayerNorm, Dropout, a pre-norm residual MLP
// block, and CrossEntropyLoss. Parameters are named as PyTorch names them (norm.weight,
// fc1.bias, ...), so checkpoints line up with the equivalent PyTorch model.

#include <cstdint>
#include <memory>
#include <string>

#include "nanoddp/engine/functional.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::nn {

// PyTorch's nn.LayerNorm(features): over the last dimension, weight 1 and bias 0 to start.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t features, float eps = 1e-5f, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override { return layer_norm(x, weight_, bias_, eps_); }
  std::string describe() const override;

 private:
  float eps_;
  Tensor weight_;
  Tensor bias_;
};

// PyTorch's nn.Embedding(num_embeddings, embedding_dim): a lookup table whose weight starts
// from N(0, 1), as PyTorch's does. forward takes int64 indices of any shape and returns
// indices.shape + [embedding_dim] (engine/functional.h: embedding).
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& generator);
  Tensor forward(const Tensor& indices) override { return embedding(weight_, indices); }
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

// PyTorch's nn.Dropout(p): active in training mode only (Module::train / eval). Each forward
// draws its mask from `rng`, then moves rng.offset past the elements it used, so successive
// steps get fresh masks and a run restarted with the same rng draws the same ones. Under DDP
// give each rank its own rng.stream (the rank, say): the ranks' masks must differ as the rows
// of one big batch's would.
class Dropout : public Module {
 public:
  Dropout(float p, RandomStream rng);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const RandomStream& rng() const { return rng_; }

 private:
  float p_;
  RandomStream rng_;
};

struct ResidualBlockOptions {
  std::int64_t features = 256;
  std::int64_t hidden = 1024;
  Activation activation = Activation::kGelu;
  float dropout = 0.0f;
  RandomStream dropout_rng{};
};

// x + fc2(dropout(act(fc1(norm(x))))): the pre-norm residual MLP block of transformers and
// MLP-Mixers. Children norm, fc1, (drop,) fc2.
class ResidualBlock : public Module {
 public:
  ResidualBlock(const ResidualBlockOptions& options, Generator& generator);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  ResidualBlockOptions options_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<Dropout> drop_;
  std::shared_ptr<Linear> fc2_;
};

// PyTorch's nn.CrossEntropyLoss(ignore_index, label_smoothing), mean reduction.
struct CrossEntropyLoss {
  CrossEntropyOptions options;
  Tensor operator()(const Tensor& logits, const Tensor& targets) const {
    return cross_entropy(logits, targets, options);
  }
};

}  // namespace nanoddp::nn
