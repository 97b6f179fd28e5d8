// One exception root: every failure the library reports derives from nanoddp::Error, so an
// embedding program can catch them all with one handler and still tell them apart.

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <type_traits>

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
