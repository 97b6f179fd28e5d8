#pragma once
// The worker role: one rank of one point's DDP job, started by the driver through nanoddp-run.
//
// It builds the job the way nanoddp-train does (process group, nn::Mlp, FlatParameters,
// DistributedDataParallel, AdamW), generates its batch once (no data loading in the timed
// step), runs the warm-up and measured steps, gathers every rank's per-step timings on rank 0,
// and rank 0 writes the point's JSON record to --result.

#include "options.h"

namespace nanoddp::bench_ddp {

// Returns the exit code. Throws on failures (main reports them, exit code 1).
int run_worker(const Options& options);

}  // namespace nanoddp::bench_ddp
