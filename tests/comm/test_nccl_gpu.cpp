// The NCCL process group on a real GPU, world of one (a second rank would need a second GPU:
// NCCL refuses two ranks on one device). A world of one still runs the whole path: unique id
// through the store, non-blocking communicator init, the communication stream and its events,
// the watchdog, and an orderly destroy. Runs only where a GPU is (gpu_main.cpp skips with 77).

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <doctest/doctest.h>

#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/tensor.h"
#include "support/subprocess.h"

namespace {

using nanoddp::Device;
using nanoddp::Tensor;
using nanoddp::comm::ReduceOp;

struct NcclWorldOfOne {
  std::unique_ptr<nanoddp::comm::TcpStoreServer> server;
  std::shared_ptr<nanoddp::comm::ProcessGroup> pg;
  NcclWorldOfOne() {
    nanoddp::comm::TcpStoreOptions store_options;
    store_options.host = "127.0.0.1";
    store_options.port = 0;
    store_options.timeout = std::chrono::seconds(60);
    server = std::make_unique<nanoddp::comm::TcpStoreServer>(store_options);
    store_options.port = server->port();
    auto store = std::make_shared<nanoddp::comm::TcpStore>(store_options);
    nanoddp::comm::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    options.device_index = 0;
    pg = nanoddp::comm::make_nccl_process_group(store, 0, 1, options);
  }
};

Tensor on_gpu(const std::vector<float>& values) {
  return Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}, Device::cuda(0));
}

}  // namespace

TEST_CASE("nccl: world of one, allreduce / broadcast / allgather / reduce_scatter / barrier") {
  NcclWorldOfOne world;
  auto& pg = *world.pg;
  CHECK(pg.backend_name() == "nccl");

  Tensor a = on_gpu({1, 2, 3, 4, 5});
  auto w1 = pg.allreduce(a, ReduceOp::kSum);
  CHECK(w1->sequence_number() == 1);
  w1->wait();  // the compute stream waits; to_vector copies on the compute stream
  CHECK(a.to_vector() == std::vector<float>{1, 2, 3, 4, 5});

  Tensor b = on_gpu({2, 4, 6});
  pg.allreduce(b, ReduceOp::kAvg)->wait();  // ncclAvg over one rank: unchanged
  CHECK(b.to_vector() == std::vector<float>{2, 4, 6});
  pg.allreduce(b, ReduceOp::kMax)->wait();
  pg.allreduce(b, ReduceOp::kMin)->wait();
  CHECK(b.to_vector() == std::vector<float>{2, 4, 6});

  Tensor c = on_gpu({7, 8, 9});
  auto w = pg.broadcast(c, 0);
  w->wait();
  CHECK(c.to_vector() == std::vector<float>{7, 8, 9});

  Tensor out = Tensor::zeros({3}, Device::cuda(0));
  pg.allgather(c, out)->wait();
  CHECK(out.to_vector() == std::vector<float>{7, 8, 9});

  Tensor rs = Tensor::zeros({3}, Device::cuda(0));
  pg.reduce_scatter(c, rs, ReduceOp::kSum)->wait();
  CHECK(rs.to_vector() == std::vector<float>{7, 8, 9});

  std::vector<Tensor> list = {on_gpu({1}), on_gpu({2, 3}), Tensor::zeros({0}, Device::cuda(0))};
  pg.allreduce_coalesced(list, ReduceOp::kSum)->wait();
  CHECK(list[1].to_vector() == std::vector<float>{2, 3});

  Tensor bf_host = Tensor::empty({4}, Device::cpu(), nanoddp::DType::kBF16);
  auto* bits = static_cast<std::uint16_t*>(bf_host.raw_data());
  for (int i = 0; i < 4; ++i) bits[i] = 0x4040;  // 3.0 in bfloat16
  Tensor bf = bf_host.to(Device::cuda(0));
  pg.allreduce(bf, ReduceOp::kSum)->wait();
  Tensor bf_back = bf.to(Device::cpu());
  CHECK(static_cast<const std::uint16_t*>(bf_back.raw_data())[3] == 0x4040);

  auto last = pg.barrier();
  last->wait();  // a barrier's wait blocks the host
  CHECK(last->is_completed());
  CHECK(last->error() == nullptr);
  CHECK(last->sequence_number() == 10);  // the tenth op of this group
}

