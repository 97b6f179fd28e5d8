#include "benchmarks/sim/network_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

namespace {

// GB/s -> milliseconds per byte; microseconds -> milliseconds.
double ms_per_byte(double gbs) {
  return 1.0 / (gbs * 1e6);
}
double ms(double us) {
  return us / 1000.0;
}

int ceil_log2(int x) {
  int depth = 0;
  while ((1 << depth) < x) ++depth;
  return depth;
}

}  // namespace

Algorithm parse_algorithm(const std::string& name) {
  if (name == "ring") return Algorithm::kRing;
  if (name == "tree") return Algorithm::kTree;
  if (name == "auto") return Algorithm::kAuto;
  if (name == "hier") return Algorithm::kHierarchical;
  fail("--algo {}: expected ring, tree, auto or hier", name);
}

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kHierarchical:
      return "hier";
  }
  return "?";
}

const std::vector<Fabric>& named_fabrics() {
  // Effective bandwidths (what NCCL reaches), not line rates; latencies are NCCL's own tuning
  // constants for the Simple protocol (src/graph/tuning.cc): ring hop over NVLink 3.4 us, over
  // the network 14 us, base 8.4 us. Sources for every number: docs/simulator.md.
  static const std::vector<Fabric> fabrics = {
      {.name = "nvlink4-ib400",
       .description = "DGX/HGX H100 or H200: NVLink4 + NVSwitch (450 GB/s line, ~370 GB/s "
                      "NCCL ring), one 400 Gb/s NDR InfiniBand NIC per GPU (~47 GB/s)",
       .intra_bw_gbs = 370.0,
       .intra_lat_us = 3.4,
       .inter_bw_gbs = 47.0,
       .inter_lat_us = 14.0,
       .launch_us = 8.4,
       .node_gpus = 8},
      {.name = "nvlink3-ib200",
       .description = "DGX A100: NVLink3 + NVSwitch (300 GB/s line, ~232 GB/s NCCL), one "
                      "200 Gb/s HDR InfiniBand NIC per GPU (~24 GB/s)",
       .intra_bw_gbs = 232.0,
       .intra_lat_us = 3.4,
       .inter_bw_gbs = 24.0,
       .inter_lat_us = 14.0,
       .launch_us = 8.4,
       .node_gpus = 8},
  };
  return fabrics;
}

const Fabric& find_fabric(const std::string& name) {
  std::vector<std::string> names;
  for (const Fabric& f : named_fabrics()) {
    if (f.name == name) return f;
    names.push_back(f.name);
  }
  fail(
      "--fabric {}: unknown fabric; known: {} (or give --intra-bw-gbs, --intra-lat-us, "
      "--inter-bw-gbs, --inter-lat-us yourself)",
      name, fmt::join(names, ", "));
}

void check_fabric(const Fabric& fabric, const Cluster& cluster) {
  if (cluster.nodes < 1) fail("--nodes must be >= 1, got {}", cluster.nodes);
  if (cluster.gpus_per_node < 1) {
    fail("--gpus-per-node must be >= 1, got {}", cluster.gpus_per_node);
  }
  if (cluster.gpus_per_node > 1 &&
      !(fabric.intra_bw_gbs > 0 && std::isfinite(fabric.intra_bw_gbs))) {
    fail("--intra-bw-gbs must be a positive number (GB/s), got {}", fabric.intra_bw_gbs);
  }
  if (cluster.nodes > 1 && !(fabric.inter_bw_gbs > 0 && std::isfinite(fabric.inter_bw_gbs))) {
    fail("--inter-bw-gbs must be a positive number (GB/s), got {}", fabric.inter_bw_gbs);
  }
  for (const auto& [flag, value] : {std::pair{"--intra-lat-us", fabric.intra_lat_us},
                                    {"--inter-lat-us", fabric.inter_lat_us},
                                    {"--launch-us", fabric.launch_us}}) {
    if (!(value >= 0 && std::isfinite(value))) {
      fail("{} must be a number >= 0 (microseconds), got {}", flag, value);
    }
  }
}

double ring_allreduce_ms(const Cluster& cluster, const Fabric& fabric, double bytes) {
  const int n = cluster.world_size();
  if (n <= 1) return 0.0;
  // A fitted fabric below its window: the measured times, not the line's intercept.
  const auto& points = fabric.small_ms;
  if (!points.empty() && n == fabric.measured_ranks && bytes < points.back().first) {
    if (bytes <= points.front().first) return points.front().second;
    const auto hi = std::upper_bound(points.begin(), points.end(), bytes,
                                     [](double b, const auto& point) { return b < point.first; });
    const auto lo = hi - 1;
    return lo->second + (hi->second - lo->second) * (bytes - lo->first) / (hi->first - lo->first);
  }
  const int nodes = cluster.nodes;
  const int g = cluster.gpus_per_node;
  const int steps = 2 * (n - 1);
  // NCCL's count of the hops that cross nodes along the pipelined ring (tuning.cc).
  const int inter_steps = nodes > 1 ? std::min(2 * nodes, steps) : 0;
  const int intra_steps = steps - inter_steps;
  // The slowest link bounds every step: inside a node the GPU's NVLink; leaving the node, the
  // node's G NICs (one ring per NIC).
  double bw = 0;
  if (nodes == 1) {
    bw = fabric.intra_bw_gbs;
  } else if (g == 1) {
    bw = fabric.inter_bw_gbs;
  } else {
    bw = std::min(fabric.intra_bw_gbs, g * fabric.inter_bw_gbs);
  }
  return ms(fabric.launch_us) + intra_steps * ms(fabric.intra_lat_us) +
         inter_steps * ms(fabric.inter_lat_us) + 2.0 * (n - 1) / n * bytes * ms_per_byte(bw);
}

