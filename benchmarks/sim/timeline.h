#pragma once
// The replay: one backward pass and its bucketed all-reduces, by the Reducer's rules
// (nanoddp/comm/reducer.h).
//
//  - Time 0 is the start of backward. Gradient i is ready once backward has done the compute
//    work of gradients 0..i (each gradient's `work_ms`: compute since the previous one).
//  - A bucket is ready when its last gradient is.
//  - Overlap on: buckets launch strictly in index order -- bucket b at max(ready_b, launch_b-1)
//    -- because every rank must issue the same sequence of collectives.
//    Overlap off: nothing launches during backward; all buckets launch at its end (finalize).
//  - One collective at a time on the communication stream (Gloo's worker thread / NCCL's
//    stream), first in first out: start_b = max(launch_b, end_b-1), end_b = start_b + c_b.
//  - Backward ends when its compute is done (the tail after the last gradient included);
//    finalize waits for every bucket. Exposed communication = max(0, end_last - backward_end):
//    the part the overlap did not hide, what the Reducer measures as its wait in finalize.
//  - Optional contention: while a collective runs during backward, both run (1 + S) times
//    slower, S = overlap_slowdown (NCCL's kernels and the GEMMs share SMs and memory bandwidth;
//    on a CPU the reducing thread and the compute thread share cores). 0 by default: the rules
//    above exactly. A collective after backward (finalize) runs at full speed.

#include <cstdint>
#include <vector>

#include "benchmarks/sim/buckets.h"

namespace nanoddp::sim {

struct TimelineInput {
  std::vector<double> work_ms;        // per gradient, in layout (= production) order
  double tail_ms = 0;                 // backward compute after the last gradient
  std::vector<SimBucket> buckets;     // cut over the same gradients
  std::vector<double> collective_ms;  // per bucket: its all-reduce's duration
  bool overlap = true;
  double overlap_slowdown = 0;
};

struct BucketTiming {
  double ready_ms = 0;
  double launch_ms = 0;
  double start_ms = 0;
  double end_ms = 0;
};

struct Timeline {
  std::vector<BucketTiming> buckets;
  std::vector<double> grad_ready_ms;  // per gradient
  double backward_end_ms = 0;
  double comm_end_ms = 0;      // when the last collective ends (0 without buckets)
  double comm_ms = 0;          // sum of the collectives' durations, end - start, as the
                               // Reducer measures them (longer than undisturbed when slowed)
  double exposed_comm_ms = 0;  // max(0, comm_end - backward_end)
  // Share of the communication hidden behind backward, as the Reducer reports it.
  double overlap_fraction() const;
};

// Throws SimError when the sizes of the inputs disagree or a duration is negative.
Timeline replay(const TimelineInput& input);

}  // namespace nanoddp::sim
