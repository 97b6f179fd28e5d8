#pragma once
// Hierarchical all-reduce: for a job whose ranks span several hosts, some of which run more
// than one rank (Horovod's and NCCL's two-level all-reduce, on the CPU).
//
// Why. The flat TCP ring passes every byte through a socket at every hop, also between two
// ranks on one machine: with 2 hosts x 2 ranks each rank sends 2(n-1)/n = 1.5x the buffer
// through the kernel, and every rank's CPU does that socket work. Two levels instead:
//
//   1. reduce within each host: the host's ranks all-reduce through shared memory
//      (ShmAllreduce, the same path one host uses alone); no socket on this step;
//   2. all-reduce across hosts: one leader per host (its lowest rank) runs a TCP ring among the
//      leaders only (nanoddp's own, tcp_ring.h, as the flat group's; Gloo's when any rank sets
//      $NANODDP_TCP_RING=0); with H hosts each leader sends 2(H-1)/H of the buffer, and the other
//      ranks send nothing;
//   3. broadcast within each host: the leader's result goes back to its host-mates through
//      the same shared segment.
// Large buffers are pipelined in 4 MiB pieces: the leader's ring runs on a thread of its own,
// one piece behind the host's shared-memory steps, so the network and memory work overlap.
//
// Who is on which host. Every rank publishes shm_host_identity() (host name, kernel boot id,
// network namespace): ranks whose identities are equal share a host. The host name alone is
// not enough: two network namespaces (containers, tests/multinode) share the name and the boot
// id, but are separate "machines" on the network, and are treated as such.
//
// Chosen when it helps: more than one host, and fewer hosts than ranks. Off, on every rank
// alike, when any rank sets $NANODDP_HIER=0 (the flat ring, for comparison) or $NANODDP_SHM=0
// (no shared memory at all), or when a host's ranks cannot map a shared segment; rank 0 then
// says why in one line on stderr. Every rank decides from the same published facts.
//
// Rounding. A sum is added up in another order than the flat ring's: within a host in local
// rank order (each element once, by the shared-memory path), then across hosts by the ring
// (for 2 hosts one addition, which commutes). Each step is exact to float rounding, so the result
// equals the flat ring's to within its rounding (test: tests/multinode/hierarchical.sh); every
// rank ends with the same bits, because only the leaders' ring computes the final sum and the
// broadcast copies it exactly (see hierarchical_allreduce.cpp).
//
// Failures end every rank with a message: a failed shared-memory step is reported by the ranks
// of that host (a dead peer at once, a stuck one after the timeout); a failed inter-host step is
// reported by the leader, and its host-mates receive that message (through the store) instead of
// waiting. No wait is longer than twice the group's timeout.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/engine/dtype.h"

namespace nanoddp::comm {

// A hierarchical all-reduce failed; what() says in which step and why, with global ranks.
class HierarchicalError : public CommError {
 public:
  using CommError::CommError;
};

// Ranks grouped by host: hosts[h] lists host h's ranks in ascending order, and hosts are ordered
// by their lowest rank (so host 0 holds rank 0, and each host's leader is hosts[h][0]).
struct HostLayout {
  std::vector<std::vector<int>> hosts;
  int host_of(int rank) const;
  // "2 hosts: ranks 0-1 | 2-3"
  std::string describe() const;
};
// identities[r] is rank r's shm_host_identity(); equal strings are one host.
HostLayout group_by_host(const std::vector<std::string>& identities);

// What $NANODDP_HIER says: "0" forces the flat ring, "1" (or unset, or empty) lets the group
// choose.
// Anything else is an Error naming the variable.
bool hierarchical_wanted_from_env(const char* value);

class HierarchicalAllreduce {
 public:
  // Collective: every rank of the group constructs one at the same point (after the group's
  // own Gloo connection), with the same options.name (keys live under "<name>/hier/"). Never
  // throws for a topology or setting that rules it out (enabled() is then false); throws
  // StoreError if the store fails, CommError if the leaders cannot connect, Error for a bad
  // $NANODDP_HIER on any rank.
  HierarchicalAllreduce(std::shared_ptr<Store> store, int rank, int size,
                        const ProcessGroupOptions& options);
  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  bool enabled() const;
  // Why not, when the topology called for it but it is off ("NANODDP_HIER=0 on rank 2"), or
  // empty.
  const std::string& fallback_reason() const;
  // For benchmark headers: "2 hosts: ranks 0-1 | 2-3; shared memory within a host (512 KiB
  // chunks), TCP ring across the leaders (ranks 0, 2; address ...)".
  std::string describe() const;

  // In place over `data` (from `input` into `data`, when given): `count` elements of float32 or
  // bfloat16. Runs on the group's worker thread. Throws HierarchicalError (after which the
  // group must not use it again).
  void run(void* data, const void* input, std::size_t count, DType dtype, ReduceOp op,
           std::uint64_t seq);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanoddp::comm
