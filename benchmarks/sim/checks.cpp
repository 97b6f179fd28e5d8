#include "benchmarks/sim/checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

void check_limits(const Cluster& cluster, const Fabric& fabric, const std::string& fitted) {
  // 64-bit: --nodes times --gpus-per-node can pass an int.
  const long long world = static_cast<long long>(cluster.nodes) * cluster.gpus_per_node;
  if (world > kMaxWorldSize) {
    fail(
        "--nodes {} x --gpus-per-node {} = {} GPUs: at most {} (the alpha-beta model says nothing "
        "about congestion in a network core that size; docs/simulator.md)",
        cluster.nodes, cluster.gpus_per_node, world, kMaxWorldSize);
  }
  // A fitted fabric's figures come from its file's rows, not from flags: say so, and what to
  // check there (the unit of time_us).
  const auto what = [&](const char* flag) {
    return fitted.empty() ? fmt::format("{}", flag)
                          : fmt::format("{}: the line fitted to its rows gives {}", fitted,
                                        std::string(flag).substr(2));
  };
  const std::string fix = fitted.empty() ? "" : "; are its time_us microseconds?";
  for (const auto& [flag, value] : {std::pair{"--intra-lat-us", fabric.intra_lat_us},
                                    {"--inter-lat-us", fabric.inter_lat_us},
                                    {"--launch-us", fabric.launch_us}}) {
    if (value > kMaxLatencyUs) {
      fail(
          "{} {:g}: more than a second ({:g} us); give microseconds, as measured by "
          "nanoddp-bench-allreduce or nccl-tests{}",
          what(flag), value, kMaxLatencyUs, fix);
    }
  }
  for (const auto& [flag, value] : {std::pair{"--intra-bw-gbs", fabric.intra_bw_gbs},
                                    {"--inter-bw-gbs", fabric.inter_bw_gbs}}) {
    if (value > kMaxBandwidthGbs) {
      fail("{} {:g}: more than {:g} GB/s per GPU; give GB/s (1e9 bytes/s), one direction{}",
           what(flag), value, kMaxBandwidthGbs, fix);
    }
    // Only the links the cluster has: a fit of one node sets no NIC bandwidth worth checking.
    const bool used =
        std::string(flag) == "--intra-bw-gbs" ? cluster.gpus_per_node > 1 : cluster.nodes > 1;
    if (used && value > 0 && value < kMinBandwidthGbs) {
      fail(
          "{} {:g}: less than {:g} GB/s (1 MB/s) per GPU, slower than any link a data-parallel "
          "job runs over; give GB/s (1e9 bytes/s), one direction{}",
          what(flag), value, kMinBandwidthGbs, fix);
    }
  }
}

MemoryEstimate estimate_memory(const GpuSpec& gpu, const FlopModelOptions& o) {
  double numel = 0;
  for (const ParameterInfo& p : mlp_parameters(o.shape)) numel += static_cast<double>(p.numel);
  const double state_per_param = o.optimizer == "adamw"          ? 8.0
                                 : o.optimizer == "sgd-momentum" ? 4.0
                                                                 : 0.0;
  const double element = o.precision == Precision::kBf16 ? 2.0 : 4.0;
  const double b = static_cast<double>(o.batch);
  const double hidden_kept = 2.0 * static_cast<double>(o.shape.layers) *
                             static_cast<double>(o.shape.hidden);  // pre-activation + output
  MemoryEstimate m;
  m.parameters = numel * 4.0;
  m.gradients = numel * 4.0;
  m.optimizer_state = numel * state_per_param;
  m.activations =
      b * (static_cast<double>(o.shape.in) + hidden_kept + static_cast<double>(o.shape.out)) *
      element;
  m.gpu = gpu.memory_gb * 1e9;
  return m;
}

std::string check_memory(const MemoryEstimate& m, const GpuSpec& gpu) {
  const std::string parts = fmt::format(
      "parameters {:.3g} GB + gradients {:.3g} GB + optimizer state {:.3g} GB + activations "
      "{:.3g} GB = {:.3g} GB",
      m.parameters / 1e9, m.gradients / 1e9, m.optimizer_state / 1e9, m.activations / 1e9,
      m.total() / 1e9);
  if (m.total() > m.gpu) {
    fail(
        "--gpu {}: the model does not fit its {:g} GB: {} (data parallelism keeps all of it on "
        "every GPU; use a smaller --hidden/--layers or --batch, --optimizer sgd, or a GPU with "
        "more memory)",
        gpu.name, gpu.memory_gb, parts);
  }
  if (m.total() > kMemoryWarnFraction * m.gpu) {
    return fmt::format(
        "the model fills {:.0f} % of the {} GPU's {:g} GB ({}); workspaces, the allocator's "
        "slack and the CUDA context may not fit beside it",
        100.0 * m.total() / m.gpu, gpu.name, gpu.memory_gb, parts);
  }
  return {};
}

std::vector<std::string> range_warnings(const Cluster& cluster, const Fabric& fabric,
                                        const GpuSpec* gpu) {
  std::vector<std::string> warnings;
  if (cluster.world_size() > kDescribedWorldSize) {
    warnings.push_back(fmt::format(
        "{} GPUs: past the 8 to {} GPUs docs/simulator.md describes; the model knows no "
        "congestion, rail topology or tree channel caps, which matter most at that size",
        cluster.world_size(), kDescribedWorldSize));
  }
  // A custom or fitted fabric is no shipped system: nothing to compare the GPU with.
  if (gpu != nullptr && fabric.name != "custom" && fabric.name != "fitted" &&
      std::find(gpu->fabrics.begin(), gpu->fabrics.end(), fabric.name) == gpu->fabrics.end()) {
    warnings.push_back(fmt::format(
        "--gpu {} on --fabric {}: no system shipped that pairing ({} came with {}); the "
        "prediction mixes one generation's compute with another's network",
        gpu->name, fabric.name, gpu->name, fmt::join(gpu->fabrics, ", ")));
  }
  return warnings;
}

}  // namespace nanoddp::sim
