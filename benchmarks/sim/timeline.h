#pragma once
// The replay: one backward pass and its bucketed all-reduces, by the Reducer's rules
// (comm/reducer.h).
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
//  - Optional rates (`rates`, all 1 by default): the speeds of backward and of a collective,
//    relative to the profile's and the network model's, when each runs alone and when both run
//    together. step_model.h derives them from CPU cores shared by the ranks' threads (--cores);
//    the overlap slowdown divides the two "together" rates further.
//  - Optional peers (`peers_ready_ms`, empty by default: every rank is this one): when the
//    slowest rank produced each gradient, on this rank's clock. A collective needs every rank,
//    so bucket b starts no earlier than the slowest rank's last gradient of b -- this rank
//    launches it on its own schedule and its communication thread then waits, using no CPU.

#include <cstdint>
#include <vector>

#include "benchmarks/sim/buckets.h"

namespace nanoddp::sim {

// Speeds relative to the inputs' own (1 = as profiled, as the network model says).
struct ReplayRates {
  double compute_alone = 1;   // backward while no collective runs
  double compute_shared = 1;  // backward while a collective runs
  double comm_alone = 1;      // a collective while backward is over
  double comm_shared = 1;     // a collective while backward runs
};

struct TimelineInput {
  std::vector<double> work_ms;        // per gradient, in layout (= production) order
  double tail_ms = 0;                 // backward compute after the last gradient
  std::vector<SimBucket> buckets;     // cut over the same gradients
  std::vector<double> collective_ms;  // per bucket: its all-reduce's duration
  bool overlap = true;
  double overlap_slowdown = 0;
  ReplayRates rates;
  std::vector<double> peers_ready_ms;  // per gradient, or empty (identical ranks)
};

struct BucketTiming {
  double ready_ms = 0;        // this rank's last gradient of the bucket
  double peers_ready_ms = 0;  // every rank's (= ready_ms with identical ranks)
  double launch_ms = 0;
  double start_ms = 0;
  double end_ms = 0;
};

struct Timeline {
  std::vector<BucketTiming> buckets;
  std::vector<double> grad_ready_ms;  // per gradient
  double backward_end_ms = 0;
  double comm_end_ms = 0;      // when the last collective ends (0 without buckets)
  double comm_ms = 0;          // sum of the collectives' durations as the Reducer measures
                               // them: from when this rank's communication thread takes one up
                               // (max(launch, previous end)) to its end -- longer than
                               // undisturbed when slowed, and including the wait for the
                               // slowest rank with peers
  double exposed_comm_ms = 0;  // max(0, comm_end - backward_end)
  // Share of the communication hidden behind backward, as the Reducer reports it.
  double overlap_fraction() const;
};

// Throws SimError when the sizes of the inputs disagree or a duration is negative.
Timeline replay(const TimelineInput& input);

}  // namespace nanoddp::sim
