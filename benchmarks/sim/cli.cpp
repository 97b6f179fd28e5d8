#include "benchmarks/sim/cli.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "benchmarks/sim/allreduce_fit.h"
#include "benchmarks/sim/buckets.h"
#include "benchmarks/sim/checks.h"
#include "benchmarks/sim/error.h"
#include "benchmarks/sim/file_digest.h"
#include "benchmarks/sim/flop_model.h"
#include "benchmarks/sim/report.h"
#include "benchmarks/sim/step_model.h"
#include "benchmarks/sim/trace_profile.h"
#include "common/cli.h"
#include "common/machine_info.h"
#include "common/output_files.h"
#include "common/provenance.h"
#include "common/results_file.h"

namespace nanoddp::sim {

namespace {

constexpr const char* kFooter = R"(
Examples:
  nanoddp-sim --model mlp --gpu h100 --hidden 8192 --layers 8 --batch 32 --nodes 4 --gpus-per-node 8
  nanoddp-sim --profile trace.json --nodes 1 --gpus-per-node 2 \
              --fit-allreduce allreduce-2.jsonl --sweep-buckets
  nanoddp-sim --busbw --nodes 1 --gpus-per-node 8 --fabric nvlink4-ib400
Fabrics: nvlink4-ib400 (DGX/HGX H100, H200), nvlink3-ib200 (DGX A100); the --intra-*/--inter-*
flags override a named fabric's values. Model, formulas and sources: docs/simulator.md.)";

// Checks that CLI11's validators cannot express (relations between flags).
std::string check(const CliOptions& o, const CLI::App& app) {
  // --json truncates its file before anything is read: an output that is an input (by any
  // name: a symlink or a hard link too) would destroy the input.
  for (const auto& [flag, path] :
       {std::pair{"--profile", &o.profile_path}, std::pair{"--baseline-profile", &o.baseline_path},
        std::pair{"--fit-allreduce", &o.fit_path}, std::pair{"--fit-intra", &o.fit_intra_path},
        std::pair{"--fit-inter", &o.fit_inter_path}}) {
    if (o.json_path != "-" && common::same_file(o.json_path, *path)) {
      return fmt::format(
          "--json {} is the {} input {}: it would be overwritten; give another "
          "output path",
          o.json_path, flag, *path);
    }
  }
  const bool any_fit =
      !o.fit_path.empty() || !o.fit_intra_path.empty() || !o.fit_inter_path.empty();
  for (const char* flag : {"--fit-min-bytes", "--fit-max-bytes"}) {
    if (app.count(flag) > 0 && !any_fit) {
      return fmt::format(
          "{} sets the size window of a fit: give --fit-allreduce (or --fit-intra and "
          "--fit-inter), or drop it",
          flag);
    }
  }
  // Flags for links the cluster does not have would be ignored: nothing crosses a node with one
  // node, nothing stays inside a node of one rank.
  const auto no_such_links = [&](const char* level, const char* where, const char* count_flag,
                                 const char* latency_flag) -> std::string {
    const std::string bandwidth = fmt::format("--{}-bw-gbs", level);
    for (const std::string& flag : {bandwidth, std::string(latency_flag)}) {
      if (app.count(flag) > 0) {
        return fmt::format(
            "{} describes the links {}, and {} 1 has none: give {} 2 or more, or drop it", flag,
            where, count_flag, count_flag);
      }
    }
    if (o.sweep && o.sweep->first == bandwidth) {
      return fmt::format("--sweep {}=...: {} 1 has no links {}; give {} 2 or more",
                         bandwidth.substr(2), count_flag, where, count_flag);
    }
    return {};
  };
  if (o.nodes == 1) {
    if (std::string e = no_such_links("inter", "across nodes", "--nodes", "--inter-lat-us");
        !e.empty())
      return e;
  }
  if (o.gpus_per_node == 1) {
    if (std::string e =
            no_such_links("intra", "inside a node", "--gpus-per-node", "--intra-lat-us");
        !e.empty())
      return e;
  }
  if (o.busbw) {
    if (!o.profile_path.empty() || !o.model.empty()) {
      return "--busbw prints the network model alone: drop --profile/--model";
    }
    // One rank reduces with no one: its table was all 0.0 us and 0.0 GB/s, without a word.
    if (static_cast<std::int64_t>(o.nodes) * o.gpus_per_node == 1) {
      return "--busbw with one GPU in all (--nodes 1 --gpus-per-node 1): one rank runs no "
             "all-reduce, so there is no time or busbw to model; give --gpus-per-node or --nodes "
             "2 or more";
    }
    // The table is the one-level ring and tree (named fabric or --fit-allreduce); nanoddp's
    // hierarchical all-reduce and its two fits are not in it.
    if (app.count("--algo") > 0 || !o.fit_intra_path.empty() || !o.fit_inter_path.empty()) {
      return fmt::format(
          "--busbw prints the one-level ring and tree of a named --fabric or a --fit-allreduce "
          "fit, both for every size: {} not used there; drop {} (predict a step with --model or "
          "--profile for --algo hier)",
          o.fit_intra_path.empty() && o.fit_inter_path.empty()
              ? fmt::format("--algo {} is", o.algo)
              : fmt::format("--algo {}, --fit-intra and --fit-inter are", o.algo),
          o.fit_intra_path.empty() && o.fit_inter_path.empty() ? "it" : "them");
    }
    return {};
  }
  if (o.profile_path.empty() == o.model.empty()) {
    return "give one compute profile: --profile TRACE.json (from nanoddp-train --trace) or "
           "--model mlp (the FLOP model)";
  }
  if (!o.profile_path.empty()) {
    for (const char* flag :
         {"--batch", "--gpu", "--precision", "--efficiency", "--optimizer", "--scaling"}) {
      if (app.count(flag) > 0) {
        return fmt::format(
            "{} applies to --model mlp only (a trace already holds the compute "
            "times)",
            flag);
      }
    }
  } else {
    for (const char* flag : {"--rank", "--skip-steps", "--peers", "--baseline-profile"}) {
      if (app.count(flag) > 0) return fmt::format("{} applies to --profile only", flag);
    }
    if (o.cores > 0) {
      return "--cores models CPU ranks sharing cores; the FLOP model describes GPUs (use a "
             "--profile traced on the CPU)";
    }
    for (const char* flag : {"--mem-contention", "--opt-contention"}) {
      if (app.count(flag) > 0) {
        return fmt::format(
            "{} models CPU ranks sharing a host's memory; the FLOP model describes GPUs (use a "
            "--profile traced on 1 CPU rank)",
            flag);
      }
    }
  }
  if (app.count("--measured-cores") > 0 && o.cores == 0) {
    return "--measured-cores needs --cores: it says on how many cores the inputs were measured, "
           "--cores how many the simulated node has";
  }
  const bool hier = o.algo == "hier";
  const bool level_fit = !o.fit_intra_path.empty() || !o.fit_inter_path.empty();
  if (level_fit && !hier) {
    return "--fit-intra and --fit-inter describe the two levels of --algo hier; for one level "
           "use --fit-allreduce";
  }
  if (level_fit && (o.fit_intra_path.empty() || o.fit_inter_path.empty())) {
    return "--algo hier fitted: give both --fit-intra (nanoddp-bench-allreduce on one host's "
           "--gpus-per-node ranks) and --fit-inter (on --nodes ranks, one per host)";
  }
  if (o.algo == "tree" && !o.fit_path.empty()) {
    return "--algo tree with --fit-allreduce: the fit describes the one transport its rows "
           "measured, read as a ring; a tree of it was never measured (drop --algo, or give a "
           "named --fabric)";
  }
  if (hier && !o.fit_path.empty()) {
    return "--algo hier with --fit-allreduce: a one-level fit describes the flat transport; "
           "give --fit-intra and --fit-inter (one per level)";
  }
  if (hier && (o.nodes < 2 || o.gpus_per_node < 2)) {
    return fmt::format(
        "--algo hier needs --nodes >= 2 and --gpus-per-node >= 2 (got {} x {}): nanoddp uses the "
        "hierarchical all-reduce only across several hosts of several ranks; one host uses "
        "shared memory alone, one rank per host the flat ring (--algo ring)",
        o.nodes, o.gpus_per_node);
  }
  if (hier && o.sweep_nodes) {
    return "--sweep-nodes with --algo hier: a sweep starts at 1 node, where nanoddp does not "
           "use the hierarchical all-reduce";
  }
  if (!o.fit_path.empty() && o.sweep_nodes) {
    return "--sweep-nodes needs a named fabric: a --fit-allreduce fit holds at its own world "
           "size only";
  }
  if (!o.fit_path.empty() || level_fit) {
    for (const char* flag : {"--fabric", "--intra-bw-gbs", "--intra-lat-us", "--inter-bw-gbs",
                             "--inter-lat-us", "--launch-us"}) {
      if (app.count(flag) > 0) {
        return fmt::format("{} and {} both describe the network: give one",
                           level_fit ? "--fit-intra/--fit-inter" : "--fit-allreduce", flag);
      }
    }
  }
  return {};
}

}  // namespace

double parse_bytes(const std::string& text, const std::string& flag) {
  // The number is read as every other number flag is (common/cli.h): decimal only, so "0x10"
  // and " 16" are refused, not read as 16.
  const std::size_t number_end = text.find_first_of("KkMmGgTt");
  const std::string number = text.substr(0, number_end);
  if (number_end != std::string::npos && number_end + 1 != text.size()) {
    fail("{} {}: not a size (e.g. 8, 1K, 16M, 1G)", flag, text);
  }
  if (const std::string problem = cli::detail::check_finite(number); !problem.empty()) {
    fail("{} {}: not a size (e.g. 8, 1K, 16M, 1G): {}", flag, text, problem);
  }
  const double value = std::strtod(number.c_str(), nullptr);
  const std::string suffix = number_end == std::string::npos ? "" : text.substr(number_end);
  double scale = 1;
  if (suffix == "K" || suffix == "k") {
    scale = 1024.0;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else if (suffix == "T" || suffix == "t") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (!suffix.empty()) {
    fail("{} {}: not a size (e.g. 8, 1K, 16M, 1G)", flag, text);
  }
  if (!(value >= 0) || !std::isfinite(value)) fail("{} {}: must be a size >= 0", flag, text);
  return value * scale;
}

namespace {

// "hidden=1024,4096": the flag and its values, checked as the flag itself would be.
std::pair<std::string, std::vector<double>> parse_sweep(const std::string& text) {
  const auto eq = text.find('=');
  const std::string name = text.substr(0, eq);
  const std::vector<std::string> known = {"hidden", "layers", "batch", "inter-bw-gbs",
                                          "intra-bw-gbs"};
  if (eq == std::string::npos || std::find(known.begin(), known.end(), name) == known.end()) {
    fail(
        "--sweep {}: expected NAME=v1,v2,... with NAME one of hidden, layers, batch, "
        "inter-bw-gbs, intra-bw-gbs",
        text);
  }
  const bool integer = name == "hidden" || name == "layers" || name == "batch";
  std::vector<double> values;
  std::size_t start = eq + 1;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    // Each element as the flag itself reads it (common/cli.h): decimal, no leading zero.
    const std::string problem =
        integer ? cli::detail::check_integer(item, false) : cli::detail::check_finite(item);
    const bool number = !item.empty() && problem.empty();
    const double v = number ? std::strtod(item.c_str(), nullptr) : 0;
    const double lo = name == "layers" ? 0 : integer ? 1 : kMinBandwidthGbs;
    const double hi = name == "layers" ? static_cast<double>(kMaxMlpLayers)
                      : integer        ? 1e12
                                       : kMaxBandwidthGbs;
    if (!number || !(v >= lo && v <= hi) || (integer && v != std::floor(v))) {
      fail("--sweep {}: '{}' is not {} in [{:g}, {:g}]", text, item,
           integer ? "an integer" : "a number", lo, hi);
    }
    values.push_back(v);
    if (values.size() > 64) fail("--sweep {}: at most 64 values", text);
    start = comma + 1;
  }
  return {"--" + name, values};
}

// A bandwidth flag: read as text and checked here, range included, because common/cli.h's check
// of a number flag would tell 1e-300 the range of a float ("0, or a magnitude from 1.2e-38"),
// and 0 is no bandwidth. Text that is no decimal number gets that check's message.
CLI::Option* add_bandwidth(CLI::App& app, const std::string& flag, std::optional<double>& value,
                           const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag, [&value](const std::string& text) { value = std::strtod(text.c_str(), nullptr); },
          help)
      ->type_name("NUMBER")  // not "FLOAT": that would put common/cli.h's check first
      ->transform(CLI::Validator(
          [](std::string& text) -> std::string {
            const std::string problem = cli::detail::check_finite(text);
            if (!problem.empty() && problem.find("out of range") == std::string::npos) {
              return problem;
            }
            const double v = std::strtod(text.c_str(), nullptr);
            if (v >= kMinBandwidthGbs && v <= kMaxBandwidthGbs) return {};
            return fmt::format(
                "'{}' is out of range: a bandwidth is from {:g} GB/s (1 MB/s) to {:g} GB/s (100 "
                "TB/s) per GPU, one direction",
                text, kMinBandwidthGbs, kMaxBandwidthGbs);
          },
          ""));
}

}  // namespace

