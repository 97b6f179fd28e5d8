#include "benchmarks/sim/step_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

double core_share(int cores, int threads) {
  return cores > 0 && threads > cores ? static_cast<double>(cores) / threads : 1.0;
}

namespace {

// The share of a core the profile's compute had when it was measured (its traced world on the
// cores it was measured on; a dedicated core for a profile without a measurement).
double profile_share(const ComputeProfile& profile, int measured_cores) {
  const int p = profile.measured ? profile.measured->world_size : 0;
  return p > 0 ? core_share(measured_cores, p) : 1.0;
}

int measured_cores(const StepOptions& o) {
  return o.measured_cores > 0 ? o.measured_cores : o.cores;
}

// Shared memory bandwidth: the slowdown of this node's compute against the profile's.
double contention(const ComputeProfile& profile, const StepOptions& o) {
  const int p = profile.measured ? profile.measured->world_size : 1;
  return o.cluster.gpus_per_node > 1 && p == 1 ? o.mem_contention : 1.0;
}

// The optimizer's factor over the one the rates hold already.
double optimizer_contention(const ComputeProfile& profile, const StepOptions& o) {
  const int p = profile.measured ? profile.measured->world_size : 1;
  if (o.cluster.gpus_per_node < 2 || p != 1 || !o.opt_contention) return 1.0;
  return *o.opt_contention / o.mem_contention;
}

// --optimizer-in-backward: the time finalize takes beyond the optimizer's own, from the end of
// backward. Finalize waits for bucket 0, updates its parameters (its share of the optimizer),
// waits for bucket 1, ... while the communication thread works through the all-reduces still
// running. The two are stepped event by event: while both run they go at the "together" rates
// (CPU ranks sharing cores, --cores), otherwise at the "alone" ones. Without --cores every rate
// is 1 and the result is the plain interleaving: only the waits count. On cores that are all
// busy (2 ranks on 2 cores) the sharing conserves work and little is gained, as measured.
double finalize_in_backward(const StepPrediction& p) {
  const std::size_t n = p.buckets.size();
  const double backward_end = p.timeline.backward_end_ms;
  // Communication left at the end of backward, per bucket, at the "alone" rate (the timeline
  // ran it so after backward).
  std::vector<double> comm(n);
  std::int64_t total = 0;
  for (std::size_t b = 0; b < n; ++b) {
    const BucketTiming& t = p.timeline.buckets[b];
    comm[b] = std::max(0.0, t.end_ms - std::max(t.start_ms, backward_end));
    total += p.buckets[b].numel;
  }
  const double comm_together = p.rates.comm_shared / p.rates.comm_alone;
  const double compute_together = p.rates.compute_shared / p.rates.compute_alone;
  constexpr double kDone = 1e-12;
  std::size_t next_comm = 0;  // the all-reduce the communication thread works on
  while (next_comm < n && comm[next_comm] <= kDone) ++next_comm;
  std::size_t next_update = 0;
  double update_left = -1;  // < 0: no update running
  double t = backward_end;
  while (next_update < n) {
    if (update_left < 0 && next_comm > next_update) {
      update_left = p.optimizer_ms * static_cast<double>(p.buckets[next_update].numel) /
                    static_cast<double>(total);
    }
    const bool communicating = next_comm < n;
    const bool updating = update_left >= 0;
    const double comm_speed = updating ? comm_together : 1.0;
    const double update_speed = communicating ? compute_together : 1.0;
    double dt = std::numeric_limits<double>::infinity();
    if (communicating) dt = std::min(dt, comm[next_comm] / comm_speed);
    if (updating) dt = std::min(dt, update_left / update_speed);
    t += dt;
    if (communicating) {
      comm[next_comm] -= dt * comm_speed;
      while (next_comm < n && comm[next_comm] <= kDone) ++next_comm;
    }
    if (updating) {
      update_left -= dt * update_speed;
      if (update_left <= kDone) {
        update_left = -1;
        ++next_update;
      }
    }
  }
  return std::max(0.0, (t - backward_end) - p.optimizer_ms);
}

}  // namespace

