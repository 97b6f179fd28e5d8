#pragma once
// One DDP training step, predicted: a compute profile, the Reducer's buckets, the network's
// all-reduce times and the replay of backward with its collectives (timeline.h).
//
//   step = forward + backward + exposed comm + sync + optimizer + other
//
// where backward is the replayed backward's compute (longer than the profile's only with an
// overlap slowdown), exposed comm is what finalize waits for, and sync is nanoddp-train's
// per-step all-reduce of every rank's loss and NaN flag (2n floats; it makes all ranks agree to
// step or stop; a multi-rank trace already holds it in "other"). Data preparation is left out, as
// nanoddp-train's step_ms leaves it out. The 1-GPU step is forward + backward + optimizer + other:
// no Reducer, no sync. With a fixed batch per GPU (weak scaling) the scaling efficiency is step(1
// GPU) / step(n GPUs).
//
// CPU time-sharing (`cores` > 0; 0 = unlimited, the GPU case, where nothing below applies). Each
// of the n CPU ranks of a node (gpus_per_node) runs a compute thread and a communication thread
// (Gloo's worker) on the node's C cores, and k runnable threads on C cores each get
// share(k) = min(1, C / k) of a core (the kernel's fair share, in the fluid limit). With identical
// ranks, k is n while only compute runs (forward, backward alone, optimizer, other) or only
// collectives run (after backward), and 2n while backward and a collective run together. A
// collective advances at the rate of its slowest participant -- with identical ranks, every
// participant's share. Rates are relative to where the inputs were measured:
//   - a trace profile of p ranks (on one host with these cores) ran its compute at share(p)
//     and, in a DDP trace (p > 1), its backward beside its collectives at share(2p); a profile
//     without a measurement (the FLOP model) is taken as a dedicated core (share 1);
//   - a network fitted to nanoddp-bench-allreduce with m ranks per node (`network_ranks`) ran
//     its collectives at share(m) (communication threads alone); a named fabric is not CPU work
//     (share 1). Under --algo hier that is the intra fit; the leaders' fit, one rank per host,
//     ran at share(1) (across_scale below).
// So compute alone runs at share(n) / share(p), backward beside a collective at share(2n) /
// share(2p), a collective alone at share(n) / share(m) and beside backward at share(2n) /
// share(m). Simulating the traced world on the traced machine (n = p = m) leaves compute as
// traced and collectives as fitted, except beside backward: share(2n) / share(n), what the
// benchmark's idle compute threads did not show.
//
// Inputs measured on other cores (`measured_cores`, 0 = `cores`): the profile's and the fit's
// shares above are share on the cores they were measured on. Two network namespaces on one host
// (the 2 x 2 validation) are two nodes of half the host's cores each, measured on all of them.
//
// Shared memory bandwidth (`mem_contention` F >= 1, 1 = none): the ranks of one host that
// compute at the same time share its caches and memory bus, so each one's compute (forward,
// backward, optimizer, other) runs F times slower than the 1-rank profile says. F is measured,
// not derived: the time of the same GEMMs run by 2 processes at once over one alone
// (nanoddp-bench-gemm's mlp-step row, benchmarks/sim/validate-hier.sh). It applies on nodes of
// 2 or more ranks to a profile traced on 1 rank (a multi-rank trace already holds it).
// `opt_contention` replaces it for the optimizer step, a memory stream rather than GEMMs: its
// factor is measured with 2 copies of a 1-rank job whose whole step streams memory.
//
// Peers (`peers`): with a profile read with its peers (trace_profile.h) and the traced world,
// each bucket's collective waits for the slowest rank to produce the bucket (timeline.h).

#include <optional>
#include <vector>

#include "benchmarks/sim/buckets.h"
#include "benchmarks/sim/network_model.h"
#include "benchmarks/sim/profile.h"
#include "benchmarks/sim/timeline.h"

