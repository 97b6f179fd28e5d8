#pragma once
// What nanoddp-sim prints: a table for people, the same figures as JSON for scripts.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "benchmarks/sim/checks.h"
#include "benchmarks/sim/profile.h"
#include "benchmarks/sim/step_model.h"

namespace nanoddp::sim {

// The same step with NCCL's two algorithms forced: how much the choice alone moves the answer.
struct AlgorithmBand {
  double ring_step_ms = 0, ring_efficiency = 0;
  double tree_step_ms = 0, tree_efficiency = 0;
};

// --sweep: the step for each value of one flag.
struct ParameterSweepRow {
  double value = 0;
  std::int64_t parameters = 0;
  double step_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  double scaling_efficiency = 0, ring_efficiency = 0, tree_efficiency = 0;
  double memory_bytes = 0;  // the FLOP model's estimate (0 for a trace)
};

struct SimReport {
  const ComputeProfile* profile = nullptr;
  StepOptions options;
  StepPrediction prediction;
  AlgorithmBand band;
  std::vector<SweepRow> sweep;      // empty unless --sweep-buckets
  std::vector<ScalingRow> scaling;  // empty unless --sweep-nodes
  // --sweep-nodes with each algorithm forced (the band per row).
  std::vector<ScalingRow> scaling_ring, scaling_tree;
  std::optional<MemoryEstimate> memory;  // the FLOP model's
  std::string parameter_sweep_flag;      // "--hidden"; empty without --sweep
  std::vector<ParameterSweepRow> parameter_sweep;
  std::int64_t global_batch = 0;  // > 0: strong scaling (the 1-GPU step runs all of it)
  std::vector<std::string> warnings;
  // What the efficiency divides by (the "1-GPU step"): said in the table and the JSON.
  std::string baseline =
      "the profile's plain step on one GPU: forward + backward + optimizer + other";
  // No baseline (a --profile of several ranks without --baseline-profile): every efficiency is
  // left out (printed "n/a", null in the JSON) rather than computed against the wrong step.
  bool no_efficiency = false;
  nlohmann::ordered_json inputs;      // the command line as structured fields
  nlohmann::ordered_json provenance;  // common::provenance()
  nlohmann::ordered_json build;       // common::build_info(): the simulator's own build
};

// Printed by every run on a named fabric (not a fitted one): NVLink SHARP is not in the model.
extern const char* const kNvlsCaveat;

std::string format_report(const SimReport& report);
nlohmann::json report_json(const SimReport& report);

// The network model alone, nccl-tests style: all-reduce time and busbw per size.
struct BusbwRow {
  double bytes = 0;
  double ring_ms = 0, tree_ms = 0;
  double ring_busbw_gbs = 0, tree_busbw_gbs = 0;
};
std::vector<BusbwRow> busbw_table(const Cluster& cluster, const Fabric& fabric, double min_bytes,
                                  double max_bytes);
std::string format_busbw(const Cluster& cluster, const Fabric& fabric,
                         const std::vector<BusbwRow>& rows);
nlohmann::json busbw_json(const Cluster& cluster, const Fabric& fabric,
                          const std::vector<BusbwRow>& rows);

}  // namespace nanoddp::sim
