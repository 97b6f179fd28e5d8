// One exception root: every failure the library reports derives from nanoddp::Error, so an
// embedding program can catch them all with one handler and still tell them apart.

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <type_traits>
#include <vector>

#include "nanoddp/comm/init.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/error.h"

using namespace std::chrono_literals;

static_assert(std::is_base_of_v<nanoddp::Error, nanoddp::CudaError>);
static_assert(std::is_base_of_v<nanoddp::Error, nanoddp::comm::CommError>);
static_assert(std::is_base_of_v<nanoddp::comm::CommError, nanoddp::comm::ShmError>);
static_assert(std::is_base_of_v<nanoddp::Error, nanoddp::comm::StoreError>);

TEST_CASE("errors: a store timeout is a StoreError that catch (nanoddp::Error&) catches") {
  using nanoddp::comm::TcpStore;
  using nanoddp::comm::TcpStoreOptions;
  using nanoddp::comm::TcpStoreServer;
  TcpStoreServer server(TcpStoreOptions{.host = "127.0.0.1", .port = 0, .timeout = 5s});
  TcpStore client(TcpStoreOptions{.host = "127.0.0.1", .port = server.port(), .timeout = 5s});
  bool caught_as_root = false;
  std::string message;
  try {
    client.wait({"never-set"}, 100ms);
  } catch (const nanoddp::Error& e) {
    caught_as_root = dynamic_cast<const nanoddp::comm::StoreError*>(&e) != nullptr;
    message = e.what();
  }
  CHECK(caught_as_root);
  CHECK(message.find("never-set") != std::string::npos);  // names the key it waited for
}

TEST_CASE("errors: bad input to the engine is a nanoddp::Error") {
  CHECK_THROWS_AS(nanoddp::Tensor::empty({-1, 3}), nanoddp::Error);
}

TEST_CASE("errors: an int64 tensor handed to a collective is refused, not read as bfloat16") {
  // int64 tensors came with class targets (cross_entropy); the groups' reductions read float32
  // or bfloat16 only, and took any other dtype for bfloat16.
  nanoddp::comm::Distributed dist =
      nanoddp::comm::init_distributed(nanoddp::comm::WorldInfo{},
                                      {.backend = "gloo", .device = nanoddp::Device::cpu()});
  const std::vector<std::int64_t> values = {1, 2, 3};
  nanoddp::Tensor classes = nanoddp::Tensor::from_int64(values, {3});
  std::string message;
  try {
    dist.group->allreduce(classes, nanoddp::comm::ReduceOp::kSum)->wait();
  } catch (const nanoddp::Error& e) {
    message = e.what();
  }
  CHECK(message.find("int64") != std::string::npos);
  CHECK(message.find("float32 and bfloat16") != std::string::npos);
}
