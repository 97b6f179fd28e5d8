#include "nanoddp/nn/blocks.h"

#include <fmt/format.h>

#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {

LayerNorm::LayerNorm(std::int64_t features, float eps, bool elementwise_affine) : eps_(eps) {
  if (features <= 0) fail("LayerNorm({}): the feature count must be positive", features);
  if (!(eps > 0.0f)) fail("LayerNorm: eps must be positive, got {}", eps);
  if (elementwise_affine) {
    weight_ = register_parameter("weight", Tensor::ones({features}));
    bias_ = register_parameter("bias", Tensor::zeros({features}));
  }
}

std::string LayerNorm::describe() const {
  return fmt::format("LayerNorm(eps={}, affine={})", eps_, weight_.defined());
}

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim,
                     Generator& generator) {
  if (num_embeddings <= 0 || embedding_dim <= 0) {
    fail("Embedding({}, {}): the sizes must be positive", num_embeddings, embedding_dim);
  }
  weight_ = register_parameter(
      "weight", Tensor::normal({num_embeddings, embedding_dim}, 0.0f, 1.0f, generator.next()));
}

std::string Embedding::describe() const {
  return fmt::format("Embedding(num_embeddings={}, embedding_dim={})", weight_.size(0),
                     weight_.size(1));
}

Dropout::Dropout(float p, RandomStream rng) : p_(p), rng_(rng) {
  if (!(p >= 0.0f && p <= 1.0f)) fail("Dropout: probability {} is not in [0, 1]", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0f) return x;
  Tensor y = dropout(x, p_, true, rng_);
  rng_.offset += static_cast<std::uint64_t>(x.numel());
  return y;
}

std::string Dropout::describe() const {
  return fmt::format("Dropout(p={})", p_);
}

ResidualBlock::ResidualBlock(const ResidualBlockOptions& options, Generator& generator)
    : options_(options) {
  norm_ = register_module("norm", std::make_shared<LayerNorm>(options.features));
  fc1_ =
      register_module("fc1", std::make_shared<Linear>(options.features, options.hidden, generator));
  if (options.dropout > 0.0f) {
    drop_ =
        register_module("drop", std::make_shared<Dropout>(options.dropout, options.dropout_rng));
  }
  fc2_ =
      register_module("fc2", std::make_shared<Linear>(options.hidden, options.features, generator));
}

Tensor ResidualBlock::forward(const Tensor& x) {
  // The activation rides in fc1's GEMM epilogue (linear's fused bias + activation).
  Tensor h = linear((*norm_)(x), fc1_->weight(), fc1_->bias(), options_.activation);
  if (drop_) h = (*drop_)(h);
  return add(x, (*fc2_)(h));
}

std::string ResidualBlock::describe() const {
  return fmt::format("ResidualBlock(features={}, hidden={}, activation={}, dropout={})",
                     options_.features, options_.hidden, activation_name(options_.activation),
                     options_.dropout);
}

}  // namespace nanoddp::nn
