#pragma once
// A fabric fitted to measurements: the rows nanoddp-bench-allreduce --json writes (one JSON
// object per size: ranks, bytes, time_us), at the world size being simulated.
//
// The fit is the line T(S) = a + b S through the measured times (least squares on the relative
// error), read as a one-level ring: a = 2(n-1) alpha, b = 2(n-1)/n / B. The fabric gets that alpha
// inside and across nodes, B inside a node and B/G per NIC (so the G NICs of a node carry B), and
// no launch cost: the ring model then returns exactly a + b S for this n, however the n ranks
// are split into nodes. It is a description of the measured transport (on this machine: shared
// memory, "gloo+shm"), not of a real NVLink/InfiniBand fabric, so it only means something at the
// world size it was measured at.

#include <string>
#include <vector>

#include "benchmarks/sim/network_model.h"
#include "benchmarks/sim/stats.h"

namespace nanoddp::sim {

struct AllreduceSample {
  double bytes = 0;
  double ms = 0;
};

// Throws SimError naming the file and line for anything unreadable, and when a row was measured
// with another number of ranks than `expected_ranks`.
// `flag` names the option the file came from in messages.
std::vector<AllreduceSample> read_bench_allreduce(const std::string& path, int expected_ranks,
                                                  const std::string& flag = "--fit-allreduce");

struct AllreduceFit {
  Fabric fabric;
  Line line;                 // ms = intercept + slope * bytes
  double max_rel_error = 0;  // of the line over the samples used
  int samples = 0;
};

// Fits over the samples with min_bytes <= bytes <= max_bytes. Throws SimError with fewer than
// two sizes in range, or when the time does not grow with the size.
AllreduceFit fit_allreduce(const std::vector<AllreduceSample>& samples, const Cluster& cluster,
                           double min_bytes, double max_bytes, const std::string& name,
                           const std::string& flag = "--fit-allreduce");

}  // namespace nanoddp::sim
