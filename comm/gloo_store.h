#pragma once
// Lets Gloo rendezvous through our Store.
//
// Gloo's full-mesh connect (gloo::rendezvous::Context::connectFullMesh) publishes each rank's
// listening addresses under a key and waits for everybody else's. It talks to a
// gloo::rendezvous::Store; this adapter forwards those calls to a nanoddp Store (a TcpStore
// client, usually wrapped in a PrefixStore so that two groups or two restarts never read each
// other's keys).
//
// Internal header: it includes Gloo's headers, so only targets that link `gloo` may use it.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "nanoddp/comm/store.h"

namespace nanoddp::comm {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `key_timeout`: how long a wait for a rank's key may take, whatever timeout Gloo passes (its
  // context's, which connect_gloo lowers for the pair connect); zero: Gloo's.
  explicit GlooStore(std::shared_ptr<comm::Store> store,
                     std::chrono::milliseconds key_timeout = std::chrono::milliseconds(0));

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks until the key exists (up to the store's timeout), like Gloo's own stores.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Gloo passes its context timeout here; we honour it (unless key_timeout is set) rather than
  // the store's default.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<comm::Store> store_;
  std::chrono::milliseconds key_timeout_;
};

}  // namespace nanoddp::comm
