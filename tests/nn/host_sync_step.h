#pragma once
// One training step (forward, MSE loss, backward, SGD step) of a small Mlp on `device`, and how
// many host synchronizations it made (engine/host_sync.h): shared by the CPU test and its GPU
// twin, which must both count none.

#include <cstdint>

#include "nanoddp/engine/host_sync.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"

namespace nanoddp::testing {

struct HostSyncStep {
  explicit HostSyncStep(Device device)
      : model({.in_features = 32, .out_features = 8, .hidden = 64, .layers = 3, .seed = 3}),
        params(model, device),
        sgd(params, {.lr = 0.01f, .momentum = 0.9f}),
        x(Tensor::normal({16, 32}, 0.0f, 1.0f, {.seed = 1}, device)),
        y(Tensor::zeros({16, 8}, device)) {}

  // The synchronizations of one step.
  std::int64_t step() {
    const std::int64_t before = host_sync_count();
    sgd.zero_grad();
    Tensor loss = mse_loss(model(x), y);
    loss.backward();
    sgd.step();
    return host_sync_count() - before;
  }

  nn::Mlp model;
  nn::FlatParameters params;
  nn::SGD sgd;
  Tensor x, y;
};

}  // namespace nanoddp::testing
