// The smallest complete data-parallel training program on nanoddp's C++ API: what
// nanoddp-train does, without its options, checkpoints and metrics. Each process is one rank:
//
//   build/bin/nanoddp-run --nproc-per-node 2 build/bin/nanoddp-example-ddp
//
// (or torchrun --no-python, mpirun, srun with MASTER_ADDR/MASTER_PORT; run alone, it is a world
// of one). Every rank trains the same MLP on its own part of each global batch; DDP averages the
// gradients during backward, so all ranks take the same optimizer steps and end with the same
// parameters, which each rank prints as a checksum.

#include <bit>
#include <cstdint>
#include <cstdio>
#include <exception>
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

constexpr std::int64_t kBatch = 32;  // per rank
constexpr int kEpochs = 4;

// FNV-1a over the parameters' bits: equal on every rank iff the parameters are.
std::uint64_t checksum(const std::vector<float>& values) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const float v : values) h = (h ^ std::bit_cast<std::uint32_t>(v)) * 0x100000001b3ull;
  return h;
}

}  // namespace

int main() {
  int rank = -1;
  try {
    // 1. Who am I? The launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) says; rank 0
    //    hosts the store through which the ranks find each other and build the process group
    //    (Gloo on CPUs).
    comm::Distributed dist = comm::init_distributed(comm::world_from_env());
    rank = dist.world.rank;

    // 2. The model, its parameters in one flat buffer (one optimizer kernel for all of them),
    //    wrapped in DDP: every rank checks that all ranks built the same model, rank 0's
    //    initial values are broadcast, and gradients become views into the all-reduce buckets.
    nn::Mlp model({.in_features = 16, .out_features = 4, .hidden = 64, .layers = 2, .seed = 1});
    nn::FlatParameters params(model, Device::cpu());
    comm::DistributedDataParallel ddp(model, params, dist.group, dist.store);
    nn::AdamW optimizer(params, {.lr = 3e-3f});

    // 3. Data addressed by global sample index, split across ranks by the sampler: together
    //    the ranks see, step by step, the samples of one process with batch world_size * kBatch.
    nn::SyntheticRegression data({.in_features = 16, .out_features = 4, .size = 2048, .seed = 7});
    nn::Sampler sampler({.size = data.size(),
                         .seed = 7,
                         .rank = dist.world.rank,
                         .world_size = dist.world.world_size});
    Tensor x = Tensor::empty({kBatch, data.in_features()});
    Tensor y = Tensor::empty({kBatch, data.out_features()});

    for (int epoch = 0; epoch < kEpochs; ++epoch) {
      sampler.set_epoch(epoch);  // a new shuffle, the same on every rank
      float loss_value = 0;
      const std::int64_t batches = sampler.num_batches(kBatch);
      for (std::int64_t b = 0; b < batches; ++b) {
        const auto indices = sampler.batch(b, kBatch);
        if (static_cast<std::int64_t>(indices.size()) != kBatch) continue;  // keep shapes fixed
        data.fill_batch(indices, x.data(), y.data());

        // 4. The step. backward() all-reduces the gradients bucket by bucket while it runs.
        optimizer.zero_grad();
        Tensor loss = mse_loss(ddp(x), y);
        loss.backward();
        optimizer.step();
        loss_value = loss.item();
      }
      if (rank == 0) std::printf("epoch %d: loss %.6f (rank 0's last batch)\n", epoch, loss_value);
    }
    std::printf("rank %d of %d: parameters checksum %016llx\n", rank, dist.world.world_size,
                static_cast<unsigned long long>(checksum(params.values().to_vector())));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nanoddp-example-ddp (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
