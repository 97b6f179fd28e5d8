// Host synchronizations (engine/host_sync.h): every read of device data is counted once, on
// every device alike, and a training step reads nothing back.

#include <doctest/doctest.h>

#include <vector>

#include "nanoddp/engine/host_sync.h"
#include "nanoddp/engine/tensor.h"
#include "nn/host_sync_step.h"

using namespace nanoddp;

TEST_CASE("host sync: reading values and uploading a vector count once each, ops count none") {
  const std::int64_t start = host_sync_count();
  Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  CHECK(host_sync_count() == start + 1);
  CHECK(last_host_sync_reason() == "Tensor::from_vector");
  Tensor u = Tensor::zeros({3});
  u.copy_from(t);
  u.fill(2.0f);
  CHECK(host_sync_count() == start + 1);
  CHECK(u.to_vector() == std::vector<float>{2, 2, 2});
  CHECK(host_sync_count() == start + 2);
  CHECK(last_host_sync_reason() == "Tensor::to_vector");
  // item() reads through to_vector(): one synchronization, not two.
  CHECK(Tensor::full({}, 5.0f).item() == 5.0f);
  CHECK(host_sync_count() == start + 3);
  {
    const HostSyncPoint outer("outer");
    const HostSyncPoint inner("inner");
    CHECK(last_host_sync_reason() == "outer");
  }
  CHECK(host_sync_count() == start + 4);
}

TEST_CASE("host sync: a training step (forward, backward, SGD step) reads nothing back") {
  testing::HostSyncStep run(Device::cpu());
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    CHECK(run.step() == 0);
  }
}