namespace nanoddp::sim {

struct StepOptions {
  Cluster cluster;
  Fabric fabric;
  Algorithm algorithm = Algorithm::kAuto;
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool overlap = true;
  double grad_bytes = 4;        // per element on the wire: 4 (fp32), 2 (the bf16 comm hook)
  bool sync_allreduce = true;   // nanoddp-train's loss/NaN all-reduce
  double overlap_slowdown = 0;  // see timeline.h
  double compute_scale = 1;     // every compute time multiplied
  int cores = 0;                // CPU cores per node, shared by its ranks; 0 = unlimited (GPUs)
  int network_ranks = 0;        // ranks per node the network was measured with; 0 = not CPU
  bool peers = false;           // wait for the slowest traced rank (profile.peers_ready_ms)
  // nanoddp-train --optimizer-in-backward: after backward, each bucket's share of the optimizer
  // step runs as soon as that bucket's all-reduce has ended, while the later ones still run.
  // Without --cores the two do not slow each other (GPUs: the update and NCCL run side by
  // side); with it, both go at the "together" rates while both run (step_model.cpp).
  bool optimizer_in_backward = false;
  int measured_cores = 0;     // cores the profile and fits were measured on; 0 = `cores`
  double mem_contention = 1;  // compute slowdown of ranks sharing a host's memory (above)
  // The optimizer's own factor (a memory stream, unlike the GEMMs); unset: mem_contention.
  std::optional<double> opt_contention;
  // --algo hier: the leaders' network (step 2); unset: `fabric` for both levels.
  std::optional<Fabric> inter_fabric;
  // Ranks per node the leaders' network was measured with (--fit-inter: 1, one per host);
  // 0 = not CPU work (a named fabric).
  int inter_network_ranks = 0;
};

// share(k) above: the share of a core each of k runnable threads gets on `cores` cores
// (1 when cores is 0, unlimited).
double core_share(int cores, int threads);
// The replay's rates for the options' world size (see "CPU time-sharing" above).
ReplayRates sharing_rates(const ComputeProfile& profile, const StepOptions& options);
// The communication threads of a node that share its cores (--cores): one per rank, and one
// more under the hierarchical all-reduce (the leaders' ring).
int comm_threads(const StepOptions& options);
// --algo hier: the leaders' ring in the units of the rates above. The rates bring a collective
// from its fit's core share, share(m) with m = network_ranks, to the simulated one; the leaders'
// fit ran at share(inter_network_ranks) (one rank per host: a core of its own), so its phase
// goes share(inter_network_ranks) / share(network_ranks) times the collective's time (1 when
// either network is not CPU work).
double across_scale(const StepOptions& options);

struct StepPrediction {
  int world_size = 1;
  std::vector<SimBucket> buckets;
  std::vector<CollectiveTime> collectives;  // per bucket
  Timeline timeline;
  ReplayRates rates;  // the CPU time-sharing rates used (all 1 without --cores)
  double forward_ms = 0;
  double backward_ms = 0;  // backward compute, as replayed
  double exposed_comm_ms = 0;
  double sync_ms = 0;
  double optimizer_ms = 0;
  double other_ms = 0;
  double step_ms = 0;
  double comm_ms = 0;  // sum of the buckets' all-reduces
  double overlap_fraction = 0;
  double single_gpu_step_ms = 0;
  double scaling_efficiency = 0;
  double compute_ms() const { return forward_ms + backward_ms + optimizer_ms + other_ms; }
};

// Throws SimError for bad options.
// One all-reduce of `bytes` under the options' algorithm (hierarchical: both fabrics).
CollectiveTime collective_time(const StepOptions& options, double bytes);

StepPrediction predict_step(const ComputeProfile& profile, const StepOptions& options);

struct SweepRow {
  double bucket_cap_mb = 0;
  std::size_t buckets = 0;
  double step_ms = 0;
  double comm_ms = 0;
  double exposed_comm_ms = 0;
};

// The caps tried by --sweep-buckets (MiB), plus the one asked for.
std::vector<double> default_sweep_caps(double current_cap_mb);
std::vector<SweepRow> sweep_bucket_caps(const ComputeProfile& profile, const StepOptions& options,
                                        const std::vector<double>& caps_mb);
// The row with the shortest step (the smaller cap on a tie).
const SweepRow& best_row(const std::vector<SweepRow>& rows);

// Scaling: the same step on 1, 2, 4, ... nodes up to options.cluster.nodes (that one included),
// G GPUs each.
struct ScalingRow {
  int nodes = 1;
  int world_size = 1;
  double step_ms = 0;
  double comm_ms = 0;
  double exposed_comm_ms = 0;
  double scaling_efficiency = 0;
};
std::vector<ScalingRow> sweep_nodes(const ComputeProfile& profile, const StepOptions& options);

}  // namespace nanoddp::sim
