#pragma once
// A compute profile: what one rank's training step costs without any communication, per
// parameter tensor, in the order backward produces the gradients. It comes from a nanoddp
// trace (trace_profile.h) or from a FLOP model of an MLP on a named GPU (flop_model.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nanoddp::sim {

// The MLP nanoddp-train builds: `layers` hidden layers = layers + 1 Linear modules named
// layers.0, layers.2, ... (activations in between, like torch.nn.Sequential). Defaults are
// nanoddp-train's.
struct MlpShape {
  std::int64_t in = 32;
  std::int64_t out = 8;
  std::int64_t hidden = 128;
  std::int64_t layers = 2;
};

struct ParameterInfo {
  std::string name;  // layers.4.weight
  std::int64_t numel = 0;
  std::int64_t linear = 0;  // which Linear (0 = first) it belongs to
};

// The parameters in layout order: the reverse of registration order (last layer first, bias
// before weight), which is how nn::FlatParameters lays out the gradients and the order in
// which backward produces them. Throws SimError for a bad shape:
// at most kMaxMlpLayers layers and 2^63 parameters in all (counts past it would wrap negative).
std::vector<ParameterInfo> mlp_parameters(const MlpShape& shape);
// A bound on --layers that keeps one prediction (and a sweep of a few dozen) under a second.
inline constexpr std::int64_t kMaxMlpLayers = 4096;
std::string describe(const MlpShape& shape);

struct GradientWork {
  std::string name;
  std::int64_t numel = 0;
  double work_ms = 0;  // backward compute since the previous gradient (or backward's start)
};

// What the traced run measured itself (trace profiles only): to compare predictions with.
struct MeasuredStep {
  int world_size = 1;
  double step_ms = 0;          // median, data preparation excluded (as nanoddp-train reports)
  double step_p10_ms = 0;      // the spread of the kept steps around it: the input's noise,
  double step_p90_ms = 0;      // which no prediction from it can be more precise than
  int steps = 0;               // kept (after --skip-steps)
  double exposed_comm_ms = 0;  // median "wait for all-reduce"
  double comm_ms = 0;          // median sum of the buckets' all-reduce spans
  std::vector<std::int64_t> bucket_numel;   // from the all-reduce spans
  std::vector<double> bucket_allreduce_ms;  // medians
};

struct ComputeProfile {
  std::string source;               // where it came from, for the report
  std::vector<GradientWork> grads;  // layout (= production) order
  double forward_ms = 0;
  double backward_tail_ms = 0;  // backward compute after the last gradient
  double optimizer_ms = 0;
  double other_ms = 0;  // rest of a step: zero_grad, NaN check, host overhead
  double data_ms = 0;   // data preparation: reported, not part of the step time
  // A trace of a multi-rank run: "other" already holds that run's per-step sync all-reduce
  // (nanoddp-train's loss/NaN exchange), so the step model does not add its own.
  bool other_includes_sync = false;
  std::optional<MeasuredStep> measured;
  // A multi-rank trace read with its peers: per gradient, when the slowest rank of the traced
  // run (this one included) had produced it, from this rank's backward start, on the ranks'
  // common clock (median over the steps of the per-step latest). Empty otherwise.
  std::vector<double> peers_ready_ms;
  // The traced run's batch per rank, from the trace's "run_config" event (nanoddp-train writes it
  // since it records one); unset for older traces and the FLOP model.
  std::optional<std::int64_t> batch;
  // The communication hook the traced all-reduces ran ("allreduce", "bf16"; from their
  // "comm_hook" argument), or unset (the FLOP model, a 1-rank trace).
  std::optional<std::string> comm_hook;
  // What the profile could not check (an older trace's shape, its batch): the report warns.
  std::vector<std::string> warnings;

  double backward_ms() const;  // sum of work + tail
  std::int64_t numel() const;
};

}  // namespace nanoddp::sim
