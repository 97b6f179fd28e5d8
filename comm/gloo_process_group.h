#pragma once
// The Gloo process group: collectives over TCP (or shared memory) on CPU tensors.
//
// How an op runs. The caller (the training loop, the DDP Reducer's autograd hook) must not wait
// for the network, so every op is only *queued* here: allreduce() checks its arguments, takes
// the next sequence number and returns a Work at once. One worker thread owned by the group
// pops the queue strictly in FIFO order and runs each op as one blocking Gloo call. FIFO on
// one thread is what keeps every rank's Gloo calls in the same order as their issue order —
// the property all collectives depend on — while the caller computes the next bucket's
// gradients. Work::wait() is where the caller finally joins the op.
//
// Same host, no sockets. When every rank runs on this host, allreduce, reduce_scatter and
// allgather bypass TCP and go through a shared-memory segment (shm_allreduce.h) — still on the
// worker thread, so everything above holds. $NANODDP_SHM=0 turns it off; backend_name() says
// "gloo+shm" when it is on. Ranks on several hosts, some sharing one: allreduce goes
// hierarchical (hierarchical_allreduce.h: shared memory within each host, TCP across one leader
// per host; "gloo+shm+hier"); $NANODDP_HIER=0 keeps the flat ring. reduce_scatter and allgather
// take the flat TCP path there.
//
// Why one Gloo API. Debian's Gloo has two generations of collectives: the legacy algorithm
// classes (gloo::AllreduceRing, ...) and the options-style functions (gloo::allreduce with
// gloo::AllreduceOptions). Mixing them on one context shrinks its socket buffers and costs a
// 10x slowdown, so this group uses only the options-style functions (allreduce, broadcast,
// allgather, barrier) and the transport under them: Gloo has no options-style reduce-scatter,
// so reduce_scatter is a ring of our own on Gloo's unbound buffers (gloo_collectives.cpp),
// moving the optimal (n-1)/n of the input per rank.
//
// Failures. Every op has the group's timeout. A Gloo exception (a timeout, a peer that closed
// its socket) becomes a CommError naming the op, its sequence number, element count, dtype and
// — when Gloo's message gives its address — the peer rank. After one failure the connection
// state is unknown, so every later op fails at once with a message pointing at the first.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nanoddp/comm/process_group.h"

namespace nanoddp::comm {

class GlooProcessGroup final : public ProcessGroup {
 public:
  // Connects to every other rank through `store` (throws CommError on timeout).
  GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options);
  // Lets queued ops finish (or fail fast after a failure), joins the worker thread, then
  // closes the connections. Never hangs past one op's timeout.
  ~GlooProcessGroup() override;
  GlooProcessGroup(const GlooProcessGroup&) = delete;
  GlooProcessGroup& operator=(const GlooProcessGroup&) = delete;

  // "gloo+shm+hier" when allreduce is hierarchical, "gloo+shm" when it goes through shared
  // memory, else "gloo".
  std::string backend_name() const override;

  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> allreduce_coalesced(std::vector<Tensor>& tensors,
                                            ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output,
                                       ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> barrier() override;

  // Whether allreduce, reduce_scatter and allgather go through a shared-memory segment: every
  // rank is on this host and $NANODDP_SHM is not "0" (shm_allreduce.h). Broadcast and barrier
  // always use TCP.
  bool uses_shared_memory() const;
  // Whether allreduce, reduce_scatter, allgather and barrier go around nanoddp's own TCP ring
  // (tcp_ring.h): no shared memory, not hierarchical, and no rank set $NANODDP_TCP_RING=0.
  bool uses_tcp_ring() const;
  // How allreduce moves data, for benchmark headers: "shared memory (same host; ...)",
  // "TCP ring (address ...; to rank ..., from rank ...; why not shared memory)" for nanoddp's
  // ring, "Gloo's TCP ring (...)", or "hierarchical (...)".
  std::string allreduce_transport() const;
  // How the TCP device was bound, e.g. "address 127.0.0.1 (the route to 127.0.0.1)".
  const std::string& device_description() const;
  // Ops issued so far (the last sequence number handed out).
  std::uint64_t ops_issued() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanoddp::comm
