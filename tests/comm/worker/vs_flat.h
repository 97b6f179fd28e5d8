#pragma once
// nanoddp-test-comm-worker --vs-flat: the group's all-reduce (hierarchical, when the ranks span
// several hosts) against the flat TCP ring on the same data, in one job.

#include "nanoddp/comm/init.h"

// Returns the worker's exit code: 0 when every check passed, 1 when one failed.
int run_vs_flat(nanoddp::comm::Distributed& dist);
