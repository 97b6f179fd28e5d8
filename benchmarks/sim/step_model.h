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
  double compute_scale = 1;     // every compute time multiplied (e.g. ranks sharing cores)
};

struct StepPrediction {
  int world_size = 1;
  std::vector<SimBucket> buckets;
  std::vector<CollectiveTime> collectives;  // per bucket
  Timeline timeline;
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
