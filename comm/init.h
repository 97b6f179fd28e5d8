#pragma once
// One call from "I was launched" to "I have a process group": reads nothing itself (pass
// world_from_env()), starts the store server on rank 0, connects every rank's store client and
// builds the group.
//
//   auto world = comm::world_from_env();
//   auto dist = comm::init_distributed(world, {.backend = "auto", .device = device});
//   dist.group->allreduce(grad)->wait();

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/engine/device.h"

namespace nanoddp::comm {

struct DistributedOptions {
  // "gloo", "nccl", or "auto" (nccl for a cuda device, gloo for the cpu).
  std::string backend = "auto";
  // This rank's device; for NCCL usually cuda:LOCAL_RANK.
  Device device = Device::cpu();
  // Deadline of the rendezvous and of every collective.
  std::chrono::milliseconds timeout = default_timeout();
  // Gloo's network interface ("" = the one that reaches MASTER_ADDR).
  std::string interface;
  // false: the store and the check-in only, no group (`group` stays null; create_group below
  // makes it later). For a program that compares something through the job's store before the
  // group connects, or builds its own connections (nanoddp-bench-allreduce and its --raw): it
  // joins the job as every rank does, so its peers' check-in and refusals reach it.
  bool make_group = true;
};

// Everything a distributed job holds on to. Members are destroyed in reverse order: the group
// first (its worker thread joined, its sockets closed), then the store client, then rank 0's
// server — after every rank has said it is done (see ~Distributed), so no rank loses the
// store while it still needs it.
struct Distributed {
  WorldInfo world;
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
  std::shared_ptr<Store> store;            // this restart's namespace ("restart<N>/...")
  std::shared_ptr<ProcessGroup> group;     // null with DistributedOptions::make_group = false

  Distributed() = default;
  Distributed(Distributed&&) = default;
  Distributed& operator=(Distributed&&) = default;
  ~Distributed();

  // This rank is ending on a failure after set-up (a collective failed, a peer may be dead):
  // rank 0 does not keep the store up for the others' check-out, which a dead peer never makes
  // (the wait held a failed rank for up to 30 s after it reported the failure). Not for a
  // failure during set-up: the others may still be reading what rank 0 published there (the
  // world sizes that name a mismatch).
  void abandon() { check_out_ = CheckOut::kSkip; }
  // This rank's set-up failed: a peer died or did not answer, or the ranks disagree on the
  // world size. Rank 0 keeps the store up for the check-out only min(timeout / 2, 3 s), for
  // peers failing at the same moment to say why, instead of min(timeout, 30 s) for a peer that
  // never checks out. init_distributed does this itself when its set-up fails.
  void abandon_setup() {
    if (check_out_ == CheckOut::kWait) check_out_ = CheckOut::kBrief;
  }

 private:
  enum class CheckOut { kWait, kBrief, kSkip };
  CheckOut check_out_ = CheckOut::kWait;
};

// Whether `e` is a communication failure — a peer that died or did not answer in time, a store
// that is gone or silent (CommError, StoreError) — rather than bad input or settings. A program
// exits 1 for it, not 2 (a usage error, which launchers do not restart).
bool is_communication_failure(const std::exception& e);

// Throws an Error for a bad backend/device combination or when rank 0 cannot serve the store on
// MASTER_ADDR:MASTER_PORT (a port in use, an address of another machine: usage errors),
// StoreError when the store cannot be reached, CommError when the group cannot connect within
// the timeout.
// Started by nanoddp-run (world.launcher_pid != 0), the process first ties its life to the
// launcher's: SIGTERM when the launcher dies (Linux's parent-death signal), and an Error at once
// if the launcher is gone already.
Distributed init_distributed(const WorldInfo& world, const DistributedOptions& options = {});

// Step 4 of init_distributed, for one made with `make_group = false`: the backend's process
// group over `dist.store`. Throws as init_distributed does (and marks the set-up abandoned).
void create_group(Distributed& dist, const DistributedOptions& options);

// For a process of a multi-rank job that fails before it joins (init_distributed): a bad flag,
// an output path it cannot write, an invalid RANK. It tells the job's store, so that the ranks
// that did start stop at once in their check-in with `why` (their Error names this process),
// instead of waiting their whole timeout for a rank that never comes. Rank 0 serves the store
// for this, until every other rank has read it or `bound` passes; another rank tries to reach
// rank 0's store for at most `bound` (either way at most NANODDP_TIMEOUT_S). Best effort, nothing
// thrown: no MASTER_ADDR/MASTER_PORT (or a world of one, or torchrun's agent store: its agent stops
// the others) means no one to tell. nanoddp-run and torchrun stop the others themselves; this is
// for ranks started by hand, or by a launcher that leaves the others running.
void tell_peers_setup_failed(const std::string& why,
                             std::chrono::milliseconds bound = std::chrono::seconds(10),
                             const EnvLookup& env = process_env());

// "gloo" or "nccl": what "auto" (or an explicit choice) means for `device`.
std::string resolve_backend(const std::string& backend, Device device);

}  // namespace nanoddp::comm
