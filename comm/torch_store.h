#pragma once
// A client for PyTorch's TCPStore: the store torchrun's agent serves, which its workers use
// when it starts them with TORCHELASTIC_USE_AGENT_STORE=True (torchrun's static rendezvous:
// the store is on MASTER_ADDR:MASTER_PORT, and nothing else may bind there). The wire protocol
// is torch 1.13's (torch_store_protocol.h).
//
// It behaves as TcpStore does: connects with retries (10 ms doubling to 1 s) until the timeout
// (after the store dropped a connection, one attempt: the agent had started, so a refusal means
// it is gone); every request has a deadline; a failure is a StoreError naming the operation,
// the key(s) and the address; after one the connection is dropped and the next call connects
// again (PyTorch's server has no timeout of its own for a wait, so a wait that times out leaves
// an answer on its way). Thread-safe, one request at a time. torchrun's own keys live beside
// ours, so callers put a prefix in front of every key (init_distributed uses "nanoddp/").

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "nanoddp/comm/store.h"

namespace nanoddp::comm {

struct TorchStoreOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
  // How long connecting keeps retrying, and how long each blocking call waits.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Larger values in an answer are refused (the connection is dropped), as are larger values
  // to send (nanoddp::Error).
  std::size_t max_value_bytes = 64u << 20;
};

class TorchStore final : public Store {
 public:
  explicit TorchStore(const TorchStoreOptions& options);
  ~TorchStore() override;

  void set(const std::string& key, std::span<const std::uint8_t> value) override;
  using Store::set;
  // Waits for the key (up to timeout()), then reads it, as PyTorch's client does.
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  // PyTorch's server answers a compare_set on an absent key with a non-empty `expected` by
  // returning `expected` (storing nothing), not the (absent) stored value.
  Bytes compare_set(const std::string& key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override;
  bool remove(const std::string& key) override;
  std::chrono::milliseconds timeout() const override;
  void set_timeout(std::chrono::milliseconds timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanoddp::comm
