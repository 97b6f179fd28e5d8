#pragma once
// The driver role: runs every point of the sweep as a DDP job under nanoddp-run, --repeats times
// (separate launches), plus one baseline per distinct model and batch: a plain 1-process run
// (no launcher, no DDP, the optimizer after backward), shared by every configuration, and the
// sweep's --world 1 points themselves. Prints a table row and writes a JSON (and CSV) line per
// point and per baseline.
//
// A point's JSON line (other tools parse it: keep the keys):
//   {"bench":"ddp",
//    "machine":{"hostname","cpu","cores","os"},
//    "build":{"version","compiler","build_type","cuda","native"},
//    "config":{"world_size","nnodes","nproc_per_node","device","backend","in","out","hidden",
//              "layers","activation","scaling","batch_per_rank","global_batch","bucket_cap_mb",
//              "first_bucket_mb","overlap","optimizer_in_backward","comm_hook","zero_stage",
//              "threads","ddp","params","buckets"},
//    "baseline","steps","warmup","step_ms_median","step_ms_p10","step_ms_p90","step_ms_ci95",
//    "ci95_over","median_step":{"index","step_ms"},"samples_per_s","compute_ms","allreduce_ms",
//    "exposed_comm_ms","hidden_comm_ms","overlap_fraction","scaling_efficiency","gflops",
//    "busbw_gbs","parameter_bytes","gradient_bytes","averaged_gradient_bytes",
//    "optimizer_state_bytes","samples":[per launch {"step_ms","compute_ms","allreduce_ms",
//    "exposed_comm_ms"}],"repeats","repeat_step_ms_median","repeat_samples_per_s",
//    "scaling_efficiency_repeats","warnings","provenance"}
// The step percentiles pool every launch's steps (slowest rank per step, stats.h); the breakdown
// is the median step of the median launch, whose parts add up. The *_bytes are what rank 0
// holds (comm::ZeroMemory, the figures of nanoddp-train --metrics).

#include <nlohmann/json.hpp>

#include "options.h"

namespace nanoddp::bench_ddp {

// Returns the exit code: 0 when every point ran, 1 when one failed (the others still run).
// `provenance` (common::provenance) goes into every record.
int run_driver(const Options& options, const nlohmann::ordered_json& provenance);

}  // namespace nanoddp::bench_ddp