ReplayRates sharing_rates(const ComputeProfile& profile, const StepOptions& o) {
  const int c = o.cores;
  const int m = measured_cores(o);
  // The cores are a node's: its ranks share them, other nodes' ranks do not.
  const int n = o.cluster.gpus_per_node;
  const int p = profile.measured ? profile.measured->world_size : 0;
  const double profile_alone = profile_share(profile, m);
  const double profile_shared = p > 1 ? core_share(m, 2 * p) : profile_alone;
  const double network = o.network_ranks > 0 ? core_share(m, o.network_ranks) : 1.0;
  const double memory = contention(profile, o);
  // Communication threads per node: each rank's worker, and under the hierarchical all-reduce
  // the leaders' ring, which runs on a thread of its own beside its worker (one per host: the
  // worker reduces piece k + 1 in shared memory while the ring carries piece k).
  const int comm = comm_threads(o);
  return {.compute_alone = core_share(c, n) / profile_alone / memory,
          .compute_shared = core_share(c, n + comm) / profile_shared / memory,
          .comm_alone = core_share(c, comm) / network,
          .comm_shared = core_share(c, n + comm) / network};
}

int comm_threads(const StepOptions& o) {
  return o.cluster.gpus_per_node + (o.algorithm == Algorithm::kHierarchical ? 1 : 0);
}

double across_scale(const StepOptions& o) {
  if (o.network_ranks == 0 || o.inter_network_ranks == 0) return 1.0;
  const int m = measured_cores(o);
  return core_share(m, o.inter_network_ranks) / core_share(m, o.network_ranks);
}

CollectiveTime collective_time(const StepOptions& o, double bytes) {
  if (o.algorithm == Algorithm::kHierarchical) {
    return {hierarchical_allreduce(o.cluster, o.fabric, o.inter_fabric.value_or(o.fabric), bytes,
                                   across_scale(o))
                .ms,
            Algorithm::kHierarchical};
  }
  return allreduce_time(o.cluster, o.fabric, o.algorithm, bytes);
}

StepPrediction predict_step(const ComputeProfile& profile, const StepOptions& o) {
  check_fabric(o.fabric, o.cluster);
  if (o.inter_fabric) {
    check_fabric(*o.inter_fabric, Cluster{.nodes = o.cluster.nodes, .gpus_per_node = 1});
  }
  if (!(o.mem_contention >= 1) || !std::isfinite(o.mem_contention)) {
    fail("--mem-contention must be a number >= 1 (1 = none), got {}", o.mem_contention);
  }
  if (o.opt_contention && (!(*o.opt_contention >= 1) || !std::isfinite(*o.opt_contention))) {
    fail("--opt-contention must be a number >= 1 (1 = none), got {}", *o.opt_contention);
  }
  if ((o.mem_contention != 1 || o.opt_contention.value_or(1) != 1) && profile.measured &&
      profile.measured->world_size > 1) {
    fail(
        "--mem-contention with a profile traced on {} ranks: its compute already ran beside the "
        "others and holds their contention; use a 1-rank trace",
        profile.measured->world_size);
  }
  if (o.measured_cores < 0) fail("--measured-cores must be >= 0, got {}", o.measured_cores);
  if (o.measured_cores > 0 && o.cores == 0) {
    fail("--measured-cores {} needs --cores (the simulated node's cores)", o.measured_cores);
  }
  if (!(o.compute_scale > 0) || !std::isfinite(o.compute_scale)) {
    fail("--compute-scale must be a positive number, got {}", o.compute_scale);
  }
  if (!(o.overlap_slowdown >= 0) || !std::isfinite(o.overlap_slowdown)) {
    fail("--overlap-slowdown must be a number >= 0, got {}", o.overlap_slowdown);
  }
  if (profile.grads.empty()) fail("the compute profile has no parameters");
  if (o.cores < 0) fail("--cores must be >= 0 (0 = unlimited), got {}", o.cores);
  if (o.network_ranks < 0) fail("network_ranks must be >= 0, got {}", o.network_ranks);
  if (o.inter_network_ranks < 0) {
    fail("inter_network_ranks must be >= 0, got {}", o.inter_network_ranks);
  }
  if (o.peers) {
    if (profile.peers_ready_ms.empty()) {
      fail(
          "--peers traced needs a profile read with its peers: a trace of several ranks "
          "(--profile with --peers traced)");
    }
    if (profile.peers_ready_ms.size() != profile.grads.size()) {
      fail("the profile has {} peer ready times for {} gradients", profile.peers_ready_ms.size(),
           profile.grads.size());
    }
    const int traced = profile.measured ? profile.measured->world_size : 0;
    if (traced != o.cluster.world_size()) {
      fail(
          "--peers traced: the trace holds {} ranks but the cluster has {}; the slowest rank of "
          "a traced run says nothing about another world size (use --peers identical)",
          traced, o.cluster.world_size());
    }
  }

  StepPrediction p;
  p.world_size = o.cluster.world_size();
  p.rates = sharing_rates(profile, o);
  // Time outside the replay (forward, optimizer, other) runs with compute alone.
  const double compute_factor = o.compute_scale / p.rates.compute_alone;
  std::vector<std::int64_t> numels;
  TimelineInput in;
  // The replay scales by its rates itself; compute_scale is the caller's.
  in.rates = p.rates;
  if (o.peers) in.peers_ready_ms = profile.peers_ready_ms;
  for (const GradientWork& g : profile.grads) {
    numels.push_back(g.numel);
    in.work_ms.push_back(g.work_ms * o.compute_scale);
  }
  in.tail_ms = profile.backward_tail_ms * o.compute_scale;
  p.buckets = cut_buckets(numels, o.first_bucket_mb, o.bucket_cap_mb);
  in.buckets = p.buckets;
  for (const SimBucket& b : p.buckets) {
    p.collectives.push_back(collective_time(o, static_cast<double>(b.numel) * o.grad_bytes));
    in.collective_ms.push_back(p.collectives.back().ms);
  }
  in.overlap = o.overlap;
  in.overlap_slowdown = p.world_size > 1 ? o.overlap_slowdown : 0.0;
  p.timeline = replay(in);

  p.forward_ms = profile.forward_ms * compute_factor;
  p.backward_ms = p.timeline.backward_end_ms;
  p.optimizer_ms = profile.optimizer_ms * compute_factor * optimizer_contention(profile, o);
  p.other_ms = profile.other_ms * compute_factor;
  p.comm_ms = p.timeline.comm_ms;
  p.exposed_comm_ms = p.timeline.exposed_comm_ms;
  p.overlap_fraction = p.timeline.overlap_fraction();
  if (o.optimizer_in_backward && !p.buckets.empty()) {
    // What the step waits for shrinks (updates run beside the all-reduces still going), but the
    // overlap keeps nanoddp-bench-ddp's one definition (ReducerStats): the share of the
    // all-reduce time that ran during backward, 0 with overlap off.
    p.exposed_comm_ms = finalize_in_backward(p);
  }
  if (o.sync_allreduce && p.world_size > 1 && !profile.other_includes_sync) {
    p.sync_ms = collective_time(o, 2.0 * p.world_size * 4.0).ms / p.rates.comm_alone;
  }
  p.step_ms =
      p.forward_ms + p.backward_ms + p.exposed_comm_ms + p.sync_ms + p.optimizer_ms + p.other_ms;
  // One rank alone on the same cores: its compute thread has a core to itself.
  const double one_rank_rate = core_share(o.cores, 1) / profile_share(profile, measured_cores(o));
  p.single_gpu_step_ms =
      (profile.forward_ms + profile.backward_ms() + profile.optimizer_ms + profile.other_ms) *
      o.compute_scale / one_rank_rate;
  p.scaling_efficiency = p.step_ms > 0 ? p.single_gpu_step_ms / p.step_ms : 0.0;
  return p;
}