double tree_allreduce_ms(const Cluster& cluster, const Fabric& fabric, double bytes) {
  const int n = cluster.world_size();
  if (n <= 1) return 0.0;
  const int nodes = cluster.nodes;
  const int g = cluster.gpus_per_node;
  const double latency = ms(fabric.launch_us) + 2.0 * ((g - 1) * ms(fabric.intra_lat_us) +
                                                       ceil_log2(nodes) * ms(fabric.inter_lat_us));
  double transfer = 0;
  if (g > 1) transfer = 2.0 * bytes * ms_per_byte(fabric.intra_bw_gbs);
  if (nodes > 1) {
    const double volume = nodes == 2 ? bytes : 2.0 * bytes;
    transfer = std::max(transfer, volume * ms_per_byte(g * fabric.inter_bw_gbs));
  }
  return latency + transfer;
}

CollectiveTime allreduce_time(const Cluster& cluster, const Fabric& fabric, Algorithm algorithm,
                              double bytes) {
  switch (algorithm) {
    case Algorithm::kRing:
      return {ring_allreduce_ms(cluster, fabric, bytes), Algorithm::kRing};
    case Algorithm::kTree:
      return {tree_allreduce_ms(cluster, fabric, bytes), Algorithm::kTree};
    case Algorithm::kAuto: {
      // A fitted fabric is one measured transport, read as a ring: a tree of its alpha and B
      // was never measured (with a fitted alpha of 0 it made the sync all-reduce free).
      if (fabric.measured_ranks > 0) {
        return {ring_allreduce_ms(cluster, fabric, bytes), Algorithm::kRing};
      }
      const double ring = ring_allreduce_ms(cluster, fabric, bytes);
      const double tree = tree_allreduce_ms(cluster, fabric, bytes);
      return tree < ring ? CollectiveTime{tree, Algorithm::kTree}
                         : CollectiveTime{ring, Algorithm::kRing};
    }
    case Algorithm::kHierarchical:
      return {hierarchical_allreduce(cluster, fabric, fabric, bytes).ms, Algorithm::kHierarchical};
  }
  return {};
}

HierarchicalTime hierarchical_allreduce(const Cluster& cluster, const Fabric& intra,
                                        const Fabric& inter, double bytes, double across_scale) {
  const int hosts = cluster.nodes;
  const int host_ranks = cluster.gpus_per_node;
  if (hosts < 2 || host_ranks < 2) {
    fail(
        "--algo hier: nanoddp runs its hierarchical all-reduce only with 2 or more hosts of 2 or "
        "more ranks each (got --nodes {} --gpus-per-node {}); one host uses shared memory alone, "
        "one rank per host the flat ring: simulate those with --algo ring",
        hosts, host_ranks);
  }
  const Cluster host{.nodes = 1, .gpus_per_node = host_ranks};
  const Cluster leaders{.nodes = hosts, .gpus_per_node = 1};
  const auto within = [&](double s) { return ring_allreduce_ms(host, intra, s); };
  const auto across = [&](double s) { return ring_allreduce_ms(leaders, inter, s) * across_scale; };
  HierarchicalTime t;
  if (!(bytes > 0)) return t;
  t.pieces = static_cast<int>(std::ceil(bytes / kHierPieceBytes));
  const auto piece_bytes = [&](int k) {
    return std::min(kHierPieceBytes, bytes - k * kHierPieceBytes);
  };
  // 1. and 2.: the worker thread reduces every piece within the host; the leaders' ring follows
  // one piece behind (x[k]: when piece k has been across).
  std::vector<double> x(static_cast<std::size_t>(t.pieces));
  double w = 0;
  for (int k = 0; k < t.pieces; ++k) {
    const double within_ms = within(piece_bytes(k)), across_ms = across(piece_bytes(k));
    w += within_ms;
    x[k] = std::max(w, k > 0 ? x[k - 1] : 0.0) + across_ms;
    t.within_ms += within_ms;
    t.across_ms += across_ms;
  }
  // 3. and 4. on the worker thread, piece by piece as the ring finishes each.
  double tw = w;
  for (int k = 0; k < t.pieces; ++k) {
    const double s = piece_bytes(k);
    const double status = within(4.0);
    double back = 0;
    for (double first = 0; first < s; first += kHierBackPieceBytes) {
      back += within(std::min(kHierBackPieceBytes, s - first));
    }
    tw = std::max(tw, x[k]) + status + back;
    t.status_ms += status;
    t.back_ms += back;
  }
  t.ms = tw;
  return t;
}

double bus_bandwidth_gbs(double bytes, double ms_taken, int ranks) {
  if (ranks <= 1 || !(ms_taken > 0)) return 0.0;
  const double algbw = bytes / (ms_taken * 1e6);
  return algbw * 2.0 * (ranks - 1) / ranks;
}

}  // namespace nanoddp::sim
