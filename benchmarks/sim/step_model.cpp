#include "benchmarks/sim/step_model.h"

#include <algorithm>
#include <cmath>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

StepPrediction predict_step(const ComputeProfile& profile, const StepOptions& o) {
  check_fabric(o.fabric, o.cluster);
  if (!(o.compute_scale > 0) || !std::isfinite(o.compute_scale)) {
    fail("--compute-scale must be a positive number, got {}", o.compute_scale);
  }
  if (!(o.overlap_slowdown >= 0) || !std::isfinite(o.overlap_slowdown)) {
    fail("--overlap-slowdown must be a number >= 0, got {}", o.overlap_slowdown);
  }
  if (profile.grads.empty()) fail("the compute profile has no parameters");

  StepPrediction p;
  p.world_size = o.cluster.world_size();
  std::vector<std::int64_t> numels;
  TimelineInput in;
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

  p.forward_ms = profile.forward_ms * o.compute_scale;
  p.backward_ms = p.timeline.backward_end_ms;
  p.optimizer_ms = profile.optimizer_ms * o.compute_scale;
  p.other_ms = profile.other_ms * o.compute_scale;
  p.comm_ms = p.timeline.comm_ms;
  p.exposed_comm_ms = p.timeline.exposed_comm_ms;
  p.overlap_fraction = p.timeline.overlap_fraction();
  if (o.sync_allreduce && p.world_size > 1 && !profile.other_includes_sync) {
    p.sync_ms = allreduce_time(o.cluster, o.fabric, o.algorithm, 2.0 * p.world_size * 4.0).ms;
  }
  p.step_ms =
      p.forward_ms + p.backward_ms + p.exposed_comm_ms + p.sync_ms + p.optimizer_ms + p.other_ms;
  p.single_gpu_step_ms =
      (profile.forward_ms + profile.backward_ms() + profile.optimizer_ms + profile.other_ms) *
      o.compute_scale;
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
