#include "benchmarks/sim/step_model.h"

#include <algorithm>
#include <cmath>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

double core_share(int cores, int threads) {
  return cores > 0 && threads > cores ? static_cast<double>(cores) / threads : 1.0;
}

namespace {

// The share of a core the profile's compute had when it was measured (its traced world on these
// cores; a dedicated core for a profile without a measurement).
double profile_share(const ComputeProfile& profile, int cores) {
  const int p = profile.measured ? profile.measured->world_size : 0;
  return p > 0 ? core_share(cores, p) : 1.0;
}

}  // namespace

ReplayRates sharing_rates(const ComputeProfile& profile, const StepOptions& o) {
  const int c = o.cores;
  // The cores are a node's: its ranks share them, other nodes' ranks do not.
  const int n = o.cluster.gpus_per_node;
  const int p = profile.measured ? profile.measured->world_size : 0;
  const double profile_alone = profile_share(profile, c);
  const double profile_shared = p > 1 ? core_share(c, 2 * p) : profile_alone;
  const double network = o.network_ranks > 0 ? core_share(c, o.network_ranks) : 1.0;
  return {.compute_alone = core_share(c, n) / profile_alone,
          .compute_shared = core_share(c, 2 * n) / profile_shared,
          .comm_alone = core_share(c, n) / network,
          .comm_shared = core_share(c, 2 * n) / network};
}

StepPrediction predict_step(const ComputeProfile& profile, const StepOptions& o) {
  check_fabric(o.fabric, o.cluster);
  if (!(o.compute_scale > 0) || !std::isfinite(o.compute_scale)) {
    fail("--compute-scale must be a positive number, got {}", o.compute_scale);
  }
  if (!(o.overlap_slowdown >= 0) || !std::isfinite(o.overlap_slowdown)) {
    fail("--overlap-slowdown must be a number >= 0, got {}", o.overlap_slowdown);
  }
  if (profile.grads.empty()) fail("the compute profile has no parameters");
  if (o.cores < 0) fail("--cores must be >= 0 (0 = unlimited), got {}", o.cores);
  if (o.network_ranks < 0) fail("network_ranks must be >= 0, got {}", o.network_ranks);
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
    p.collectives.push_back(allreduce_time(o.cluster, o.fabric, o.algorithm,
                                           static_cast<double>(b.numel) * o.grad_bytes));
    in.collective_ms.push_back(p.collectives.back().ms);
  }
  in.overlap = o.overlap;
  in.overlap_slowdown = p.world_size > 1 ? o.overlap_slowdown : 0.0;
  p.timeline = replay(in);

  p.forward_ms = profile.forward_ms * compute_factor;
  p.backward_ms = p.timeline.backward_end_ms;
  p.optimizer_ms = profile.optimizer_ms * compute_factor;
  p.other_ms = profile.other_ms * compute_factor;
  p.comm_ms = p.timeline.comm_ms;
  p.exposed_comm_ms = p.timeline.exposed_comm_ms;
  p.overlap_fraction = p.timeline.overlap_fraction();
  if (o.optimizer_in_backward && !p.buckets.empty()) {
    // Finalize waits for bucket 0, updates its parameters, waits for bucket 1, ... Only the
    // waits are exposed; the step still ends after the whole update, which now hides behind
    // the later buckets' all-reduces (never later than waiting for all of them first).
    std::int64_t total = 0;
    for (const SimBucket& b : p.buckets) total += b.numel;
    double t = p.timeline.backward_end_ms, exposed = 0;
    for (std::size_t b = 0; b < p.buckets.size(); ++b) {
      const double end = p.timeline.buckets[b].end_ms;
      if (end > t) {
        exposed += end - t;
        t = end;
      }
      t += p.optimizer_ms * static_cast<double>(p.buckets[b].numel) / static_cast<double>(total);
    }
    p.exposed_comm_ms = exposed;
    p.overlap_fraction =
        p.comm_ms > 0 ? std::clamp(1.0 - p.exposed_comm_ms / p.comm_ms, 0.0, 1.0) : 0.0;
  }
  if (o.sync_allreduce && p.world_size > 1 && !profile.other_includes_sync) {
    p.sync_ms = allreduce_time(o.cluster, o.fabric, o.algorithm, 2.0 * p.world_size * 4.0).ms /
                p.rates.comm_alone;
  }
  p.step_ms =
      p.forward_ms + p.backward_ms + p.exposed_comm_ms + p.sync_ms + p.optimizer_ms + p.other_ms;
  // One rank alone on the same cores: its compute thread has a core to itself.
  const double one_rank_rate = core_share(o.cores, 1) / profile_share(profile, o.cores);
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
