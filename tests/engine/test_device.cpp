// Which device a process picks (choose_device, a pure function of the request, the local rank
// and the visible device count), and what a CPU-only build says when asked to make a GPU
// current.

#include <doctest/doctest.h>

#include <string>

#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"

using namespace nanoddp;

TEST_CASE("device choice: 'cuda' is the local rank modulo the visible devices") {
  // Eight ranks on a node with eight GPUs: one each.
  for (int local_rank = 0; local_rank < 8; ++local_rank) {
    CHECK(choose_device("cuda", local_rank, 8).device == Device::cuda(local_rank));
  }
  // srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank: each task sees one device,
  // cuda:0, while LOCAL_RANK runs 0-7.
  for (int local_rank = 0; local_rank < 8; ++local_rank) {
    CHECK(choose_device("cuda", local_rank, 1).device == Device::cuda(0));
  }
  // More ranks than devices share them round-robin.
  const DeviceChoice shared = choose_device("cuda", 5, 4);
  CHECK(shared.device == Device::cuda(1));
  CHECK(shared.why == "local rank 5 modulo 4 visible CUDA devices");
  CHECK(choose_device("cuda", 3, 1).why == "local rank 3 modulo 1 visible CUDA device");
}

TEST_CASE("device choice: an explicit cuda:N or cpu is kept, whatever the rank") {
  CHECK(choose_device("cuda:2", 7, 1).device == Device::cuda(2));  // require_device judges it
  CHECK(choose_device("cuda:2", 7, 1).why == "requested");
  CHECK(choose_device("cuda:0", 3, 8).device == Device::cuda(0));
  CHECK(choose_device("cpu", 3, 8).device == Device::cpu());
}

TEST_CASE("device choice: no visible device leaves cuda:0 for require_device to explain") {
  const DeviceChoice none = choose_device("cuda", 3, 0);
  CHECK(none.device == Device::cuda(0));
  CHECK(none.why == "no visible CUDA device");
  CHECK_THROWS_AS(choose_device("gpu", 0, 1), Error);
  CHECK_THROWS_AS(choose_device("cuda:-1", 0, 1), Error);
}

TEST_CASE("set_current_device: the CPU is a no-op, a GPU without CUDA says why") {
  CHECK_NOTHROW(set_current_device(Device::cpu()));
  if (cuda_device_count() > 0) return;  // a GPU machine: nothing to refuse
  try {
    set_current_device(Device::cuda(0));
    FAIL("set_current_device(cuda:0) succeeded without a GPU");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("cuda") != std::string::npos);
  }
}

TEST_CASE("the last device op is remembered for fault messages") {
  note_device_op("gemm");
  CHECK(std::string(last_device_op()) == "gemm");
  note_device_op("adamw_step");
  CHECK(std::string(last_device_op()) == "adamw_step");
}