std::optional<CliOptions> parse_cli(int argc, char** argv, int& exit_code) {
  CliOptions o;
  std::string sweep_text;
  CLI::App app{
      "nanoddp-sim: predicts a DDP training step (compute, bucketed all-reduce overlapped with "
      "backward, exposed communication, scaling efficiency) on clusters you do not have."};
  app.footer(kFooter);
  app.get_formatter()->column_width(34);

  app.add_option("--profile", o.profile_path,
                 "compute profile from a trace written by nanoddp-train --trace (its \"grad\" "
                 "markers give the parameters; older traces need the MLP shape flags)");
  app.add_option("--baseline-profile", o.baseline_path,
                 "a 1-rank trace of the same model and batch: its plain step is the scaling "
                 "baseline (needed for an efficiency when --profile was traced on several ranks)");
  app.add_option("--model", o.model, "compute profile from the FLOP model: mlp")
      ->check(CLI::IsMember({"mlp"}));
  app.add_option("--rank", o.rank, "trace: whose steps to read")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--skip-steps", o.skip_steps, "trace: warm-up steps left out")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--in", o.in,
                 "MLP input features (as nanoddp-train; with --profile: checked against the "
                 "trace's \"grad\" markers, or the shape of an older trace)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--out", o.out, "MLP output features")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "MLP hidden width")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--layers", o.layers, "MLP hidden layers (layers + 1 Linear modules)")
      ->check(CLI::Range(std::int64_t{0}, kMaxMlpLayers))
      ->capture_default_str();
  app.add_option("--scaling", o.scaling,
                 "model: weak (--batch per GPU, fixed) or strong (--batch is the global batch, "
                 "split over the GPUs; the 1-GPU step runs all of it)")
      ->check(CLI::IsMember({"weak", "strong"}))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "model: batch per GPU (weak) or global (strong)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--gpu", o.gpu, "model: h100, h200 or a100")->capture_default_str();
  app.add_option("--precision", o.precision, "model: GEMM precision fp32, tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))
      ->capture_default_str();
  app.add_option("--efficiency", o.efficiency,
                 "model: share of peak FLOP/s and HBM bandwidth reached")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "model: adamw, sgd or sgd-momentum")
      ->check(CLI::IsMember({"adamw", "sgd", "sgd-momentum"}))
      ->capture_default_str();

  app.add_option("--nodes", o.nodes, "nodes")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--gpus-per-node", o.gpus_per_node, "GPUs (ranks) per node")
      ->check(CLI::Range(1, 1 << 12))
      ->capture_default_str();
  app.add_option("--fabric", o.fabric, "named fabric: nvlink4-ib400, nvlink3-ib200")
      ->capture_default_str();
  add_bandwidth(app, "--intra-bw-gbs", o.intra_bw_gbs,
                "GPU to node peers, GB/s, one direction, effective (0.001 to 100000)");
  app.add_option("--intra-lat-us", o.intra_lat_us, "latency of one step inside a node, us");
  add_bandwidth(app, "--inter-bw-gbs", o.inter_bw_gbs,
                "per GPU (its NIC) across nodes, GB/s, one direction, effective (0.001 to "
                "100000)");
  app.add_option("--inter-lat-us", o.inter_lat_us, "latency of one step across nodes, us");
  app.add_option("--launch-us", o.launch_us, "fixed cost of one collective, us");
  app.add_option("--fit-allreduce", o.fit_path,
                 "fit the network to nanoddp-bench-allreduce --json rows (same world size)");
  app.add_option("--fit-min-bytes", o.fit_min_bytes,
                 "smallest size the fit uses (8, 1K, 16M; default: half the smallest bucket)");
  app.add_option("--fit-max-bytes", o.fit_max_bytes,
                 "largest size the fit uses (default: twice the largest bucket)");
  app.add_option("--algo", o.algo,
                 "all-reduce algorithm: ring, tree, auto (the faster) or hier (nanoddp's "
                 "hierarchical CPU all-reduce: shared memory within a host, TCP among leaders)")
      ->check(CLI::IsMember({"ring", "tree", "auto", "hier"}))
      ->capture_default_str();
  app.add_option("--fit-intra", o.fit_intra_path,
                 "--algo hier: nanoddp-bench-allreduce --json rows on one host's --gpus-per-node "
                 "ranks (shared memory)");
  app.add_option("--fit-inter", o.fit_inter_path,
                 "--algo hier: nanoddp-bench-allreduce --json rows on --nodes ranks, one per host "
                 "(the leaders' TCP ring)");

  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "bucket cap, MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--first-bucket-mb", o.first_bucket_mb, "first bucket's cap, MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--overlap", o.overlap, "on: launch buckets during backward; off: at its end")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--optimizer-in-backward", o.optimizer_in_backward,
                 "on: each bucket's optimizer update runs as soon as its all-reduce ends "
                 "(nanoddp-train --optimizer-in-backward); off: one step after all of them")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--comm-hook", o.comm_hook, "allreduce (fp32 on the wire) or bf16 (2 bytes)")
      ->check(CLI::IsMember({"allreduce", "bf16"}))
      ->capture_default_str();
  app.add_option("--sync-allreduce", o.sync_allreduce,
                 "count nanoddp-train's per-step loss/NaN all-reduce: on or off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--overlap-slowdown", o.overlap_slowdown,
                 "backward and a collective running together are each (1 + S) times slower "
                 "(S at most 100)")
      ->check(CLI::Range(0.0, kMaxOverlapSlowdown))
      ->capture_default_str();
  app.add_option("--compute-scale", o.compute_scale,
                 "multiply every compute time (from 0.001 to 1000)")
      ->check(CLI::Range(kMinComputeScale, kMaxComputeScale))
      ->capture_default_str();
  app.add_option("--cores", o.cores,
                 "CPU ranks: the cores per node their compute and communication threads "
                 "share (0 = unlimited, GPUs)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--measured-cores", o.measured_cores,
                 "with --cores: the cores of the host the profile and fits were measured on "
                 "(default: --cores)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--mem-contention", o.mem_contention,
                 "CPU ranks: compute runs F times slower when a node's ranks compute together "
                 "(shared caches and memory bus; measure F, docs/simulator.md), 1 to 10")
      ->check(CLI::Range(1.0, kMaxMemContention))
      ->capture_default_str();
  app.add_option("--opt-contention", o.opt_contention,
                 "CPU ranks: the optimizer step's own factor (a memory stream; measure it with "
                 "2 copies of a streaming 1-rank job), 1 to 10 (default: --mem-contention)")
      ->check(CLI::Range(1.0, kMaxMemContention));
  app.add_option("--peers", o.peers,
                 "identical: every rank is the profiled one; traced: each collective waits "
                 "for the slowest rank of the trace (same world size)")
      ->check(CLI::IsMember({"identical", "traced"}))
      ->capture_default_str();

  app.add_flag("--sweep-buckets", o.sweep_buckets, "also try bucket caps 0.25..1000 MiB");
  app.add_option("--sweep", sweep_text,
                 "also predict the step for each value of one flag, the rest unchanged: "
                 "hidden=1024,4096 | layers=... | batch=... | inter-bw-gbs=... | "
                 "intra-bw-gbs=...");
  app.add_flag("--sweep-nodes", o.sweep_nodes, "also predict 1, 2, 4, ... --nodes nodes");
  app.add_option("--json", o.json_path, "also write the figures as JSON to FILE ('-': stdout only)")
      ->check(cli::non_empty_path("a file name or '-'"));
  app.add_flag("--busbw", o.busbw, "print the all-reduce model's time and busbw per size, alone");
  app.add_option("--busbw-min", o.busbw_min, "--busbw: smallest size")->capture_default_str();
  app.add_option("--busbw-max", o.busbw_max, "--busbw: largest size")->capture_default_str();

  // The same strict number parsing as every other program (common/cli.h): --hidden 010 is
  // refused here as in nanoddp-bench-ddp, not read as octal 8.
  if (const std::optional<int> code = cli::parse(app, argc, argv, "nanoddp-sim")) {
    exit_code = *code;
    return std::nullopt;
  }
  if (!sweep_text.empty()) {
    try {
      o.sweep = parse_sweep(sweep_text);
    } catch (const SimError& e) {
      std::cerr << "nanoddp-sim: error: " << e.what() << "\n";
      exit_code = 2;
      return std::nullopt;
    }
    const std::string& flag = o.sweep->first;
    std::string problem;
    if (o.busbw) {
      problem = "--sweep predicts steps: drop --busbw";
    } else if (!o.profile_path.empty() && flag != "--inter-bw-gbs" && flag != "--intra-bw-gbs") {
      problem = fmt::format(
          "--sweep {}: a --profile trace fixes the model and batch; sweep "
          "them with --model mlp",
          sweep_text);
    } else if (!o.fit_path.empty() && (flag == "--inter-bw-gbs" || flag == "--intra-bw-gbs")) {
      problem = fmt::format(
          "--sweep {}: --fit-allreduce fixes the network; sweep bandwidths "
          "with a named --fabric",
          sweep_text);
    }
    if (!problem.empty()) {
      std::cerr << "nanoddp-sim: error: " << problem << "\n";
      exit_code = 2;
      return std::nullopt;
    }
  }
  if (std::string problem = check(o, app); !problem.empty()) {
    std::cerr << "nanoddp-sim: error: " << problem << "\n";
    exit_code = 2;
    return std::nullopt;
  }
  for (const char* flag : {"--in", "--out", "--hidden", "--layers"}) {
    o.shape_given = o.shape_given || app.count(flag) > 0;
  }
  o.provenance = common::provenance(argc, argv);
  exit_code = 0;
  return o;
}

