#include "benchmarks/sim/allreduce_fit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "benchmarks/sim/checks.h"
#include "benchmarks/sim/error.h"
#include "benchmarks/sim/input_file.h"

namespace nanoddp::sim {

std::string transport_of(const std::string& algorithm) {
  if (algorithm.rfind("NCCL", 0) == 0) return "NCCL";
  const std::string key = "transport: ";
  const std::size_t at = algorithm.find(key);
  const std::string rest = at == std::string::npos ? algorithm : algorithm.substr(at + key.size());
  for (const char* known : {"shared memory", "TCP", "hierarchical"}) {
    if (rest.rfind(known, 0) == 0) return known;
  }
  return rest;
}

BenchAllreduceRows read_bench_allreduce_rows(const std::string& path, int expected_ranks,
                                             const std::string& flag) {
  std::istringstream in(read_input_file(flag, path));
  BenchAllreduceRows rows;
  std::vector<AllreduceSample>& samples = rows.samples;
  // The first row's transport and mode, and its line: every other row must match them.
  int first_line = 0;
  int out_of_place = 0;  // rows skipped: an empty fit says why
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
    // A row whose correctness check failed timed a broken all-reduce.
    if (row.contains("wrong") && (!row["wrong"].is_number() || row["wrong"].get<double>() != 0)) {
      fail(
          "{} {}: line {} has \"wrong\": {} (its results failed nanoddp-bench-allreduce's "
          "correctness check); measure again and fit rows with wrong 0",
          flag, path, number, row["wrong"].dump());
    }
    // DDP's buckets are reduced in place: nanoddp-bench-allreduce's out-of-place lines (a copy
    // more) describe another operation.
    if (row.contains("placement") && row["placement"] == "out-of-place") {
      ++out_of_place;
      continue;
    }
    // One fit, one transport and one mode: rows of shared memory and a TCP ring (two files
    // concatenated) or of raw Gloo beside nanoddp's process group lie on no common line.
    const std::string algorithm = row.contains("algorithm") && row["algorithm"].is_string()
                                      ? row["algorithm"].get<std::string>()
                                      : std::string();
    const std::string transport = algorithm.empty() ? "" : transport_of(algorithm);
    const std::string mode = row.contains("mode") && row["mode"].is_string()
                                 ? row["mode"].get<std::string>()
                                 : std::string();
    if (first_line == 0) {
      first_line = number;
      rows.algorithm = algorithm;
      rows.transport = transport;
      rows.mode = mode;
    } else if (mode != rows.mode) {
      fail(
          "{} {}: line {} has mode \"{}\" but line {} mode \"{}\": raw Gloo and nanoddp's "
          "process group are different all-reduces; fit the \"nanoddp\" rows alone",
          flag, path, number, mode, first_line, rows.mode);
    } else if (transport != rows.transport) {
      fail(
          "{} {}: line {} was measured over {} but line {} over {}: one fit describes one "
          "transport; fit each file on its own",
          flag, path, number, transport.empty() ? "an unrecorded transport" : transport, first_line,
          rows.transport.empty() ? "an unrecorded transport" : rows.transport);
    }
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
    // Physical bounds, per row (the fitted line is bounded again in fit_allreduce): times in
    // another unit (ps, s) or made up would otherwise fit a network of PB/s or of 1e300 us.
    if (us > kMaxAllreduceUs) {
      fail(
          "{} {}: line {} has time_us {:g}, more than an hour for one all-reduce of {:g} bytes; "
          "give nanoddp-bench-allreduce's microseconds",
          flag, path, number, us, bytes);
    }
    const double algbw_gbs = bytes / (us * 1e3);
    if (algbw_gbs > kMaxBandwidthGbs) {
      fail(
          "{} {}: line {} has {:g} bytes in time_us {:g}: {:g} GB/s, more than {:g} GB/s per rank "
          "(the bound --intra-bw-gbs has); are its times microseconds?",
          flag, path, number, bytes, us, algbw_gbs, kMaxBandwidthGbs);
    }
    // nanoddp-bench-allreduce writes algbw_gbps = bytes / time: a row where they disagree was
    // edited (or its time scaled) and says two things at once. 1 % covers figures rounded by hand.
    if (row.contains("algbw_gbps")) {
      const double written = row["algbw_gbps"].is_number() ? row["algbw_gbps"].get<double>() : -1;
      if (!(std::fabs(written - algbw_gbs) <= 0.01 * algbw_gbs)) {
        fail(
            "{} {}: line {} has algbw_gbps {} but bytes / time_us = {:g} / {:g} us = {:g} GB/s; "
            "the row contradicts itself (edited by hand?): measure again, or correct time_us or "
            "algbw_gbps",
            flag, path, number, row["algbw_gbps"].dump(), bytes, us, algbw_gbs);
      }
    }
    samples.push_back({bytes, us / 1000.0});
  }
  if (samples.empty() && out_of_place > 0) {
    fail(
        "{} {}: no in-place rows: only \"placement\": \"in-place\" rows are fitted (DDP reduces "
        "its buckets in place), and the file's {} row(s) are out of place; fit a file of "
        "nanoddp-bench-allreduce, which writes both",
        flag, path, out_of_place);
  }
  if (samples.empty()) fail("{} {}: no rows", flag, path);
  return rows;
}

