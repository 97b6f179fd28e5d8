// nanoddp-test-shm-setup-worker: one rank of a world of two, started by nanoddp-run, in which
// rank 1 dies in the middle of the shared-memory all-reduce set-up: after rank 0 created the
// segment /dev/shm/nanoddp-<pid>-<hex> and before rank 1 reported attaching to it. Rank 0 then
// waits for that report until the launcher stops it with SIGTERM, which skips the destructor
// that would unlink the name: only the launcher can remove the segment afterwards.
//
// Rank 0 runs the real nanoddp::comm::ShmAllreduce set-up. Rank 1 plays its side of the
// protocol by hand (a real rank cannot be stopped at that point from outside): it publishes the
// same hello a real rank does, prints the segment's name rank 0 published (the test looks for
// that file) and exits 3 without attaching.

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/comm/store.h"

using namespace nanoddp;

int main() {
  try {
    const comm::WorldInfo world = comm::world_from_env();
    if (world.world_size != 2) {
      fmt::print(stderr, "expected WORLD_SIZE=2, got {}\n", world.world_size);
      return 2;
    }
    comm::TcpStoreOptions options;
    options.host = world.master_addr;
    options.port = static_cast<std::uint16_t>(world.master_port);
    options.timeout = std::chrono::seconds(30);
    std::unique_ptr<comm::TcpStoreServer> server;
    if (world.rank == 0) server = std::make_unique<comm::TcpStoreServer>(options);
    comm::TcpStore store(options);
    if (world.rank == 0) {
      // Blocks in the set-up until rank 1 reports (it never does) or the timeout passes.
      comm::ShmAllreduce shm(store, 0, 2, std::chrono::seconds(30), "setup");
      fmt::print("rank 0: set-up ended, shared memory {}\n", shm.enabled() ? "on" : "off");
      return 1;  // the launcher should have stopped this rank long before
    }
    // Start time 0: rank 0 cannot tell whether this process is alive, so it simply waits.
    store.set("setup/shm/hello/1",
              fmt::format("1\n{}\n0\n{}", getpid(), comm::shm_host_identity()));
    const std::string segment = store.get_string("setup/shm/segment");
    fmt::print("rank 1 saw segment {} and dies before attaching\n", segment);
    std::fflush(stdout);
    _exit(3);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
