#pragma once
// nanoddp-sim's command line: every flag, its default, and the run it describes.

#include <cstdint>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "benchmarks/sim/report.h"

namespace nanoddp::sim {

struct CliOptions {
  // Compute profile: a trace, or the FLOP model.
  std::string profile_path;
  // The scaling baseline for a --profile traced on several ranks: a 1-rank trace of the same
  // model and batch (the plain 1-process step, as nanoddp-bench-ddp's baseline).
  std::string baseline_path;
  std::string model;  // "mlp"
  int rank = 0;
  int skip_steps = 1;
  std::int64_t in = 32, out = 8, hidden = 128, layers = 2;  // nanoddp-train's defaults
  bool shape_given = false;      // any of --in/--out/--hidden/--layers on the command line
  std::int64_t batch = 64;       // per GPU (weak) or global (strong)
  std::string scaling = "weak";  // model: weak (fixed batch per GPU) or strong (fixed global)
  std::string gpu = "h100";
  std::string precision = "fp32";
  double efficiency = 0.7;
  std::string optimizer = "adamw";

  // Cluster and network.
  int nodes = 1;
  int gpus_per_node = 8;
  std::string fabric = "nvlink4-ib400";
  std::optional<double> intra_bw_gbs, intra_lat_us, inter_bw_gbs, inter_lat_us, launch_us;
  std::string fit_path;
  // Unset: from half the smallest to twice the largest bucket (all sizes if fewer than two
  // measured sizes fall there).
  std::optional<std::string> fit_min_bytes, fit_max_bytes;
  std::string algo = "auto";
  // --algo hier: nanoddp-bench-allreduce rows of the two levels, each at its own ranks: one
  // host's K ranks (shared memory), and the N leaders, one rank per host (TCP).
  std::string fit_intra_path, fit_inter_path;

  // DDP.
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  std::string overlap = "on";
  std::string optimizer_in_backward = "off";
  std::string comm_hook = "allreduce";
  std::string sync_allreduce = "on";
  double overlap_slowdown = 0;
  double compute_scale = 1;
  int cores = 0;                         // CPU cores per node, shared by its ranks; 0 = unlimited
  int measured_cores = 0;                // cores the inputs were measured on; 0 = --cores
  double mem_contention = 1;             // compute slowdown of ranks sharing a host's memory
  std::optional<double> opt_contention;  // the optimizer's; unset: mem_contention
  std::string peers = "identical";       // or "traced": wait for the trace's slowest rank

  // Output.
  bool sweep_buckets = false;
  bool sweep_nodes = false;
  // --sweep NAME=v1,v2: the flag ("--hidden") and its values.
  std::optional<std::pair<std::string, std::vector<double>>> sweep;
  std::string json_path;  // "-" = stdout, instead of the table
  bool busbw = false;
  std::string busbw_min = "8M";
  std::string busbw_max = "8G";

  nlohmann::ordered_json provenance;  // filled by parse_cli: common::provenance()
};

// The options as structured fields (the JSON's "inputs"): what a script needs to redo the run.
nlohmann::ordered_json inputs_json(const CliOptions& options);

// Parses argv. On --help prints usage and returns nullopt with exit_code 0; on a bad flag or
// value prints a message naming the flag and returns nullopt with exit_code 2.
std::optional<CliOptions> parse_cli(int argc, char** argv, int& exit_code);

// Runs the simulation and prints it; returns the exit code (1: the --json file could not be
// written). Throws SimError for bad input (exit code 2).
int run_cli(const CliOptions& options);

// One prediction (the report run_cli prints, without --sweep's rows); `profile` holds the
// compute profile the report points to. Throws SimError for bad input.
SimReport simulate(const CliOptions& options, ComputeProfile& profile);

// nccl-tests style sizes: 8, 1K, 16M, 1G (powers of 1024). Throws SimError naming `flag`.
double parse_bytes(const std::string& text, const std::string& flag);

}  // namespace nanoddp::sim
