#pragma once
// A real TCP store served by this test process on a free loopback port, for tests that run ranks
// as threads (each thread gets its own client, as each process would).

#include <chrono>
#include <memory>

#include "nanoddp/comm/store.h"

namespace nanoddp::testing {

struct LocalStore {
  std::unique_ptr<comm::TcpStoreServer> server;
  comm::TcpStoreOptions options;
  explicit LocalStore(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    options.host = "127.0.0.1";
    options.port = 0;
    options.timeout = timeout;
    server = std::make_unique<comm::TcpStoreServer>(options);
    options.port = server->port();
  }
  std::shared_ptr<comm::Store> client() const { return std::make_shared<comm::TcpStore>(options); }
};

}  // namespace nanoddp::testing
