#pragma once
// The network: how long one all-reduce of S bytes takes on N nodes x G GPUs, in the alpha-beta
// (latency-bandwidth) model, for NCCL's two classic algorithms.
//
// Notation: n = N*G ranks; alpha_intra, alpha_inter = latency of one step (hop) inside a node /
// across nodes; B_intra = one GPU's bandwidth to its node peers (NVLink through NVSwitch), B_nic
// = one GPU's NIC; every bandwidth is one direction and *effective* (what a collective reaches,
// not the line rate). beta = 1/B.
//
// Ring (reduce-scatter then all-gather; 2(n-1) steps, each rank sends 2(n-1)/n * S):
//   T_ring = launch + 2(n-1-N) alpha_intra + 2N alpha_inter + 2(n-1)/n * S / B_ring  (N > 1;
//            with G = 1 the 2(n-1) steps all cross nodes; on one node all 2(n-1) are intra)
//   B_ring = B_intra on one node; min(B_intra, G * B_nic) on several. The slowest link bounds
//   the ring: NCCL runs one ring (channel) per NIC, so the node's G NICs together carry what
//   leaves the node. The latency counts hops along the pipelined ring as NCCL's tuner does
//   (src/graph/tuning.cc: 2N of the 2(n-1) steps cross nodes). With one level (N = 1, or
//   alpha_intra = alpha_inter) it is the textbook 2(n-1) alpha + 2(n-1)/n S beta.
// Tree (NCCL's: a chain through the G GPUs of a node, a double binary tree across nodes; reduce
//   up, broadcast down, pipelined):
//   T_tree = launch + 2((G-1) alpha_intra + ceil(log2 N) alpha_inter)
//            + max(2S / B_intra  [G > 1],  V(N) / (G * B_nic)  [N > 1])
//   A GPU in the chain sends S up and S down (2S); across nodes each tree carries half of the
//   data, and a node that is interior in one tree and a leaf in the other sends V = 2S (N >= 3);
//   with N = 2 each node is the root of one tree and the leaf of the other: V = S. That is why
//   NCCL's tree beats the ring on two nodes when the NICs are the bottleneck.
// Auto: the faster of the two for each message, as NCCL's tuner picks per size; on a fitted
//   fabric (one measured transport, read as a ring) the ring.
// Hierarchical (nanoddp's CPU all-reduce across hosts, comm/hierarchical_allreduce.cpp): see
//   hierarchical_allreduce() below.
// n = 1: no communication, cost 0.
// Fitted fabrics: below the fitted window the ring is the measured times (Fabric::small_ms).

#include <string>
#include <utility>
#include <vector>

