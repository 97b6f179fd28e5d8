#include "benchmarks/sim/allreduce_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

std::vector<AllreduceSample> read_bench_allreduce(const std::string& path, int expected_ranks,
                                                  const std::string& flag) {
  std::ifstream in(path);
  if (!in) fail("{} {}: cannot open the file", flag, path);
  std::vector<AllreduceSample> samples;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      fail(
          "{} {}: line {} is not JSON; expected the rows of "
          "nanoddp-bench-allreduce --json FILE",
          flag, path, number);
    }
    if (!row.is_object() || !row.contains("bytes") || !row.contains("time_us") ||
        !row.contains("ranks") || !row["bytes"].is_number() || !row["time_us"].is_number() ||
        !row["ranks"].is_number_integer()) {
      fail(
          "{} {}: line {} lacks numeric \"ranks\", \"bytes\" and \"time_us\"; "
          "expected the rows of nanoddp-bench-allreduce --json FILE",
          flag, path, number);
    }
    // --collective reduce_scatter or allgather rows time another collective: a fit of them
    // would pass for an all-reduce's.
    if (row.contains("benchmark") &&
        (!row["benchmark"].is_string() || row["benchmark"] != "allreduce")) {
      fail(
          "{} {}: line {} measured {}, not allreduce; fit the rows of nanoddp-bench-allreduce "
          "without --collective (or --collective allreduce)",
          flag, path, number, row["benchmark"].dump());
    }
    // DDP's buckets are reduced in place: nanoddp-bench-allreduce's out-of-place lines (a copy
    // more) describe another operation.
    if (row.contains("placement") && row["placement"] == "out-of-place") continue;
    const int ranks = row["ranks"].get<int>();
    if (ranks != expected_ranks) {
      fail(
          "{} {}: line {} was measured with {} ranks, but it must hold {} (the simulated world; "
          "with --algo hier: one host's ranks for --fit-intra, the nodes for --fit-inter)",
          flag, path, number, ranks, expected_ranks);
    }
    const double bytes = row["bytes"].get<double>();
    const double us = row["time_us"].get<double>();
    if (!(bytes > 0) || !(us > 0) || !std::isfinite(us)) {
      fail("{} {}: line {} has bytes {} and time_us {}; both must be positive", flag, path, number,
           bytes, us);
    }
    samples.push_back({bytes, us / 1000.0});
  }
  if (samples.empty()) fail("{} {}: no rows", flag, path);
  return samples;
}

AllreduceFit fit_allreduce(const std::vector<AllreduceSample>& samples, const Cluster& cluster,
                           double min_bytes, double max_bytes, const std::string& name,
                           const std::string& flag) {
  const int n = cluster.world_size();
  if (n < 2) fail("{} needs a world of 2 or more ranks (got {})", flag, n);
  std::vector<double> x, y;
  for (const AllreduceSample& s : samples) {
    if (s.bytes >= min_bytes && s.bytes <= max_bytes) {
      x.push_back(s.bytes);
      y.push_back(s.ms);
    }
  }
  if (x.size() < 2) {
    fail("{} {}: {} row(s) between {} and {} bytes; need two or more sizes", flag, name, x.size(),
         min_bytes, max_bytes);
  }
  AllreduceFit fit;
  fit.samples = static_cast<int>(x.size());
  fit.line = fit_line_relative(x, y);
  if (!(fit.line.slope > 0)) {
    fail(
        "{} {}: the measured time does not grow with the size (slope {} ms/byte); "
        "measure a wider range of sizes",
        flag, name, fit.line.slope);
  }
  // A negative intercept (latency) cannot be a ring's: treat it as zero.
  fit.line.intercept = std::max(0.0, fit.line.intercept);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double predicted = fit.line.intercept + fit.line.slope * x[i];
    fit.max_rel_error = std::max(fit.max_rel_error, std::fabs(predicted - y[i]) / y[i]);
  }
  const double alpha_ms = fit.line.intercept / (2.0 * (n - 1));
  const double bw_bytes_per_ms = 2.0 * (n - 1) / n / fit.line.slope;
  const double bw_gbs = bw_bytes_per_ms / 1e6;
  fit.fabric.name = "fitted";
  fit.fabric.description = fmt::format(
      "fitted to {} ({} sizes, {:.0f}..{:.0f} bytes, {} ranks): T = {:.1f} us + S / "
      "{:.3f} GB/s x 2(n-1)/n, max error {:.0f} %",
      name, fit.samples, *std::min_element(x.begin(), x.end()),
      *std::max_element(x.begin(), x.end()), n, fit.line.intercept * 1000.0, bw_gbs,
      fit.max_rel_error * 100.0);
  fit.fabric.intra_bw_gbs = bw_gbs;
  fit.fabric.inter_bw_gbs = bw_gbs / cluster.gpus_per_node;
  fit.fabric.intra_lat_us = fit.fabric.inter_lat_us = alpha_ms * 1000.0;
  fit.fabric.launch_us = 0;
  return fit;
}

}  // namespace nanoddp::sim