std::vector<AllreduceSample> read_bench_allreduce(const std::string& path, int expected_ranks,
                                                  const std::string& flag) {
  return read_bench_allreduce_rows(path, expected_ranks, flag).samples;
}

std::vector<double> sizes_in(const std::vector<AllreduceSample>& samples, double min_bytes,
                             double max_bytes) {
  std::vector<double> sizes;
  for (const AllreduceSample& s : samples) {
    if (s.bytes >= min_bytes && s.bytes <= max_bytes) sizes.push_back(s.bytes);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
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
  const std::vector<double> sizes = sizes_in(samples, min_bytes, max_bytes);
  if (sizes.size() < 2) {
    fail(
        "{} {}: {} distinct size(s) ({} row(s)) in the fit window {:.0f}..{} bytes{}; need "
        "two or more sizes: widen the window (--fit-min-bytes, --fit-max-bytes) or measure more "
        "sizes (all sizes in the file: {})",
        flag, name, sizes.size(), x.size(), min_bytes,
        max_bytes >= 1e300 ? std::string("any") : fmt::format("{:.0f}", max_bytes),
        sizes.empty() ? "" : fmt::format(" ({})", fmt::join(sizes, ", ")),
        fmt::join(sizes_in(samples, 0, 1e300), ", "));
  }
  AllreduceFit fit;
  fit.samples = static_cast<int>(x.size());
  fit.sizes = static_cast<int>(sizes.size());
  fit.min_bytes = sizes.front();
  fit.max_bytes = sizes.back();
  try {
    fit.line = fit_line_relative(x, y);
  } catch (const SimError& e) {
    fail("{} {}: {}", flag, name, e.what());
  }
  if (!(fit.line.slope > 0)) {
    fail(
        "{} {}: the measured time does not grow with the size (slope {} ms/byte); "
        "measure a wider range of sizes",
        flag, name, fit.line.slope);
  }
  // A negative intercept (latency) cannot be a ring's: the best line through the origin instead
  // (clamping alone kept a slope fitted beside the negative intercept, so the reported error
  // and the "on no line" warning described a line nobody fitted).
  double free_intercept_us = 0;
  if (fit.line.intercept < 0) {
    free_intercept_us = fit.line.intercept * 1000.0;
    fit.free_intercept_ms = fit.line.intercept;
    fit.line = fit_line_relative_through_origin(x, y);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double predicted = fit.line.intercept + fit.line.slope * x[i];
    fit.max_rel_error = std::max(fit.max_rel_error, std::fabs(predicted - y[i]) / y[i]);
  }
  const double alpha_ms = fit.line.intercept / (2.0 * (n - 1));
  const double bw_bytes_per_ms = 2.0 * (n - 1) / n / fit.line.slope;
  const double bw_gbs = bw_bytes_per_ms / 1e6;
  fit.fabric.name = "fitted";
  fit.fabric.description = fmt::format(
      "fitted to {} ({} sizes in {} rows, {:.0f}..{:.0f} bytes, {} ranks): T = {:.1f} us + S / "
      "{:.3f} GB/s x 2(n-1)/n, max error {:.0f} %{}",
      name, fit.sizes, fit.samples, fit.min_bytes, fit.max_bytes, n, fit.line.intercept * 1000.0,
      bw_gbs, fit.max_rel_error * 100.0,
      free_intercept_us < 0
          ? fmt::format(" (fitted through the origin: the free line's intercept was {:.1f} us, "
                        "and a ring's latency is not negative)",
                        free_intercept_us)
          : "");
  fit.fabric.intra_bw_gbs = bw_gbs;
  fit.fabric.inter_bw_gbs = bw_gbs / cluster.gpus_per_node;
  fit.fabric.intra_lat_us = fit.fabric.inter_lat_us = alpha_ms * 1000.0;
  fit.fabric.launch_us = 0;
  // Below the window: the file's own measurements (median per size), joined to the line at the
  // window's smallest size. Without any, the line (its intercept) goes on pricing them.
  std::map<double, std::vector<double>> below;
  for (const AllreduceSample& s : samples) {
    if (s.bytes < fit.min_bytes) below[s.bytes].push_back(s.ms);
  }
  for (auto& [bytes, times] : below) fit.fabric.small_ms.emplace_back(bytes, median(times));
  if (!fit.fabric.small_ms.empty()) {
    fit.fabric.small_ms.emplace_back(fit.min_bytes,
                                     fit.line.intercept + fit.line.slope * fit.min_bytes);
    fit.fabric.description +=
        fmt::format("; below {:.0f} bytes the measured times ({} size(s) from {:.0f} bytes)",
                    fit.min_bytes, below.size(), below.begin()->first);
  }
  fit.fabric.measured_ranks = n;
  fit.fabric.measured_min_bytes = sizes_in(samples, 0, 1e300).front();
  // The same physical bounds as the flags: a line through times in the wrong unit is refused
  // here as --intra-bw-gbs 3e6 is.
  check_limits(cluster, fit.fabric, fmt::format("{} {}", flag, name));
  return fit;
}

}  // namespace nanoddp::sim