TEST_CASE("nccl: CPU tensors are refused with a pointer to Gloo") {
  NcclWorldOfOne world;
  Tensor cpu = Tensor::zeros({4});
  CHECK_THROWS_AS(world.pg->allreduce(cpu), nanoddp::Error);
}

TEST_CASE("gloo: CUDA tensors are refused with a pointer to NCCL") {
  nanoddp::comm::TcpStoreOptions store_options;
  store_options.host = "127.0.0.1";
  store_options.port = 0;
  nanoddp::comm::TcpStoreServer server(store_options);
  store_options.port = server.port();
  nanoddp::comm::ProcessGroupOptions options;
  options.master_addr = "127.0.0.1";
  auto pg = nanoddp::comm::make_gloo_process_group(
      std::make_shared<nanoddp::comm::TcpStore>(store_options), 0, 1, options);
  Tensor gpu = Tensor::zeros({4}, Device::cuda(0));
  try {
    pg->allreduce(gpu);
    FAIL("no error");
  } catch (const nanoddp::Error& e) {
    CHECK(std::string(e.what()).find("use the NCCL backend for cuda") != std::string::npos);
  }
}

// The child of the kernel-fault test below (gpu_main.cpp runs it when NANODDP_GPU_TEST_CHILD is
// "kernel-fault"): a GEMM that stores through a bad pointer, then an all-reduce that waits for
// it on the communication stream; the main thread then makes no CUDA call, leaving the
// watchdog to notice. The faulting GEMM's first blocks store within a millisecond, while the
// all-reduce's issue (events, NCCL's lazy kernel loading) may take longer: so valid GEMMs are
// queued first (a hundred milliseconds and more of them), and the fault comes after the issue
// has returned. A host-side detection during the issue is printed, not left to std::terminate.
int nccl_kernel_fault_child() {
  NcclWorldOfOne world;
  const std::int64_t n = 4096;
  Tensor a = Tensor::zeros({n, n}, Device::cuda(0)), b = Tensor::zeros({n, n}, Device::cuda(0));
  Tensor ok = Tensor::zeros({n, n}, Device::cuda(0));
  Tensor grads = Tensor::zeros({1024}, Device::cuda(0));
  nanoddp::Stream::compute(Device::cuda(0)).synchronize();
  auto& backend = nanoddp::backend_for(Device::cuda(0));
  for (int i = 0; i < 20; ++i) {
    backend.gemm(nanoddp::Transpose::kNo, nanoddp::Transpose::kNo, n, n, n, 1.0f, a.data(),
                 b.data(), 0.0f, ok.data());
  }
  auto* bad_c = reinterpret_cast<float*>(std::uintptr_t{16});  // no device memory there
  backend.gemm(nanoddp::Transpose::kNo, nanoddp::Transpose::kNo, n, n, n, 1.0f, a.data(), b.data(),
               0.0f, bad_c);
  try {
    world.pg->allreduce(grads, ReduceOp::kSum);
  } catch (const std::exception& e) {
    std::printf("the all-reduce's issue threw (the fault came too early): %s\n", e.what());
    return 4;
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));  // the watchdog ends the process first
  std::printf("the watchdog did not end the process\n");
  return 1;
}

TEST_CASE("nccl: a kernel fault is reported as a CUDA error with the last op, not as NCCL's") {
  char self[4096] = {};
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(len > 0);
  const auto result = nanoddp::testing::run_process(
      {std::string(self, static_cast<std::size_t>(len))},
      {.env = {{"NANODDP_GPU_TEST_CHILD", "kernel-fault"}}, .timeout = std::chrono::seconds(90)});
  INFO(result.output);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code == 70);  // the watchdog's exit code
  CHECK(result.output.find("a CUDA error on cuda:0") != std::string::npos);
  CHECK(result.output.find("not a communication error") != std::string::npos);
  CHECK(result.output.find("The last op enqueued on the device: gemm") != std::string::npos);
  CHECK(result.output.find("allreduce #1") != std::string::npos);
  CHECK(result.output.find("NCCL watchdog: ") == std::string::npos);
}

#endif  // NANODDP_WITH_CUDA