nlohmann::ordered_json inputs_json(const CliOptions& o) {
  nlohmann::ordered_json j;
  const auto opt = [](const std::optional<double>& v) -> nlohmann::ordered_json {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  if (!o.profile_path.empty()) {
    j["profile"] = {{"path", o.profile_path},
                    {"baseline_profile", o.baseline_path},
                    {"rank", o.rank},
                    {"skip_steps", o.skip_steps},
                    {"peers", o.peers}};
  }
  if (!o.model.empty()) {
    j["model"] = {{"name", o.model},          {"gpu", o.gpu},
                  {"precision", o.precision}, {"efficiency", o.efficiency},
                  {"optimizer", o.optimizer}, {"scaling", o.scaling}};
    j["model"][o.scaling == "strong" ? "global_batch" : "batch_per_gpu"] = o.batch;
  }
  if (o.shape_given || !o.model.empty()) {
    j["shape"] = {{"in", o.in}, {"out", o.out}, {"hidden", o.hidden}, {"layers", o.layers}};
  }
  j["cluster"] = {{"nodes", o.nodes},
                  {"gpus_per_node", o.gpus_per_node},
                  {"cores", o.cores},
                  {"measured_cores", o.measured_cores},
                  {"mem_contention", o.mem_contention},
                  {"opt_contention", o.opt_contention ? nlohmann::ordered_json(*o.opt_contention)
                                                      : nlohmann::ordered_json(nullptr)}};
  const bool fitted = !o.fit_path.empty() || !o.fit_intra_path.empty();
  j["network"] = {{"fabric", fitted ? "" : o.fabric},    {"fit_allreduce", o.fit_path},
                  {"fit_intra", o.fit_intra_path},       {"fit_inter", o.fit_inter_path},
                  {"intra_bw_gbs", opt(o.intra_bw_gbs)}, {"intra_lat_us", opt(o.intra_lat_us)},
                  {"inter_bw_gbs", opt(o.inter_bw_gbs)}, {"inter_lat_us", opt(o.inter_lat_us)},
                  {"launch_us", opt(o.launch_us)},       {"algo", o.algo}};
  j["ddp"] = {{"bucket_cap_mb", o.bucket_cap_mb},
              {"first_bucket_mb", o.first_bucket_mb},
              {"overlap", o.overlap},
              {"optimizer_in_backward", o.optimizer_in_backward},
              {"comm_hook", o.comm_hook},
              {"sync_allreduce", o.sync_allreduce},
              {"overlap_slowdown", o.overlap_slowdown},
              {"compute_scale", o.compute_scale}};
  j["sweeps"] = {{"buckets", o.sweep_buckets}, {"nodes", o.sweep_nodes}};
  return j;
}

namespace {

// Strong scaling: the 1-GPU step runs the whole global batch; efficiency = T1 / (n * Tn).
void make_strong(StepPrediction& p, double single_ms) {
  p.single_gpu_step_ms = single_ms;
  p.scaling_efficiency = p.step_ms > 0 ? single_ms / (p.world_size * p.step_ms) : 0.0;
}

// One plain GPU's step of a profile: forward + backward + optimizer + other (no DDP).
double plain_step_ms(const ComputeProfile& profile, double compute_scale) {
  return (profile.forward_ms + profile.backward_ms() + profile.optimizer_ms + profile.other_ms) *
         compute_scale;
}

// --sweep-nodes with a fixed global batch: each world size gets its own per-GPU batch (and so
// its own FLOP-model profile); worlds that do not divide the batch are left out, and said so.
std::vector<ScalingRow> sweep_nodes_strong(const GpuSpec& gpu, FlopModelOptions flops,
                                           std::int64_t global_batch, double single_ms,
                                           const StepOptions& options,
                                           std::vector<std::string>* warnings) {
  std::vector<ScalingRow> rows;
  for (int nodes = 1;; nodes = std::min(nodes * 2, options.cluster.nodes)) {
    StepOptions o = options;
    o.cluster.nodes = nodes;
    const int world = o.cluster.world_size();
    if (global_batch % world != 0) {
      if (warnings != nullptr) {
        warnings->push_back(fmt::format(
            "--sweep-nodes --scaling strong: {} GPUs do not divide --batch {}; row left out", world,
            global_batch));
      }
    } else {
      flops.batch = global_batch / world;
      StepPrediction p = predict_step(profile_from_flops(gpu, flops), o);
      make_strong(p, single_ms);
      rows.push_back(
          {nodes, p.world_size, p.step_ms, p.comm_ms, p.exposed_comm_ms, p.scaling_efficiency});
    }
    if (nodes >= options.cluster.nodes) break;
  }
  return rows;
}

// Prints the table (or, with --json -, the JSON) and writes --json FILE. Returns the exit code:
// 1 when the file could not be written (said by common::ResultsFile, as every benchmark says it).
int emit(const CliOptions& o, const std::string& table, const nlohmann::json& json) {
  if (o.json_path == "-") {
    std::cout << json.dump(2) << "\n";
    return 0;
  }
  std::cout << table;
  if (o.json_path.empty()) return 0;
  common::ResultsFile out("nanoddp-sim", "--json");
  if (const std::string problem = out.open(o.json_path); !problem.empty()) fail("{}", problem);
  out.write_line(json.dump(2));
  std::cout.flush();  // the table before the error, if any
  return out.close() ? 0 : 1;
}

// What the fits read and found, for the report: warnings, and each input file's identity.
struct NetworkNotes {
  std::vector<std::string> warnings;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  // The one-level fit's measured size range (--busbw warns past it); 0: no fit.
  double fit_min_bytes = 0, fit_max_bytes = 0;
};

// An input file's path, flag, size and SHA-256 (the JSON's "inputs"."files").
nlohmann::ordered_json file_entry(const std::string& flag, const std::string& path) {
  const FileDigest d = digest_file(path, flag);
  return {{"flag", flag}, {"path", path}, {"bytes", d.bytes}, {"sha256", d.sha256}};
}

// How each fit's rows must have been measured: the transport the level really uses.
// `expected` is "shared memory" or "TCP"; a file that records no transport is taken as given.
void check_transport(const BenchAllreduceRows& rows, const std::string& flag,
                     const std::string& path, const std::string& expected, const std::string& why) {
  if (rows.transport.empty() || rows.transport == expected) return;
  fail("{} {}: measured over {} (\"{}\"), but {} expects {}: {}", flag, path, rows.transport,
       rows.algorithm, flag, expected, why);
}

// One file fitted as a one-level ring of `level`'s ranks over the window [lo, hi] (unset bounds
// from the flags). A default window that holds fewer than two measured sizes widens to all of
// them, and says so.
AllreduceFit fit_file(const CliOptions& o, const std::string& flag, const std::string& path,
                      const BenchAllreduceRows& rows, const Cluster& level, double lo, double hi,
                      NetworkNotes& notes) {
  if (hi < 1e300 && sizes_in(rows.samples, lo, hi).size() < 2) {
    if (!o.fit_min_bytes || !o.fit_max_bytes) {
      notes.warnings.push_back(fmt::format(
          "{} {}: the default fit window {:.0f}..{:.0f} bytes (from the buckets) holds fewer "
          "than two measured sizes; widened to all {} sizes in the file (set the window with "
          "--fit-min-bytes/--fit-max-bytes)",
          flag, path, lo, hi, sizes_in(rows.samples, 0, 1e300).size()));
    }
    lo = 0;
    hi = 1e300;
  }
  if (o.fit_min_bytes) lo = parse_bytes(*o.fit_min_bytes, "--fit-min-bytes");
  if (o.fit_max_bytes) hi = parse_bytes(*o.fit_max_bytes, "--fit-max-bytes");
  AllreduceFit fit = fit_allreduce(rows.samples, level, lo, hi, path, flag);
  if (fit.max_rel_error > kFitErrorWarn) {
    notes.warnings.push_back(fmt::format(
        "{} {}: the fitted line misses a measured time by {:.0f} % (warned above {:.0f} %): the "
        "rows lie on no line a + b S (noisy measurements, or a transport that changes with the "
        "size); more rounds (-r) or a narrower window (--fit-min-bytes/--fit-max-bytes) may help",
        flag, path, fit.max_rel_error * 100.0, kFitErrorWarn * 100.0));
  }
  nlohmann::ordered_json entry = file_entry(flag, path);
  entry["transport"] = rows.transport;
  entry["rows"] = fit.samples;
  entry["sizes"] = fit.sizes;
  entry["max_error"] = fit.max_rel_error;
  entry["through_origin"] = fit.free_intercept_ms < 0;
  notes.files.push_back(std::move(entry));
  return fit;
}

// The fabric: fitted to measurements, or named with the flags' overrides. `bucket_bytes` (the
// run's bucket sizes) sets the fit's default size window.
Fabric network_from_flags(const CliOptions& o, const Cluster& cluster,
                          const std::vector<double>& bucket_bytes, NetworkNotes& notes) {
  Fabric fabric;
  if (!o.fit_path.empty()) {
    const BenchAllreduceRows rows = read_bench_allreduce_rows(o.fit_path, cluster.world_size());
    // Shared memory joins the ranks of one host only: its line says nothing about a network.
    if (cluster.nodes > 1 && rows.transport == "shared memory") {
      fail(
          "--fit-allreduce {}: measured over shared memory (\"{}\"), a same-host transport, but "
          "--nodes {} crosses hosts: fit rows measured across hosts (TCP), or use --algo hier "
          "with --fit-intra (shared memory) and --fit-inter (TCP)",
          o.fit_path, rows.algorithm, cluster.nodes);
    }
    double lo = 0, hi = 1e300;
    if (!bucket_bytes.empty()) {
      lo = *std::min_element(bucket_bytes.begin(), bucket_bytes.end()) / 2;
      hi = *std::max_element(bucket_bytes.begin(), bucket_bytes.end()) * 2;
    }
    const AllreduceFit fit =
        fit_file(o, "--fit-allreduce", o.fit_path, rows, cluster, lo, hi, notes);
    notes.fit_min_bytes = fit.fabric.measured_min_bytes;
    notes.fit_max_bytes = fit.max_bytes;
    fabric = fit.fabric;
  } else {
    fabric = find_fabric(o.fabric);
    if (fabric.node_gpus > 0 && cluster.gpus_per_node > fabric.node_gpus && !o.intra_bw_gbs) {
      // Refused, not warned: past its NVSwitch domain the fabric's intra-node bandwidth and
      // latency describe no machine (a larger NVLink domain, such as an NVL72 rack, has its own
      // figures); the user who has one gives them.
      fail(
          "--gpus-per-node {} on --fabric {}: its systems have {} GPUs per node (one NVSwitch "
          "domain); for a larger node give its --intra-bw-gbs and --intra-lat-us, or use "
          "--nodes for more GPUs",
          cluster.gpus_per_node, fabric.name, fabric.node_gpus);
    }
    const bool overridden =
        o.intra_bw_gbs || o.intra_lat_us || o.inter_bw_gbs || o.inter_lat_us || o.launch_us;
    if (o.intra_bw_gbs) fabric.intra_bw_gbs = *o.intra_bw_gbs;
    if (o.intra_lat_us) fabric.intra_lat_us = *o.intra_lat_us;
    if (o.inter_bw_gbs) fabric.inter_bw_gbs = *o.inter_bw_gbs;
    if (o.inter_lat_us) fabric.inter_lat_us = *o.inter_lat_us;
    if (o.launch_us) fabric.launch_us = *o.launch_us;
    check_limits(cluster, fabric);
    if (overridden) {
      fabric.description = fmt::format("{}, with values given on the command line", fabric.name);
      fabric.name = "custom";
    }
  }
  check_fabric(fabric, cluster);
  return fabric;
}

// --algo hier fitted: each level's fabric from its own benchmark, read as a one-level ring of
// that level's ranks. The default window: the sizes that level sees, from half the smallest
// (a bucket, or a 1 MiB sub-piece of the broadcast) to twice the largest (a bucket, or a 4 MiB
// pipeline piece). Within a host nanoddp reduces through shared memory, among the leaders over
// a TCP ring: each file must have been measured over its level's transport.
Fabric level_fit(const CliOptions& o, const std::string& flag, const std::string& path,
                 const Cluster& level, const std::vector<double>& bucket_bytes,
                 NetworkNotes& notes) {
  const BenchAllreduceRows rows = read_bench_allreduce_rows(path, level.world_size(), flag);
  if (flag == "--fit-intra") {
    check_transport(rows, flag, path, "shared memory",
                    "within a host nanoddp reduces through shared memory; measure one host's "
                    "ranks with NANODDP_SHM unset");
  } else {
    check_transport(rows, flag, path, "TCP",
                    "the hosts' leaders reduce over a TCP ring; measure one rank per host (or "
                    "NANODDP_SHM=0 on one host)");
  }
  double lo = 0, hi = 1e300;
  if (!bucket_bytes.empty()) {
    lo =
        std::min(*std::min_element(bucket_bytes.begin(), bucket_bytes.end()), kHierBackPieceBytes) /
        2;
    hi = std::min(*std::max_element(bucket_bytes.begin(), bucket_bytes.end()), kHierPieceBytes) * 2;
  }
  Fabric fabric = fit_file(o, flag, path, rows, level, lo, hi, notes).fabric;
  check_fabric(fabric, level);
  return fabric;
}

}  // namespace

namespace {
void set_swept(CliOptions& o, const std::string& flag, double value);
}  // namespace

int run_cli(const CliOptions& o) {
  const Cluster cluster{.nodes = o.nodes, .gpus_per_node = o.gpus_per_node};
  check_limits(cluster, Fabric{});  // the world size, before anything multiplies it
  if (o.busbw) {
    NetworkNotes notes;
    const Fabric fabric = network_from_flags(o, cluster, {}, notes);
    const double lo = parse_bytes(o.busbw_min, "--busbw-min");
    const double hi = parse_bytes(o.busbw_max, "--busbw-max");
    if (notes.fit_max_bytes > 0 && (lo < notes.fit_min_bytes || hi > notes.fit_max_bytes)) {
      notes.warnings.push_back(fmt::format(
          "--busbw-min {} --busbw-max {}: the fit measured {:.0f}..{:.0f} bytes; rows outside "
          "that range are extrapolated (below: the smallest size's time; above: the fitted "
          "line), not measured",
          o.busbw_min, o.busbw_max, notes.fit_min_bytes, notes.fit_max_bytes));
    }
    const auto rows = busbw_table(cluster, fabric, lo, hi);
    nlohmann::json json = busbw_json(cluster, fabric, rows);
    for (auto& row : json) {
      row["provenance"] = nlohmann::json(o.provenance);
      row["build"] = nlohmann::json(common::build_info());
      row["input_files"] = nlohmann::json(notes.files);
      row["warnings"] = notes.warnings;
    }
    std::string table = format_busbw(cluster, fabric, rows);
    for (const std::string& w : notes.warnings) table.append(fmt::format("warning: {}\n", w));
    if (o.json_path == "-") {
      for (const std::string& w : notes.warnings) {
        std::cerr << "nanoddp-sim: warning: " << w << "\n";
      }
    }
    return emit(o, table, json);
  }
  ComputeProfile profile;
  SimReport report = simulate(o, profile);
  if (o.sweep) {
    // One full prediction per value, the rest of the command line unchanged.
    report.parameter_sweep_flag = o.sweep->first;
    for (const double value : o.sweep->second) {
      CliOptions v = o;
      v.sweep.reset();
      v.sweep_buckets = v.sweep_nodes = false;
      set_swept(v, o.sweep->first, value);
      ComputeProfile vp;
      SimReport r;
      try {
        r = simulate(v, vp);
      } catch (const SimError& e) {
        fail("--sweep at {} {:g}: {}", o.sweep->first, value, e.what());
      }
      report.parameter_sweep.push_back({.value = value,
                                        .parameters = vp.numel(),
                                        .step_ms = r.prediction.step_ms,
                                        .comm_ms = r.prediction.comm_ms,
                                        .exposed_comm_ms = r.prediction.exposed_comm_ms,
                                        .scaling_efficiency = r.prediction.scaling_efficiency,
                                        .ring_efficiency = r.band.ring_efficiency,
                                        .tree_efficiency = r.band.tree_efficiency,
                                        .memory_bytes = r.memory ? r.memory->total() : 0.0});
      for (const std::string& w : r.warnings) {
        const std::string tagged = fmt::format("{} {:g}: {}", o.sweep->first, value, w);
        if (std::find(report.warnings.begin(), report.warnings.end(), tagged) ==
            report.warnings.end()) {
          report.warnings.push_back(tagged);
        }
      }
    }
  }
  // The table carries them; a JSON-only run says them on stderr too.
  if (o.json_path == "-") {
    for (const std::string& w : report.warnings) {
      std::cerr << "nanoddp-sim: warning: " << w << "\n";
    }
  }
  return emit(o, format_report(report), report_json(report));
}

namespace {

void set_swept(CliOptions& o, const std::string& flag, double value) {
  const auto count = static_cast<std::int64_t>(value);
  if (flag == "--hidden") {
    o.hidden = count;
    o.shape_given = true;
  } else if (flag == "--layers") {
    o.layers = count;
    o.shape_given = true;
  } else if (flag == "--batch") {
    o.batch = count;
  } else if (flag == "--inter-bw-gbs") {
    o.inter_bw_gbs = value;
  } else if (flag == "--intra-bw-gbs") {
    o.intra_bw_gbs = value;
  }
}

}  // namespace

SimReport simulate(const CliOptions& o, ComputeProfile& profile) {
  const Cluster cluster{.nodes = o.nodes, .gpus_per_node = o.gpus_per_node};
  const MlpShape shape{.in = o.in, .out = o.out, .hidden = o.hidden, .layers = o.layers};
  const bool strong = o.scaling == "strong";
  FlopModelOptions flops;
  double single_ms = 0;  // strong: the whole global batch on one GPU
  const GpuSpec* gpu = nullptr;
  std::optional<MemoryEstimate> memory;
  std::vector<std::string> warnings;
  if (!o.profile_path.empty()) {
    // Unset shape flags: the trace's "grad" markers describe the model (older traces:
    // nanoddp-train's defaults, as the flags' defaults).
    profile = profile_from_trace(
        o.profile_path, {.shape = o.shape_given ? std::optional<MlpShape>(shape) : std::nullopt,
                         .rank = o.rank,
                         .skip_steps = o.skip_steps,
                         .peers = o.peers == "traced"});
  } else {
    gpu = &find_gpu(o.gpu);
    if (strong && o.batch % cluster.world_size() != 0) {
      fail(
          "--batch {} --scaling strong: the global batch does not divide over the {} GPUs; give "
          "a multiple of {}",
          o.batch, cluster.world_size(), cluster.world_size());
    }
    flops = FlopModelOptions{.shape = shape,
                             .batch = strong ? o.batch / cluster.world_size() : o.batch,
                             .precision = parse_precision(o.precision),
                             .efficiency = o.efficiency,
                             .optimizer = o.optimizer};
    memory = estimate_memory(*gpu, flops);
    if (std::string w = check_memory(*memory, *gpu); !w.empty()) warnings.push_back(w);
    profile = profile_from_flops(*gpu, flops);
    if (strong) {
      FlopModelOptions whole = flops;
      whole.batch = o.batch;
      single_ms = plain_step_ms(profile_from_flops(*gpu, whole), o.compute_scale);
    }
  }
  if (profile.comm_hook && *profile.comm_hook != o.comm_hook) {
    // The profile is compute; its all-reduces are not replayed. But a user who traced a bf16
    // run and predicts it without the flag gets 4-byte buckets without knowing (an outside
    // tester's).
    const bool known = *profile.comm_hook == "allreduce" || *profile.comm_hook == "bf16";
    warnings.push_back(fmt::format(
        "--profile {}: its all-reduces ran the comm hook '{}', but --comm-hook is '{}': the "
        "buckets are priced at {} bytes per element; {}",
        o.profile_path, *profile.comm_hook, o.comm_hook, o.comm_hook == "bf16" ? 2 : 4,
        known ? fmt::format("give --comm-hook {} to predict the traced run", *profile.comm_hook)
              : std::string("that hook is not one nanoddp-sim models (allreduce, bf16)")));
  }
  const double grad_bytes = o.comm_hook == "bf16" ? 2.0 : 4.0;
  std::vector<std::int64_t> numels;
  for (const GradientWork& g : profile.grads) numels.push_back(g.numel);
  std::vector<double> bucket_bytes;
  for (const SimBucket& b : cut_buckets(numels, o.first_bucket_mb, o.bucket_cap_mb)) {
    bucket_bytes.push_back(static_cast<double>(b.numel) * grad_bytes);
  }

  SimReport report;
  report.profile = &profile;
  report.memory = memory;
  report.inputs = inputs_json(o);
  report.provenance = o.provenance;
  report.build = common::build_info();
  const bool hier_fitted = !o.fit_intra_path.empty();
  const Cluster host{.nodes = 1, .gpus_per_node = cluster.gpus_per_node};
  const Cluster leaders{.nodes = cluster.nodes, .gpus_per_node = 1};
  NetworkNotes notes;
  if (!o.profile_path.empty()) notes.files.push_back(file_entry("--profile", o.profile_path));
  if (!o.baseline_path.empty()) {
    notes.files.push_back(file_entry("--baseline-profile", o.baseline_path));
  }
  report.options = StepOptions{
      .cluster = cluster,
      .fabric = hier_fitted
                    ? level_fit(o, "--fit-intra", o.fit_intra_path, host, bucket_bytes, notes)
                    : network_from_flags(o, cluster, bucket_bytes, notes),
      .algorithm = parse_algorithm(o.algo),
      .bucket_cap_mb = o.bucket_cap_mb,
      .first_bucket_mb = o.first_bucket_mb,
      .overlap = o.overlap == "on",
      .grad_bytes = grad_bytes,
      .sync_allreduce = o.sync_allreduce == "on",
      .overlap_slowdown = o.overlap_slowdown,
      .compute_scale = o.compute_scale,
      .cores = o.cores,
      // nanoddp-bench-allreduce ran at the simulated world size,
      // gpus_per_node ranks sharing each node's cores.
      // (--fit-intra: one host's ranks, the same count.)
      .network_ranks = o.fit_path.empty() && !hier_fitted ? 0 : cluster.gpus_per_node,
      .peers = o.peers == "traced",
      .optimizer_in_backward = o.optimizer_in_backward == "on",
      .measured_cores = o.measured_cores,
      .mem_contention = o.mem_contention,
      .opt_contention = o.opt_contention};
  if (hier_fitted) {
    report.options.inter_fabric =
        level_fit(o, "--fit-inter", o.fit_inter_path, leaders, bucket_bytes, notes);
    // Measured with one rank per host: its ring thread had the host's cores to itself.
    report.options.inter_network_ranks = 1;
  }
  report.inputs["files"] = notes.files;
  warnings.insert(warnings.end(), profile.warnings.begin(), profile.warnings.end());
  // Small collectives below what a fit measured are priced from its smallest size (an upper
  // bound) or, with nothing measured below the line's window, from the line's intercept: say so.
  const double sync_bytes = 2.0 * cluster.world_size() * 4.0;
  const bool sync_priced =
      o.sync_allreduce == "on" && cluster.world_size() > 1 && !profile.other_includes_sync;
  const auto below_measured = [&](const Fabric& fabric, const Cluster& level,
                                  const std::string& flag, const std::string& path) {
    std::vector<std::string> what;
    double smallest = 1e300;
    if (sync_priced) {
      what.push_back(fmt::format("the per-step sync all-reduce ({:.0f} bytes)", sync_bytes));
      smallest = sync_bytes;
    }
    if (o.algo == "hier" && &fabric == &report.options.fabric) {
      what.push_back("the hierarchical all-reduce's status flag (4 bytes)");
      smallest = 4.0;
    }
    if (what.empty() || fabric.measured_min_bytes == 0 || smallest >= fabric.measured_min_bytes) {
      return;
    }
    const double price_ms = ring_allreduce_ms(level, fabric, smallest);
    warnings.push_back(fmt::format(
        "{} {}: {} {} smaller than the smallest size it measured ({:.0f} bytes): priced at "
        "{:.1f} us, {}; measure smaller sizes (nanoddp-bench-allreduce -b 8) for their own price",
        flag, path, fmt::join(what, " and "), what.size() > 1 ? "are" : "is",
        fabric.measured_min_bytes, price_ms * 1000.0,
        fabric.small_ms.empty() ? "the fitted line's intercept, extrapolated"
                                : "that size's measured time (an upper bound)"));
  };
  if (!o.fit_path.empty())
    below_measured(report.options.fabric, cluster, "--fit-allreduce", o.fit_path);
  if (hier_fitted) {
    below_measured(report.options.fabric, host, "--fit-intra", o.fit_intra_path);
    below_measured(*report.options.inter_fabric, leaders, "--fit-inter", o.fit_inter_path);
  }
  warnings.insert(warnings.end(), notes.warnings.begin(), notes.warnings.end());
  report.prediction = predict_step(profile, report.options);
  StepOptions ring = report.options, tree = report.options;
  ring.algorithm = Algorithm::kRing;
  tree.algorithm = Algorithm::kTree;
  StepPrediction ring_step = predict_step(profile, ring);
  StepPrediction tree_step = predict_step(profile, tree);
  if (strong) {
    make_strong(report.prediction, single_ms);
    make_strong(ring_step, single_ms);
    make_strong(tree_step, single_ms);
    report.global_batch = o.batch;
  }
  // A profile traced on W > 1 ranks holds that rank's compute beside W-1 others and its waits
  // for them: its own "plain step" is not a 1-process run, and an efficiency against it reads
  // near 100 % for a run that scaled badly. The baseline is the 1-rank trace's plain step, as
  // nanoddp-bench-ddp's (one process, no DDP); without one the efficiency is left out (null).
  const int traced_world = profile.measured ? profile.measured->world_size : 1;
  if (!o.baseline_path.empty()) {
    const ComputeProfile base = profile_from_trace(
        o.baseline_path, {.shape = o.shape_given ? std::optional<MlpShape>(shape) : std::nullopt,
                          .rank = 0,
                          .skip_steps = o.skip_steps,
                          .peers = false});
    warnings.insert(warnings.end(), base.warnings.begin(), base.warnings.end());
    if (base.measured && base.measured->world_size > 1) {
      fail(
          "--baseline-profile {}: a trace of {} ranks; the baseline is one plain process (a "
          "1-rank nanoddp-train --trace)",
          o.baseline_path, base.measured->world_size);
    }
    if (base.numel() != profile.numel()) {
      fail("--baseline-profile {}: {} parameters, but --profile {} has {}: not the same model",
           o.baseline_path, base.numel(), o.profile_path, profile.numel());
    }
    // The same batch per rank: weak scaling compares the same per-GPU work. Traces record it
    // since nanoddp-train writes a "run_config" event; older ones cannot be checked.
    if (base.batch && profile.batch && *base.batch != *profile.batch) {
      fail(
          "--baseline-profile {}: traced at batch {} per rank, but --profile {} at batch {}; the "
          "baseline is the same model at the same batch per rank: trace the 1-rank run with "
          "--batch {}",
          o.baseline_path, *base.batch, o.profile_path, *profile.batch, *profile.batch);
    }
    if (!base.batch || !profile.batch) {
      warnings.push_back(fmt::format(
          "--baseline-profile {}: the batch of {} is not recorded (a trace from before "
          "nanoddp-train recorded it), so it cannot be checked against the other's; the baseline "
          "must be traced at the same batch per rank",
          o.baseline_path,
          !base.batch && !profile.batch ? "either trace"
          : !base.batch                 ? fmt::format("--baseline-profile {}", o.baseline_path)
                                        : fmt::format("--profile {}", o.profile_path)));
    }
    const double base_ms = plain_step_ms(base, o.compute_scale);
    for (StepPrediction* p : {&report.prediction, &ring_step, &tree_step}) {
      p->single_gpu_step_ms = base_ms;
      p->scaling_efficiency = p->step_ms > 0 ? base_ms / p->step_ms : 0.0;
    }
    report.baseline = fmt::format(
        "the plain step of the 1-rank trace {} (one process, no DDP: forward + backward + "
        "optimizer + other)",
        o.baseline_path);
  } else if (traced_world > 1) {
    if (o.sweep_nodes || o.sweep) {
      fail(
          "--profile {} was traced on {} ranks: its step is not the plain 1-process baseline, so "
          "a sweep's efficiencies need --baseline-profile TRACE (a 1-rank trace)",
          o.profile_path, traced_world);
    }
    report.no_efficiency = true;
    report.baseline = fmt::format(
        "none: --profile {} was traced on {} ranks, its compute includes running beside and "
        "waiting for the others; give --baseline-profile with a 1-rank trace for an efficiency",
        o.profile_path, traced_world);
    warnings.push_back(fmt::format(
        "no scaling efficiency: --profile {} is rank {} of a {}-rank run, whose step is not the "
        "plain 1-process baseline; give --baseline-profile TRACE (a 1-rank trace of the same "
        "model and batch)",
        o.profile_path, o.rank, traced_world));
  }
  report.band = {.ring_step_ms = ring_step.step_ms,
                 .ring_efficiency = ring_step.scaling_efficiency,
                 .tree_step_ms = tree_step.step_ms,
                 .tree_efficiency = tree_step.scaling_efficiency};
  if (o.sweep_buckets) {
    report.sweep = sweep_bucket_caps(profile, report.options, default_sweep_caps(o.bucket_cap_mb));
  }
  if (o.sweep_nodes && strong) {
    report.scaling = sweep_nodes_strong(*gpu, flops, o.batch, single_ms, report.options, &warnings);
    report.scaling_ring = sweep_nodes_strong(*gpu, flops, o.batch, single_ms, ring, nullptr);
    report.scaling_tree = sweep_nodes_strong(*gpu, flops, o.batch, single_ms, tree, nullptr);
  } else if (o.sweep_nodes) {
    report.scaling = sweep_nodes(profile, report.options);
    report.scaling_ring = sweep_nodes(profile, ring);
    report.scaling_tree = sweep_nodes(profile, tree);
    if (!o.baseline_path.empty()) {
      // Against the 1-rank trace's step, as the main prediction.
      const double base_ms = report.prediction.single_gpu_step_ms;
      for (auto* rows : {&report.scaling, &report.scaling_ring, &report.scaling_tree}) {
        for (ScalingRow& row : *rows) {
          row.scaling_efficiency = row.step_ms > 0 ? base_ms / row.step_ms : 0.0;
        }
      }
    }
  }
  for (std::string& w : range_warnings(cluster, report.options.fabric, gpu)) {
    warnings.push_back(std::move(w));
  }
  report.warnings = warnings;
  return report;
}

}  // namespace nanoddp::sim
