#pragma once
// Building a connected Gloo context: the part of the Gloo process group that the allreduce
// benchmark's --raw mode shares, so that "raw Gloo" and "nanoddp over Gloo" differ only in the
// engine (Work objects, the worker thread, dtype dispatch), never in how they connected.
//
// Internal header: it includes Gloo's headers, so only targets that link `gloo` may use it.

#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/store.h"

namespace nanoddp::comm {

struct GlooConnection {
  std::shared_ptr<gloo::Context> context;
  // What the transport device was bound to, e.g. "hostname 127.0.0.1" or "interface eth0".
  std::string device_description;
  // Every rank's addresses as Gloo prints them ("[10.0.0.2]:41234"): its end of each pair's
  // connection and the addresses it published in the rendezvous, so that an error such as
  // "Connection closed by peer [10.0.0.2]:41234" can be turned into "rank 2" whichever side of
  // the pair connected. addresses[r] lists rank r's.
  std::vector<std::vector<std::string>> addresses;
};

// Creates the TCP device on the interface chosen by `options` (see ProcessGroupOptions), then
// connects every pair of ranks through `store` (keys under options.name), within
// options.timeout. A rank that never shows up is a CommError that names it.
GlooConnection connect_gloo(std::shared_ptr<Store> store, int rank, int size,
                            const ProcessGroupOptions& options);

// The IP rank `rank`'s pairs use (its own end of a pair, "[ip]:port"), for another transport to
// listen on beside Gloo: it then follows $NANODDP_SOCKET_IFNAME and MASTER_ADDR's route alike.
// Needs a connected group of two or more.
std::string own_ip(const GlooConnection& connection, int rank);

// The rank whose address appears in a Gloo error message, or -1; `address` receives the
// matched address.
int gloo_peer_from_message(const std::string& message,
                           const std::vector<std::vector<std::string>>& addresses,
                           std::string* address = nullptr);

}  // namespace nanoddp::comm
