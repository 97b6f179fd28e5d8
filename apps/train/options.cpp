#include "options.h"

#include "common/cli.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <iostream>

namespace nanoddp::train {

namespace {

// Checks that CLI11's validators cannot express (relations between flags).
std::string check(const TrainOptions& o) {
  if (o.steps && o.epochs) return "--steps and --epochs are mutually exclusive: give one";
  if (o.data_path.empty() != o.targets_path.empty()) {
    return "--data and --targets go together: give both .npy files or neither";
  }
  if (o.task == "classify" && o.classes < 2) {
    return "--task classify needs --classes K (K >= 2 classes)";
  }
  if (o.task != "classify" && o.classes != 0) return "--classes needs --task classify";
  if (o.layers > 0 && o.hidden <= 0) return "--hidden must be positive when --layers > 0";
  if (!std::isfinite(o.lr) || o.lr <= 0.0f) return fmt::format("--lr must be > 0, got {}", o.lr);
  if (o.optimizer == "adamw" && o.momentum != 0.0f) {
    return "--momentum applies to --optimizer sgd only";
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    return "--resume needs --checkpoint-dir (where to look for the latest checkpoint)";
  }
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) {
    return "--checkpoint-every needs --checkpoint-dir";
  }
  if (o.backend == "nccl" && o.device == "cpu") {
    return "--backend nccl needs --device cuda (NCCL reduces GPU tensors; use gloo on the CPU)";
  }
  if (o.optimizer_in_backward && o.skip_nonfinite) {
    return "--optimizer-in-backward cannot be combined with --skip-nonfinite: the update is "
           "applied during backward, before the step's loss and gradients can be checked; drop "
           "one of the two";
  }
  if (o.zero_overlap_gather && o.zero == 0) {
    return "--zero-overlap-gather overlaps ZeRO's parameter all-gather with the next forward: it "
           "needs --zero 1 or --zero 2";
  }
  if (o.zero > 0 && o.optimizer_in_backward) {
    return fmt::format(
        "--zero {} cannot be combined with --optimizer-in-backward: under ZeRO each rank updates "
        "its shard after backward and the ranks then all-gather the parameters; drop one of the "
        "two",
        o.zero);
  }
  if (o.gemm == "cublas" && o.device == "cpu") {
    return "--gemm cublas needs --device cuda (on the CPU use --gemm hand or --gemm eigen)";
  }
  if (o.gemm == "eigen" && o.device != "cpu") {
    return "--gemm eigen runs on the CPU only (on CUDA use --gemm hand or --gemm cublas)";
  }
  return {};
}

}  // namespace

