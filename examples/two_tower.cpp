// A research model under DDP: two inputs through one shared encoder, two outputs, two losses.
// The two towers read the two halves of each sample's features; the encoder (a Linear, then a
// pre-norm residual block with LayerNorm and Dropout) is shared, so its gradient sums both
// towers' contributions; the main head regresses the target from both towers, and an
// auxiliary head on tower b classifies which target column is largest (cross-entropy). Run it as
//
//   build/bin/nanoddp-run --nproc-per-node 2 build/bin/nanoddp-example-two-tower
//
// It prints the loss and the auxiliary head's accuracy per epoch, and each rank's parameter
// checksum: the same on every rank (each rank draws its own dropout masks).

#include <bit>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/functional.h"
#include "nanoddp/nn/blocks.h"
#include "nanoddp/nn/dataset.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/sampler.h"

using namespace nanoddp;

namespace {

class TwoTower : public nn::Module {
 public:
  TwoTower(std::int64_t half, std::int64_t width, std::int64_t out, int rank, std::uint64_t seed)
      : generator_(seed),
        embed_(register_module("embed", std::make_shared<nn::Linear>(half, width, generator_))),
        block_(register_module(
            "block",
            std::make_shared<nn::ResidualBlock>(
                nn::ResidualBlockOptions{
                    .features = width,
                    .hidden = 2 * width,
                    .dropout = 0.1f,
                    // Each rank its own masks, as the rows of one big batch would get.
                    .dropout_rng = {.seed = seed, .stream = static_cast<std::uint64_t>(rank)}},
                generator_))),
        head_(register_module("head", std::make_shared<nn::Linear>(2 * width, out, generator_))),
        aux_(register_module("aux", std::make_shared<nn::Linear>(width, out, generator_))) {}

  // Inputs: tower a's features, tower b's. Outputs: the regression, the auxiliary logits.
  std::vector<Tensor> forward_many(std::span<const Tensor> in) override {
    const Tensor a = (*block_)((*embed_)(in[0]));
    const Tensor b = (*block_)((*embed_)(in[1]));
    return {(*head_)(cat({a, b}, 1)), (*aux_)(b)};
  }
  std::string describe() const override { return "TwoTower"; }

 private:
  Generator generator_;  // declared first: the layers draw their initial values from it
  std::shared_ptr<nn::Linear> embed_;
  std::shared_ptr<nn::ResidualBlock> block_;
  std::shared_ptr<nn::Linear> head_, aux_;
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

    TwoTower model(/*half=*/8, /*width=*/32, /*out=*/4, rank, /*seed=*/1);
    nn::FlatParameters params(model, Device::cpu());
    comm::DistributedDataParallel ddp(model, params, dist.group, dist.store);
    nn::AdamW optimizer(params, {.lr = 2e-3f});

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
      double loss_sum = 0, correct = 0;
      int batches = 0;
      for (std::int64_t b = 0; b < sampler.num_batches(kBatch); ++b) {
        const auto indices = sampler.batch(b, kBatch);
        if (static_cast<std::int64_t>(indices.size()) != kBatch) continue;
        data.fill_batch(indices, x.data(), y.data());
        const Tensor classes = max(y, 1).indices;  // which target column is largest
        optimizer.zero_grad();
        const std::vector<Tensor> out = ddp(narrow(x, 1, 0, 8), narrow(x, 1, 8, 8));
        Tensor loss = add(mse_loss(out[0], y), mul(cross_entropy(out[1], classes), 0.1f));
        loss.backward();
        optimizer.step();
        loss_sum += loss.item();
        const std::vector<std::int64_t> guess = max(out[1].detach(), 1).indices.to_int64_vector();
        const std::vector<std::int64_t> truth = classes.to_int64_vector();
        for (std::size_t i = 0; i < guess.size(); ++i) correct += guess[i] == truth[i];
        ++batches;
      }
      if (rank == 0) {
        std::printf("epoch %d: loss %.6f (mean over rank 0's batches), aux accuracy %.3f\n", epoch,
                    loss_sum / batches, correct / static_cast<double>(batches * kBatch));
      }
    }
    std::printf("rank %d of %d: parameters checksum %016llx\n", rank, dist.world.world_size,
                static_cast<unsigned long long>(checksum(params.values().to_vector())));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nanoddp-example-two-tower (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
