// A model of your own under DDP. DistributedDataParallel wraps any nn::Module: the Reducer
// sees only the module's parameters and hooks their gradients, so a model with a residual path,
// which nanoddp-train cannot express, trains on several ranks the same way. Run it as
//
//   build/bin/nanoddp-run --nproc-per-node 2 build/bin/nanoddp-example-custom-module
//
// It prints the model (named parameters, as PyTorch would name them), the loss per epoch, and
// each rank's parameter checksum: the same on every rank.

#include <bit>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/dataset.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/sampler.h"

using namespace nanoddp;

namespace {

// y = x + fc2(relu(fc1(x))): the block of a residual MLP. Children registered under a name
// give the parameters their dotted names ("blocks.0.fc1.weight").
class ResidualBlock : public nn::Module {
 public:
  ResidualBlock(std::int64_t width, std::int64_t hidden, Generator& generator)
      : fc1_(register_module("fc1", std::make_shared<nn::Linear>(width, hidden, generator))),
        fc2_(register_module("fc2", std::make_shared<nn::Linear>(hidden, width, generator))) {}

  Tensor forward(const Tensor& x) override { return add(x, (*fc2_)(relu((*fc1_)(x)))); }
  std::string describe() const override { return "ResidualBlock"; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// in -> width, `depth` residual blocks, width -> out.
class ResidualMlp : public nn::Module {
 public:
  ResidualMlp(std::int64_t in, std::int64_t width, std::int64_t out, int depth, std::uint64_t seed)
      : generator_(seed) {
    input_ = register_module("input", std::make_shared<nn::Linear>(in, width, generator_));
    for (int b = 0; b < depth; ++b) {
      blocks_.push_back(
          register_module("blocks." + std::to_string(b),
                          std::make_shared<ResidualBlock>(width, 2 * width, generator_)));
    }
    output_ = register_module("output", std::make_shared<nn::Linear>(width, out, generator_));
  }

  Tensor forward(const Tensor& x) override {
    Tensor h = (*input_)(x);
    for (const auto& block : blocks_) h = (*block)(h);
    return (*output_)(h);
  }
  std::string describe() const override { return "ResidualMlp"; }

 private:
  Generator generator_;  // declared first: the layers draw their initial values from it
  std::shared_ptr<nn::Linear> input_, output_;
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
};

constexpr std::int64_t kBatch = 32;  // per rank
constexpr int kEpochs = 5;

std::uint64_t checksum(const std::vector<float>& values) {  // FNV-1a over the bits
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const float v : values) h = (h ^ std::bit_cast<std::uint32_t>(v)) * 0x100000001b3ull;
  return h;
}

}  // namespace

int main() {
  int rank = -1;
  try {
    comm::Distributed dist = comm::init_distributed(comm::world_from_env());
    rank = dist.world.rank;

    ResidualMlp model(/*in=*/16, /*width=*/32, /*out=*/4, /*depth=*/2, /*seed=*/1);
    if (rank == 0) {
      for (const nn::NamedTensor& p : model.named_parameters()) {
        std::string shape;
        for (const std::int64_t d : p.tensor.shape()) {
          shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        }
        std::printf("%-22s [%s]\n", p.name.c_str(), shape.c_str());
      }
    }
    nn::FlatParameters params(model, Device::cpu());
    comm::DistributedDataParallel ddp(model, params, dist.group, dist.store);
    nn::AdamW optimizer(params, {.lr = 2e-3f});

    // A non-linear target: a teacher with a tanh hidden layer.
    nn::SyntheticRegression data(
        {.in_features = 16, .out_features = 4, .size = 2048, .seed = 7, .teacher_hidden = 32});
    nn::Sampler sampler({.size = data.size(),
                         .seed = 7,
                         .rank = dist.world.rank,
                         .world_size = dist.world.world_size});
    Tensor x = Tensor::empty({kBatch, data.in_features()});
    Tensor y = Tensor::empty({kBatch, data.out_features()});
    for (int epoch = 0; epoch < kEpochs; ++epoch) {
      sampler.set_epoch(epoch);
      double loss_sum = 0;
      int batches = 0;
      for (std::int64_t b = 0; b < sampler.num_batches(kBatch); ++b) {
        const auto indices = sampler.batch(b, kBatch);
        if (static_cast<std::int64_t>(indices.size()) != kBatch) continue;
        data.fill_batch(indices, x.data(), y.data());
        optimizer.zero_grad();
        Tensor loss = mse_loss(ddp(x), y);
        loss.backward();
        optimizer.step();
        loss_sum += loss.item();
        ++batches;
      }
      if (rank == 0) {
        std::printf("epoch %d: loss %.6f (mean over rank 0's batches)\n", epoch,
                    loss_sum / batches);
      }
    }
    std::printf("rank %d of %d: parameters checksum %016llx\n", rank, dist.world.world_size,
                static_cast<unsigned long long>(checksum(params.values().to_vector())));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nanoddp-example-custom-module (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