std::optional<TrainOptions> parse_options(int argc, char** argv, int& exit_code,
                                          std::string* parse_problem) {
  TrainOptions o;
  CLI::App app{
      "nanoddp-train: train an MLP regression (MSE loss) or classifier (--task classify,\n"
      "cross-entropy) with nanoddp.\n"
      "Data: a synthetic teacher-student task addressed by global sample index, or\n"
      "--data/--targets .npy files."};
  app.get_formatter()->column_width(34);

  app.add_option("--task", o.task,
                 "regression (MSE on float targets) or classify (cross-entropy on class indices, "
                 "needs --classes)")
      ->check(CLI::IsMember({"regression", "classify"}))
      ->capture_default_str();
  app.add_option("--classes", o.classes,
                 "--task classify: classes K; the model has K outputs (--out defaults to K)")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 24));
  app.add_option("--device", o.device,
                 "cpu, cuda (cuda:LOCAL_RANK modulo the visible devices) or cuda:N")
      ->capture_default_str();
  app.add_option("--gemm", o.gemm,
                 "GEMM: hand (nanoddp's kernels), or the reference: eigen (CPU), cublas (CUDA)")
      ->check(CLI::IsMember({"hand", "eigen", "cublas"}))
      ->capture_default_str();
  app.add_option("--in", o.in_features, "input features (synthetic data)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--out", o.out_features, "output features (synthetic data)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "width of the hidden layers")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--layers", o.layers,
                 "hidden layers L: L+1 Linear modules; 0 = one Linear(in, out)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1000}))
      ->capture_default_str();
  app.add_option("--activation", o.activation, "relu or gelu (tanh form)")
      ->check(CLI::IsMember({"relu", "gelu"}))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "samples per step")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--global-batch", o.global_batch,
                 "samples per step over all ranks, instead of --batch: each rank takes "
                 "global-batch / (ranks x --grad-accum), so a resume at another world size keeps "
                 "the schedule")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->excludes("--batch");
  app.add_option("--steps", o.steps, "optimizer steps to run (default 1000)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--epochs", o.epochs, "passes over the data set (instead of --steps)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  app.add_option("--dataset-size", o.dataset_size, "samples in the synthetic data set")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--noise", o.noise_std, "std of the noise on synthetic targets")
      ->check(CLI::Range(0.0f, 1e6f))
      ->capture_default_str();
  app.add_option("--teacher-hidden", o.teacher_hidden,
                 "hidden width of the synthetic teacher (0 = linear teacher)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "weight decay (decoupled for AdamW)")
      ->check(CLI::Range(0.0f, 1e3f))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the model init, the data and the shuffle")
      ->capture_default_str();
  app.add_flag("!--no-shuffle", o.shuffle,
               "visit samples in order instead of reshuffling per epoch");
  app.add_option("--data", o.data_path, "inputs: a 2-D float32/float64 .npy file (N x in)")
      ->check(cli::non_empty_path())
      ->check(CLI::ExistingFile);
  app.add_option("--targets", o.targets_path,
                 "targets: a 2-D .npy file (N x out); --task classify: a 1-D int64/int32 .npy of "
                 "class indices in [0, K)")
      ->check(cli::non_empty_path())
      ->check(CLI::ExistingFile);
  app.add_option("--log-every", o.log_every, "print progress every N steps")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--metrics", o.metrics_path, "write one JSON line per logged step to FILE")
      ->check(cli::non_empty_path());
  app.add_option("--save", o.save_path, "save the final parameters as a safetensors FILE")
      ->check(cli::non_empty_path());
  app.add_option("--init", o.init_path,
                 "start from the parameters in a safetensors FILE (as --save writes them, or "
                 "PyTorch's state_dict of the same model); rank 0 reads it and DDP broadcasts it")
      ->check(cli::non_empty_path());  // its existence: checked when read (not on a resume)
  app.add_option("--threads", o.threads,
                 "CPU GEMM threads (nanoddp's kernels and Eigen's; the bits do not depend on it)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "print only the summary");
  app.add_flag("--skip-nonfinite", o.skip_nonfinite,
               "skip (on every rank) an optimizer step whose loss or gradients are NaN/Inf, "
               "instead of stopping");
  app.add_flag("--prefetch", o.prefetch,
               "prepare the next batch on a background thread while the step computes (uses "
               "another core; data_ms is then the time the step waited for its batch)");
  app.add_flag("--optimizer-in-backward", o.optimizer_in_backward,
               "update each parameter during backward as soon as its gradient is final (under "
               "DDP: its bucket is averaged); same result, less memory traffic");

  // Distributed training: active when a launcher set RANK/WORLD_SIZE (nanoddp-run, torchrun).
  app.add_option("--backend", o.backend, "collectives: gloo (CPU), nccl (CUDA) or auto")
      ->check(CLI::IsMember({"auto", "gloo", "nccl"}))
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "DDP bucket size cap (MiB)")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  app.add_option("--first-bucket-mb", o.first_bucket_mb, "cap of the first (small) bucket (MiB)")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  app.add_flag("!--no-overlap", o.overlap,
               "reduce all buckets after backward instead of during it (for comparison)");
  app.add_option("--grad-accum", o.grad_accum,
                 "micro-batches per optimizer step (all but the last under no_sync)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--comm-hook", o.comm_hook, "allreduce (float32) or bf16 (compressed)")
      ->check(CLI::IsMember({"allreduce", "bf16"}))
      ->capture_default_str();
  app.add_flag("--find-unused-parameters", o.find_unused_parameters,
               "zero-fill and reduce gradients of parameters unused in a step");
  app.add_option("--zero", o.zero,
                 "ZeRO stage: 0 plain DDP, 1 optimizer state sharded over the ranks, 2 the "
                 "averaged gradients too (reduce-scatter instead of all-reduce)")
      ->check(CLI::IsMember({0, 1, 2}))
      ->capture_default_str();
  app.add_flag("--zero-overlap-gather", o.zero_overlap_gather,
               "with --zero: run the parameter all-gathers during the next forward, each waited "
               "for before the first layer that reads it, instead of after the step");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "directory of step-N.safetensors checkpoints")
      ->check(cli::non_empty_path("a folder name"));
  app.add_option("--checkpoint-every", o.checkpoint_every, "save a checkpoint every N steps")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--keep", o.keep, "checkpoints to keep")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "continue from the latest checkpoint in --checkpoint-dir");
  app.add_option("--trace", o.trace_path, "write a Chrome trace (Perfetto) of the first steps")
      ->check(cli::non_empty_path());
  app.add_option("--trace-steps", o.trace_steps, "steps recorded by --trace")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();

  if (const std::optional<int> code = cli::parse(app, argc, argv, "nanoddp-train", parse_problem)) {
    exit_code = *code;
    return std::nullopt;
  }
  std::string problem = check(o);
  // The synthetic classifier's teacher has K outputs, one per class: --out is K.
  if (problem.empty() && o.task == "classify") {
    if (app.count("--out") > 0 && o.out_features != o.classes) {
      problem = fmt::format(
          "--out {} differs from --classes {}: a classifier has one output per class (drop "
          "--out, it defaults to --classes)",
          o.out_features, o.classes);
    }
    o.out_features = o.classes;
  }
  // The synthetic data's flags mean nothing with --data: the .npy files set the sizes. Given
  // both, the user expects one of them to matter; say which does instead of ignoring it.
  for (const char* flag : {"--in", "--out", "--dataset-size"}) {
    if (problem.empty() && !o.data_path.empty() && app.count(flag) > 0) {
      problem = fmt::format(
          "{} sets a size of the synthetic data; with --data the .npy files set the sizes (even "
          "an equal value would be ignored): drop {}",
          flag, flag);
    }
  }
  for (const char* flag : {"--noise", "--teacher-hidden"}) {
    if (problem.empty() && !o.data_path.empty() && app.count(flag) > 0) {
      problem = fmt::format(
          "{} shapes the synthetic teacher's data only; with --data it would be ignored: drop {}",
          flag, flag);
    }
  }
  // A flag that only qualifies another one, given without it, would be ignored: the user
  // expected checkpoints (or a trace) that never come.
  const struct {
    const char* flag;
    bool needed;
    const char* what;
  } qualifiers[] = {
      {"--keep", o.checkpoint_every == 0,
       "--keep counts checkpoints: it needs --checkpoint-every N"},
      {"--trace-steps", o.trace_path.empty(), "--trace-steps needs --trace FILE"},
      {"--checkpoint-dir", o.checkpoint_every == 0 && !o.resume,
       "--checkpoint-dir alone writes no checkpoint: add --checkpoint-every N (or --resume to "
       "continue from one)"}};
  for (const auto& q : qualifiers) {
    if (problem.empty() && q.needed && app.count(q.flag) > 0) problem = q.what;
  }
  if (!problem.empty()) {
    std::cerr << "nanoddp-train: error: " << problem << "\n";
    if (parse_problem != nullptr) *parse_problem = problem;
    exit_code = 2;
    return std::nullopt;
  }
  exit_code = 0;
  return o;
}

}  // namespace nanoddp::train
