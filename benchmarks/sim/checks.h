#pragma once
// What nanoddp-sim refuses and what it only warns about. Refused (SimError, exit 2): a world past
// kMaxWorldSize, latencies or a launch cost past a second, bandwidths below 1 MB/s or past
// 100 TB/s (given or fitted), a model whose
// training state does not fit the GPU's memory. Warned (the report and the JSON carry the text):
// more GPUs than the range docs/simulator.md describes, a model that nearly fills the GPU, and a
// GPU on a fabric it never shipped with; a fit whose line misses a measured time by more than
// kFitErrorWarn (cli.cpp).

#include <string>
#include <vector>

#include "benchmarks/sim/flop_model.h"
#include "benchmarks/sim/network_model.h"

namespace nanoddp::sim {

inline constexpr int kMaxWorldSize = 65536;         // refused above
inline constexpr int kDescribedWorldSize = 4096;    // warned above
inline constexpr double kMaxLatencyUs = 1e6;        // one second per step or collective
inline constexpr double kMaxBandwidthGbs = 1e5;     // 100 TB/s per GPU
// 1 MB/s per GPU: below 10 Mb/s Ethernet, slower than any link a data-parallel job runs over (a
// value in the wrong unit, or a fit of times in the wrong unit).
inline constexpr double kMinBandwidthGbs = 1e-3;
// One measured all-reduce longer than an hour is no benchmark row.
inline constexpr double kMaxAllreduceUs = 3600e6;
inline constexpr double kMemoryWarnFraction = 0.9;  // warned above this share of the GPU
// Scale factors: a compute time 1000 times longer or shorter than the profile's, or a collective
// slowing backward (and itself) down by more than 100 times, describes another machine, not this
// profile on a new cluster; past them a prediction is only arithmetic.
inline constexpr double kMinComputeScale = 1e-3;
inline constexpr double kMaxComputeScale = 1e3;
inline constexpr double kMaxOverlapSlowdown = 100;
// --mem-contention: past 10x the profile describes another machine.
inline constexpr double kMaxMemContention = 10;
// A fit whose line misses a measured time by more than this share is warned about: past it the
// rows lie on no line a + b S, and the fitted network is a poor summary of them.
inline constexpr double kFitErrorWarn = 0.20;
// --busbw sizes: 1 TiB, far past any bucket or message a DDP step sends (and exact in a double,
// so no row is rounded past --busbw-max).
inline constexpr double kMaxBusbwBytes = 1099511627776.0;

// Throws SimError naming the flag for a world, latency or bandwidth past the limits above.
// `fitted` names the fit file the fabric came from (its figures are then not flags).
void check_limits(const Cluster& cluster, const Fabric& fabric, const std::string& fitted = {});

// One GPU's training state for the FLOP model's MLP, in bytes: fp32 parameters and gradients,
// the optimizer's state (AdamW two moments, SGD with momentum one), and the activations backward
// keeps (the input, each hidden Linear's pre-activation and output, the last output), at the
// GEMM precision's element size. Allocator slack, workspaces and the CUDA context are left out,
// so the estimate is a lower bound.
struct MemoryEstimate {
  double parameters = 0;
  double gradients = 0;
  double optimizer_state = 0;
  double activations = 0;
  double gpu = 0;  // the GPU's memory
  double total() const { return parameters + gradients + optimizer_state + activations; }
};
MemoryEstimate estimate_memory(const GpuSpec& gpu, const FlopModelOptions& options);

// Throws SimError when the estimate exceeds the GPU's memory; a warning (empty: none) when it
// fills more than kMemoryWarnFraction of it.
std::string check_memory(const MemoryEstimate& memory, const GpuSpec& gpu);

// Warnings (none: empty) for a world past kDescribedWorldSize and, when `gpu` is given with a
// named fabric, for a GPU on a fabric it never shipped with.
std::vector<std::string> range_warnings(const Cluster& cluster, const Fabric& fabric,
                                        const GpuSpec* gpu);

}  // namespace nanoddp::sim