namespace nanoddp::sim {

enum class Algorithm { kRing, kTree, kAuto, kHierarchical };
Algorithm parse_algorithm(const std::string& name);  // "ring", "tree", "auto", "hier"
const char* algorithm_name(Algorithm algorithm);

struct Cluster {
  int nodes = 1;
  int gpus_per_node = 1;
  int world_size() const { return nodes * gpus_per_node; }
};

// Bandwidths in GB/s (1e9 bytes/s), one direction, per GPU; latencies in microseconds.
struct Fabric {
  std::string name = "custom";
  std::string description;
  double intra_bw_gbs = 0;  // GPU to its node peers
  double intra_lat_us = 0;  // per step inside a node
  double inter_bw_gbs = 0;  // per GPU: its NIC (the node has G of them)
  double inter_lat_us = 0;  // per step that crosses nodes
  double launch_us = 0;     // fixed cost of one collective (NCCL's baseLat)
  // GPUs per node in the systems the fabric shipped in (its NVSwitch domain); 0: not known
  // (custom values). More GPUs per node on a named fabric are refused (checks.h).
  int node_gpus = 0;
  // A fitted fabric (allreduce_fit.h): its line holds over the sizes it was fitted to, but a
  // small collective (the per-step sync of 2n floats, the hierarchical status flag) lies far
  // below them, where the line's intercept over-prices it 10x. `small_ms` holds the file's
  // measured times below the fitted window (median per size, ascending) and, last, the line at
  // the window's smallest size: a ring all-reduce of fewer bytes, at `measured_ranks` ranks, is
  // interpolated between them (the smallest size's time below it). Empty: the formulas alone.
  std::vector<std::pair<double, double>> small_ms;  // (bytes, ms)
  int measured_ranks = 0;
  double measured_min_bytes = 0;  // the smallest size the file measured; 0: not fitted
};

// The named fabrics (nvlink4-ib400, ...), with the sources of their numbers in docs/simulator.md.
const std::vector<Fabric>& named_fabrics();
// Throws SimError listing the known names.
const Fabric& find_fabric(const std::string& name);
// Throws SimError naming the flag when a bandwidth is not positive or a latency negative.
void check_fabric(const Fabric& fabric, const Cluster& cluster);

double ring_allreduce_ms(const Cluster& cluster, const Fabric& fabric, double bytes);
double tree_allreduce_ms(const Cluster& cluster, const Fabric& fabric, double bytes);

struct CollectiveTime {
  double ms = 0;
  Algorithm algorithm = Algorithm::kRing;  // the one that ran (never kAuto)
};
CollectiveTime allreduce_time(const Cluster& cluster, const Fabric& fabric, Algorithm algorithm,
                              double bytes);

// nanoddp's hierarchical all-reduce of S bytes on N hosts x K ranks, phase by phase as
// comm/hierarchical_allreduce.cpp runs it. Each phase is a one-level ring of its own transport:
//   within(s) = ring over the K ranks of one host, `intra` fabric (shared memory)
//   across(s) = ring over the N leaders, one per host, `inter` fabric (TCP)
// The buffer goes in pieces of 4 MiB (kPipelinePieceBytes). Per piece k, of s_k bytes:
//   1. within: w_k = w_{k-1} + within(s_k)          (the worker thread, all pieces first)
//   2. across: x_k = max(w_k, x_{k-1}) + across(s_k) (the leader's ring thread, a piece behind)
//   3. status: within(4 bytes), the leader's success flag to its host-mates
//   4. back:   the leader's result to the host-mates, a shared-memory all-reduce in 1 MiB
//              sub-pieces (kBackPieceBytes): the sum of within(sub) over them
// Steps 3-4 of piece k run on the worker thread after step 1 of every piece and after x_k:
//   t_k = max(t_{k-1}, x_k) + status + back(s_k),  t_{-1} = w_last;  the time is t_last.
// A host of one rank runs only across(S). Not modelled: the threads slowing each other while
// they overlap (the pipeline is taken as perfectly parallel), avg's division by the world size.
// `across_scale` multiplies every across(s): the step model's rates are the intra fit's, and a
// leaders' fit measured under another CPU share is brought to them (step_model.h).
struct HierarchicalTime {
  double within_ms = 0;  // step 1, all pieces
  double across_ms = 0;  // step 2, all pieces (the leaders' ring)
  double status_ms = 0;  // step 3, all pieces
  double back_ms = 0;    // step 4, all pieces
  double ms = 0;         // the whole operation, pipelined
  int pieces = 0;
};
inline constexpr double kHierPieceBytes = 4.0 * 1024 * 1024;
inline constexpr double kHierBackPieceBytes = 1024.0 * 1024;
// Throws SimError for a cluster of one host or of one rank per host (nanoddp does not use the
// hierarchical all-reduce there).
HierarchicalTime hierarchical_allreduce(const Cluster& cluster, const Fabric& intra,
                                        const Fabric& inter, double bytes,
                                        double across_scale = 1.0);

// nccl-tests' bus bandwidth of an all-reduce: bytes / time * 2(n-1)/n, in GB/s.
double bus_bandwidth_gbs(double bytes, double ms, int ranks);

}  // namespace nanoddp::sim
