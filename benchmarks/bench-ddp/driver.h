#pragma once
// The driver role: runs every point of the sweep as a DDP job under nanoddp-run, plus the
// 1-rank run of each configuration (world 1, same model, batch, buckets, ...), once, as the
// baseline of the scaling efficiency, then prints a table row and writes a JSON line per point.
//
// A point's JSON line (other tools parse it: keep the keys):
//   {"bench":"ddp",
//    "machine":{"hostname","cpu","cores","os"},
//    "build":{"version","compiler","build_type","cuda","native"},
//    "config":{"world_size","nnodes","nproc_per_node","device","backend","in","out","hidden",
//              "layers","activation","scaling","batch_per_rank","global_batch","bucket_cap_mb",
//              "first_bucket_mb","overlap","optimizer_in_backward","comm_hook","threads",
//              "params","buckets"},
//    "steps","warmup","step_ms_median","step_ms_p90","samples_per_s","compute_ms",
//    "allreduce_ms","exposed_comm_ms","hidden_comm_ms","overlap_fraction","scaling_efficiency",
//    "gflops","busbw_gbs"}
// Times are medians over the measured steps of the slowest rank per step (stats.h).

#include "options.h"

namespace nanoddp::bench_ddp {

// Returns the exit code: 0 when every point ran, 1 when one failed (the others still run).
int run_driver(const Options& options);

}  // namespace nanoddp::bench_ddp