std::vector<double> default_sweep_caps(double current_cap_mb) {
  std::vector<double> caps = {0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000};
  if (std::find(caps.begin(), caps.end(), current_cap_mb) == caps.end()) {
    caps.push_back(current_cap_mb);
    std::sort(caps.begin(), caps.end());
  }
  return caps;
}

std::vector<SweepRow> sweep_bucket_caps(const ComputeProfile& profile, const StepOptions& options,
                                        const std::vector<double>& caps_mb) {
  std::vector<SweepRow> rows;
  for (double cap : caps_mb) {
    StepOptions o = options;
    o.bucket_cap_mb = cap;
    const StepPrediction p = predict_step(profile, o);
    rows.push_back({cap, p.buckets.size(), p.step_ms, p.comm_ms, p.exposed_comm_ms});
  }
  return rows;
}

const SweepRow& best_row(const std::vector<SweepRow>& rows) {
  if (rows.empty()) fail("bucket sweep: no caps to try");
  const SweepRow* best = &rows.front();
  for (const SweepRow& r : rows) {
    // Relative tolerance: caps whose steps differ by rounding are a tie; keep the smaller cap.
    if (r.step_ms < best->step_ms * (1 - 1e-9)) best = &r;
  }
  return *best;
}

std::vector<ScalingRow> sweep_nodes(const ComputeProfile& profile, const StepOptions& options) {
  std::vector<ScalingRow> rows;
  for (int nodes = 1;; nodes = std::min(nodes * 2, options.cluster.nodes)) {
    StepOptions o = options;
    o.cluster.nodes = nodes;
    const StepPrediction p = predict_step(profile, o);
    rows.push_back(
        {nodes, p.world_size, p.step_ms, p.comm_ms, p.exposed_comm_ms, p.scaling_efficiency});
    if (nodes >= options.cluster.nodes) break;
  }
  return rows;
}

}  // namespace nanoddp::sim
