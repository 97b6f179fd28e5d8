#include "table.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace nanoddp::bench_ddp {

namespace {

constexpr const char* kRowFormat =
    "{:>5} {:>5} {:>6} {:>6} {:>6} {:>6} {:>4} {:>9} {:>7} {:>8} {:>7} {:>7} {:>5} {:>3} {:>9} "
    "{:>9} "
    "{:>9} {:>10} {:>9} {:>9} {:>9} {:>5} {:>6} {:>8} {:>7}\n";

}  // namespace

void print_header(const Options& o, const nlohmann::ordered_json& machine,
                  const nlohmann::ordered_json& build) {
  fmt::print("# nanoddp-bench-ddp {} ({} build{}, {}) on {}: {}, {} cores, {}\n",
             build["version"].get<std::string>(), build["build_type"].get<std::string>(),
             build["native"].get<bool>() ? ", -march=native" : "",
             build["compiler"].get<std::string>(), machine["hostname"].get<std::string>(),
             machine["cpu"].get<std::string>(), machine["cores"].get<int>(),
             machine["os"].get<std::string>());
  fmt::print(
      "# device {}, backend {}, {} node(s), {} scaling (batch = {}), AdamW, MLP with "
      "MSE loss on a fixed synthetic batch\n",
      o.device, o.backend, o.nnodes, scaling_name(o.scaling),
      o.scaling == Scaling::kWeak ? "per rank" : "global");
  fmt::print(
      "# times in ms: median of {} steps (after {} warm-up), slowest rank per step; p90 "
      "over the same steps\n",
      o.steps, o.warmup);
  fmt::print(
      "# step = forward + backward + optimizer; compute = step - exposed; allreduce = "
      "the buckets' all-reduce time; exposed = the part of it backward waited for\n");
  fmt::print(
      "# optim: after = one optimizer step after backward, inbwd = --optimizer-in-backward "
      "(each bucket updated as soon as it is averaged)\n");
  fmt::print(
      "# ovl = hidden / allreduce; eff = samples/s / (ranks x samples/s of the 1-rank "
      "run); GFLOP/s per rank (GEMMs); busbw = gradient bytes x 2(n-1)/n / allreduce\n");
  fmt::print("#\n");
  fmt::print(kRowFormat, "ranks", "nodes", "in", "hidden", "layers", "out", "act", "params",
             "batch/r", "bucketMB", "buckets", "overlap", "optim", "thr", "hook", "step", "p90",
             "samples/s", "compute", "allreduce", "exposed", "ovl", "eff", "GFLOP/s", "busbw");
  std::fflush(stdout);
}

void print_row(const nlohmann::ordered_json& r) {
  const auto& c = r["config"];
  fmt::print(
      kRowFormat, c["world_size"].get<int>(), c["nnodes"].get<int>(), c["in"].get<std::int64_t>(),
      c["hidden"].get<std::int64_t>(), c["layers"].get<std::int64_t>(),
      c["out"].get<std::int64_t>(), c["activation"].get<std::string>(),
      c["params"].get<std::int64_t>(), c["batch_per_rank"].get<std::int64_t>(),
      fmt::format("{}", c["bucket_cap_mb"].get<double>()), c["buckets"].get<int>(),
      c["overlap"].get<bool>() ? "on" : "off",
      c["optimizer_in_backward"].get<bool>() ? "inbwd" : "after", c["threads"].get<int>(),
      c["comm_hook"].get<std::string>(), fmt::format("{:.3f}", r["step_ms_median"].get<double>()),
      fmt::format("{:.3f}", r["step_ms_p90"].get<double>()),
      fmt::format("{:.0f}", r["samples_per_s"].get<double>()),
      fmt::format("{:.3f}", r["compute_ms"].get<double>()),
      fmt::format("{:.3f}", r["allreduce_ms"].get<double>()),
      fmt::format("{:.3f}", r["exposed_comm_ms"].get<double>()),
      fmt::format("{:.2f}", r["overlap_fraction"].get<double>()),
      fmt::format("{:.3f}", r["scaling_efficiency"].get<double>()),
      fmt::format("{:.2f}", r["gflops"].get<double>()),
      fmt::format("{:.3f}", r["busbw_gbs"].get<double>()));
  std::fflush(stdout);
}

}  // namespace nanoddp::bench_ddp
