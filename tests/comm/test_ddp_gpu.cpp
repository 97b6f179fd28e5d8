// DistributedDataParallel on a GPU with NCCL, world of one: the Reducer's CUDA path (buckets
// reduced on the communication stream, the compute stream waiting on their events) must leave
// exactly the gradients a plain backward leaves, and training must work. Runs only where a GPU
// is (gpu_main.cpp skips with 77).

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <doctest/doctest.h>

#include <cmath>

#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"

using namespace nanoddp;

TEST_CASE("ddp on cuda:0 with NCCL (world of one) leaves the plain backward's gradients") {
  const Device gpu = Device::cuda(0);
  comm::Distributed dist = comm::init_distributed(comm::WorldInfo{},
                                                  {.backend = "nccl", .device = gpu});
  const nn::MlpOptions shape{.in_features = 32, .out_features = 8, .hidden = 64, .layers = 3,
                             .seed = 11};
  nn::Mlp model(shape), reference(shape);
  nn::FlatParameters params(model, gpu), ref_params(reference, gpu);
  // Small caps: several buckets, so the in-order launch and the event waits are exercised.
  comm::DistributedDataParallel ddp(model, params, dist.group, dist.store,
                                    {.bucket_cap_mb = 0.01, .first_bucket_mb = 0.005});
  CHECK(ddp.reducer().buckets().size() >= 3);

  nn::SGD sgd(params, {.lr = 0.05f});
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    const Tensor x = Tensor::normal({16, 32}, 0.0f, 1.0f,
                                    {.seed = 4, .offset = static_cast<std::uint64_t>(step) * 512}, gpu);
    const Tensor y = Tensor::zeros({16, 8}, gpu);
    sgd.zero_grad();
    ref_params.zero_grad();
    Tensor loss = mse_loss(ddp(x), y);
    loss.backward();
    mse_loss(reference(x), y).backward();
    // World of one: the average over ranks is the gradient itself.
    const auto got = params.grads().to_vector();
    const auto expected = ref_params.grads().to_vector();
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == expected[i]);
    sgd.step();
    Tensor ref_values = ref_params.values();
    ref_values.copy_from(params.values());
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(std::isfinite(last));
  CHECK(last < first);
}

#endif  // NANODDP_WITH_CUDA
