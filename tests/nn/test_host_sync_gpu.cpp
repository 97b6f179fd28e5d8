// The GPU twin of test_host_sync.cpp: a training step on cuda:0 never makes the host wait, and
// an upload from pinned memory returns without waiting. Runs only where a GPU is (gpu_main.cpp
// skips with 77).

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/tensor.h"
#include "nn/host_sync_step.h"

using namespace nanoddp;

TEST_CASE("gpu host sync: a training step on cuda:0 makes no host synchronization") {
  testing::HostSyncStep run(Device::cuda(0));
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    CHECK(run.step() == 0);
  }
  Stream::compute(Device::cuda(0)).synchronize();
}

TEST_CASE("gpu host sync: an upload from pinned memory is enqueued, not waited for") {
  const std::vector<float> values = {1, 2, 3, 4};
  PinnedBuffer staging(values.size() * sizeof(float));
  CHECK(staging.pinned());
  std::memcpy(staging.data(), values.data(), staging.size());
  Tensor t = Tensor::zeros({4}, Device::cuda(0));
  const std::int64_t before = host_sync_count();
  upload_async(t.raw_data(), Device::cuda(0), staging.data(), staging.size());
  CHECK(host_sync_count() == before);
  CHECK(t.to_vector() == values);  // stream order: the read comes after the copy
}

TEST_CASE("gpu host sync: an upload on a stream of its own is ordered by an event, not a wait") {
  const Device gpu = Device::cuda(0);
  const std::vector<float> values = {5, 6, 7};
  PinnedBuffer staging(values.size() * sizeof(float));
  std::memcpy(staging.data(), values.data(), staging.size());
  Tensor t = Tensor::zeros({3}, gpu);
  const Stream uploads = Stream::create(gpu);
  Event ready(gpu), copied(gpu);
  ready.record(Stream::compute(gpu));  // the zeros are written before the copy lands
  ready.block(uploads);
  const std::int64_t before = host_sync_count();
  upload_async_on(uploads, t.raw_data(), staging.data(), staging.size());
  copied.record(uploads);
  copied.block(Stream::compute(gpu));
  CHECK(host_sync_count() == before);
  CHECK(t.to_vector() == values);  // read on the compute stream, after the wait
}

#endif  // NANODDP_WITH_CUDA
