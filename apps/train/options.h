#pragma once
// nanoddp-train's command line: every flag, its default and its check.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nanoddp::train {

struct TrainOptions {
  std::string device = "cpu";
  // regression (MSE on float targets) or classify (cross-entropy on class indices in
  // [0, classes); the model has `classes` outputs).
  std::string task = "regression";
  std::int64_t classes = 0;
  std::string gemm = "hand";
  std::int64_t in_features = 32;
  std::int64_t out_features = 8;
  std::int64_t hidden = 128;
  std::int64_t layers = 2;
  std::string activation = "relu";
  std::int64_t batch = 64;
  // Samples per optimizer step over all ranks: --batch becomes global_batch / (world size x
  // --grad-accum), so a run resumed at another world size (an elastic round) keeps the schedule.
  std::optional<std::int64_t> global_batch;
  std::optional<std::int64_t> steps;
  std::optional<std::int64_t> epochs;
  std::int64_t dataset_size = 65536;
  float noise_std = 1e-3f;
  std::int64_t teacher_hidden = 0;
  float lr = 1e-3f;
  std::string optimizer = "adamw";
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::string data_path;
  std::string targets_path;
  std::int64_t log_every = 50;
  std::string metrics_path;
  std::string save_path;
  int threads = 1;
  bool quiet = false;
  // A step whose loss (on any rank) or averaged gradients are NaN or Inf: stop (default), or
  // skip its optimizer update on every rank and go on.
  bool skip_nonfinite = false;
  // Update each parameter during backward, as soon as its gradient is final (under DDP: as
  // soon as its bucket is averaged), instead of one optimizer pass after backward.
  bool optimizer_in_backward = false;
  // Prepare the next batch on a background thread while the current step computes.
  bool prefetch = false;

  // Distributed (active when launched by nanoddp-run, torchrun, mpirun or srun).
  std::string backend = "auto";  // gloo | nccl | auto (by device)
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool overlap = true;
  std::int64_t grad_accum = 1;
  std::string comm_hook = "allreduce";
  bool find_unused_parameters = false;
  // ZeRO: 0 plain DDP, 1 optimizer state sharded over the ranks, 2 the averaged gradients too.
  int zero = 0;
  bool zero_overlap_gather = false;

  // Checkpoints and timelines.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  int keep = 3;
  bool resume = false;
  std::string init_path;  // start from these parameters (safetensors) instead of the seeded init
  std::string trace_path;
  std::int64_t trace_steps = 20;
};

// Parses argv. On --help prints usage and returns nullopt with exit_code 0; on a bad flag or
// value prints a message naming the flag and returns nullopt with exit_code 2.
// nullopt with `exit_code` set (0 after --help, 2 for bad flags, the error printed; `problem`,
// when given, receives it).
std::optional<TrainOptions> parse_options(int argc, char** argv, int& exit_code,
                                          std::string* problem = nullptr);

}  // namespace nanoddp::train
