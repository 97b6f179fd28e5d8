#pragma once
// The rendezvous key-value store: how the processes of a job find each other.
//
// Rank 0 hosts a TcpStoreServer on a background thread; every rank (rank 0 included) talks to
// it through a TcpStore client. Process groups exchange what they need to connect through it
// (Gloo's pair addresses, NCCL's unique id), and the launcher-independent parts of a job (who is
// alive, a shared step counter) can use it too. Every blocking call has a timeout: a store that
// never answers, or a key that never appears, is an error that names the key and the address,
// never a hang.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

using Bytes = std::vector<std::uint8_t>;

// A store operation failed: the server is unreachable, refused us, or a wait timed out.
class StoreError : public Error {
 public:
  using Error::Error;
};

// The server answered and refused this client (another protocol, or a wrong token): trying
// again would not change its mind.
class StoreRefused : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, std::span<const std::uint8_t> value) = 0;
  // Blocks until `key` exists, up to timeout(); then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (absent = 0); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Blocks until every key exists, up to `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Whether every key exists now (no blocking).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // If the value at `key` equals `expected` (an absent key equals an empty `expected`), stores
  // `desired`. Returns the value stored afterwards either way.
  virtual Bytes compare_set(const std::string& key, std::span<const std::uint8_t> expected,
                            std::span<const std::uint8_t> desired) = 0;
  // Removes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  // The values of `keys` as they are now, one per key, absent where a key is (no blocking).
  // One request to a TcpStore, however many keys: a launcher watching N nodes' heartbeats pays
  // one round trip per look, not 2 N. (PyTorch's Store::multi_get blocks for absent keys
  // instead.) This default asks key by key.
  virtual std::vector<std::optional<Bytes>> try_get_many(const std::vector<std::string>& keys);

  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;

  // Conveniences for text values.
  void set(const std::string& key, const std::string& value);
  std::string get_string(const std::string& key);
};

struct TcpStoreOptions {
  // Address the server binds to (rank 0) and clients connect to.
  std::string host = "127.0.0.1";
  // 0 on the server: pick a free port (read it back with TcpStoreServer::port()).
  std::uint16_t port = 29500;
  // Clients: how long they keep retrying to connect, and how long blocking calls wait.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Server: how long a new connection may take to finish its handshake (at most `timeout`).
  // Short: a client sends its hello as soon as it connects, and connections that never do
  // (a flood of idle ones) must not hold the server's file descriptors for long.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5);
  // Shared secret: when non-empty (default: $NANODDP_STORE_TOKEN), the server refuses clients
  // whose handshake does not carry it.
  std::string token;
  // Bounds that keep a bad or hostile client from exhausting the server. A request over them
  // costs its sender the connection (the client checks key and value sizes before sending, and
  // throws nanoddp::Error instead). max_keys bounds both the keys the server holds and the keys
  // of one wait / check. Connections: the server holds at most max_connections, and fewer
  // when its process's open-file limit (getrlimit) is lower: three quarters of the descriptors
  // still free at start, so the job's own files always find one. At the cap a new connection
  // replaces the oldest one still in its handshake, or is closed at once if there is none.
  std::size_t max_key_bytes = 4096;
  std::size_t max_value_bytes = 64u << 20;
  std::size_t max_keys = 1u << 20;
  std::size_t max_connections = 4096;
  // Clients: who serves the store and which settings name its address, for the hints in their
  // error messages ("did rank 0 exit?", "is MASTER_ADDR right?"). nanoddp-run's rendezvous store
  // is served by a launcher and named by --rdzv-endpoint.
  std::string server_role = "rank 0";
  std::string address_setting = "MASTER_ADDR";
  std::string port_setting = "MASTER_PORT";
};

// A snapshot of the server's state, for tests and diagnostics.
struct TcpStoreServerStats {
  std::size_t connections = 0;      // open client connections (handshake done or not)
  std::size_t parked = 0;           // clients blocked in get / wait
  std::size_t keys = 0;             // keys stored
  std::size_t buffered_bytes = 0;   // capacity of all connections' input and output buffers
  std::uint64_t dropped = 0;        // connections closed for bad bytes, refusals or overflow
  std::size_t max_connections = 0;  // the cap in force (options and the open-file limit)
};

// The server: binds host:port (that address only), serves every client on one background
// thread (poll-based, no thread per client), and shuts down (joining its thread) in its
// destructor; clients blocked in get / wait then see the connection close.
//
// A client blocked in get / wait is parked: its connection waits on the key without blocking
// the thread, and is answered when the key is set or its timeout passes. A client that breaks
// the protocol (garbage, a length over the limits, a wrong token, a hang-up mid-message) loses
// its connection and nothing else. A bind failure throws StoreError, e.g. "cannot start the
// store on 127.0.0.1:29500: address already in use (another job? pick another --master-port)".
class TcpStoreServer {
 public:
  explicit TcpStoreServer(const TcpStoreOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  std::uint16_t port() const;
  // As of the end of the server thread's latest loop iteration.
  TcpStoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The client. Connects with retries and exponential backoff (10 ms doubling to 1 s) until
// options.timeout, then fails with e.g. "cannot reach the store at 10.0.0.1:29500 after 30 s (is
// rank 0 running? is MASTER_ADDR right?)". A server that refuses the handshake (wrong or missing
// token, another protocol version) fails it at once, with the server's reason.
// Every send and receive has a deadline: timeout() for a request, a get / wait's own timeout
// (+2 s for the answer) for those. A get / wait the server times out names the missing keys; a
// server that goes quiet or closes the connection is a StoreError naming the operation, the
// key(s) and the address. After such a failure the connection is dropped and the next call
// connects again. Thread-safe (one request at a time on its connection; a thread blocked in
// get holds the others up, so give each waiting thread its own client).
// Values written by add() are decimal text ("42"), so get_string() reads counters too.
class TcpStore final : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, std::span<const std::uint8_t> value) override;
  using Store::set;
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  Bytes compare_set(const std::string& key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override;
  bool remove(const std::string& key) override;
  std::vector<std::optional<Bytes>> try_get_many(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override;
  void set_timeout(std::chrono::milliseconds timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Namespacing: every key gets "<prefix>/" in front (one prefix per process group and restart).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(const std::string& key, std::span<const std::uint8_t> value) override;
  using Store::set;
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  Bytes compare_set(const std::string& key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override;
  bool remove(const std::string& key) override;
  std::vector<std::optional<Bytes>> try_get_many(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return store_->timeout(); }
  void set_timeout(std::chrono::milliseconds timeout) override { store_->set_timeout(timeout); }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace nanoddp::comm
