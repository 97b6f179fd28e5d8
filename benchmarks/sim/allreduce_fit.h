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
// world size it was measured at, and over the transport its rows record.

#include <string>
#include <vector>

#include "benchmarks/sim/network_model.h"
#include "benchmarks/sim/stats.h"

namespace nanoddp::sim {

struct AllreduceSample {
  double bytes = 0;
  double ms = 0;
};

// The rows of one nanoddp-bench-allreduce --json file (in place), and how they were measured.
struct BenchAllreduceRows {
  std::vector<AllreduceSample> samples;
  // The rows' "algorithm" field reduced to its transport: "shared memory", "TCP", "hierarchical",
  // "NCCL" (or the text itself); empty when the rows do not record one (hand-written files).
  std::string transport;
  std::string algorithm;  // the first row's "algorithm" text, as written
  std::string mode;       // "nanoddp" or "raw"; empty when not recorded
};

// The transport an "algorithm" text of nanoddp-bench-allreduce names (see BenchAllreduceRows).
std::string transport_of(const std::string& algorithm);

// Throws SimError naming `flag`, the file and the line for anything unreadable, a row measured
// with another number of ranks than `expected_ranks`, a row whose correctness check failed
// ("wrong" > 0), and rows of different transports or modes (nanoddp vs raw) in one file.
BenchAllreduceRows read_bench_allreduce_rows(const std::string& path, int expected_ranks,
                                             const std::string& flag = "--fit-allreduce");
// The same, the samples alone.
std::vector<AllreduceSample> read_bench_allreduce(const std::string& path, int expected_ranks,
                                                  const std::string& flag = "--fit-allreduce");

// The distinct sizes among the samples with min_bytes <= bytes <= max_bytes, ascending.
std::vector<double> sizes_in(const std::vector<AllreduceSample>& samples, double min_bytes,
                             double max_bytes);

struct AllreduceFit {
  Fabric fabric;
  Line line;                 // ms = intercept + slope * bytes
  double max_rel_error = 0;  // of the line over the samples used
  int samples = 0;           // rows used (a size measured in several launches counts each)
  int sizes = 0;             // distinct sizes among them
  double min_bytes = 0, max_bytes = 0;  // the smallest and largest size used
  // The free line's intercept when it was negative (the line was then fitted through the
  // origin); 0 otherwise.
  double free_intercept_ms = 0;
};

// Fits over the samples with min_bytes <= bytes <= max_bytes. Throws SimError with fewer than
// two distinct sizes in range (naming the flag, the file, the sizes found and the window), or
// when the time does not grow with the size.
AllreduceFit fit_allreduce(const std::vector<AllreduceSample>& samples, const Cluster& cluster,
                           double min_bytes, double max_bytes, const std::string& name,
                           const std::string& flag = "--fit-allreduce");

}  // namespace nanoddp::sim
