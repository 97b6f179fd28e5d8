#include "trainer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "nanoddp/comm/consistency.h"
#include "nanoddp/config.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"

namespace nanoddp::train {

namespace {

// How many elements of `t` are NaN or Inf: one pass over the buffer on its device, at memory
// speed (a scalar std::isfinite loop over a 16 MiB gradient cost more than the optimizer step).
std::int64_t count_nonfinite(const Tensor& t) {
  Tensor count = Tensor::empty({}, t.device());
  backend_for(t.device()).count_nonfinite(t.data(), t.numel(), count.data());
  return static_cast<std::int64_t>(count.item());
}

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
}

// Creates `dir` if needed and creates (then removes) a small file in it: O_EXCL, so an existing
// file of that name is never touched. `flag` names the option in the message.
void check_dir_writable(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("{} '{}' cannot be created: {}", flag, dir, ec.message());
  if (!std::filesystem::is_directory(dir, ec)) {
    fail("{} '{}' is not a folder (it is a file); name a folder", flag, dir);
  }
  for (int k = 0;; ++k) {
    const std::filesystem::path probe =
        std::filesystem::path(dir) / fmt::format(".nanoddp-write-test.{}.{}", ::getpid(), k);
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST && k < 100) continue;
    if (fd < 0) {
      fail("{} '{}' is not writable (cannot create '{}': {})", flag, dir, probe.string(),
           std::strerror(errno));
    }
    ::close(fd);
    ::unlink(probe.c_str());
    return;
  }
}

// An output FILE given by `flag`, checked before step 1 instead of failing after the last one:
// it must name a file (not a folder, no trailing '/'), its folder must be writable (a probe file
// is created and removed there), and an existing file there must be writable.
void check_output_file(const std::string& flag, const std::string& path) {
  std::error_code ec;
  if (path.ends_with('/') || std::filesystem::is_directory(path, ec)) {
    fail("{} '{}' names a folder; give a file name (e.g. '{}')", flag, path,
         (std::filesystem::path(path) / "out").lexically_normal().string());
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  check_dir_writable(fmt::format("the folder of {}", flag),
                     folder.empty() ? std::string(".") : folder.string());
  if (std::filesystem::exists(path, ec)) {
    // Opened without O_TRUNC and closed at once: the existing contents are kept.
    // O_NONBLOCK: a FIFO without a reader would block the open (it fails with ENXIO instead).
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("{} '{}' exists and is not writable: {}", flag, path, std::strerror(errno));
    ::close(fd);
  }
}

// The settings of nn::Mlp::describe(), "MLP(in=4, out=2, hidden=8, ...)", as key -> value.
std::map<std::string, std::string> model_settings(const std::string& description) {
  std::map<std::string, std::string> settings;
  const auto open = description.find('('), close = description.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return settings;
  std::string_view rest = std::string_view(description).substr(open + 1, close - open - 1);
  while (!rest.empty()) {
    const auto comma = rest.find(", ");
    const std::string_view item = rest.substr(0, comma);
    if (const auto eq = item.find('='); eq != std::string_view::npos) {
      settings.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
  }
  return settings;
}

// "" when `recorded` (the model a file was saved from) computes what `current` does; otherwise
// every setting that differs, with the flag that sets it.
std::string model_difference(const std::string& recorded, const std::string& current) {
  if (recorded == current) return {};
  static const std::map<std::string, std::string> kFlags = {{"in", "--in, or --data's columns"},
                                                            {"out", "--out, or --targets' columns"},
                                                            {"hidden", "--hidden"},
                                                            {"layers", "--layers"},
                                                            {"activation", "--activation"}};
  const auto then = model_settings(recorded), now = model_settings(current);
  std::vector<std::string> parts;
  for (const auto& [key, value] : now) {
    const auto it = then.find(key);
    if (it == then.end() || it->second == value) continue;  // not recorded, or the same
    const std::string& before = it->second;
    const auto flag = kFlags.find(key);
    parts.push_back(fmt::format("{} {} there, {} in this run ({})", key, before, value,
                                flag == kFlags.end() ? key : flag->second));
  }
  if (parts.empty()) parts.push_back(fmt::format("{} there, {} in this run", recorded, current));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// --device cuda: one GPU per local rank (LOCAL_RANK modulo the visible devices, see
// choose_device); --device cuda:N as given. Made current before anything touches CUDA, so that
// no stream, handle or context of this process lands on another rank's GPU.
Device select_device(const std::string& requested, int local_rank, bool quiet) {
  DeviceChoice choice;
  try {
    choice = choose_device(requested, local_rank, requested == "cpu" ? 0 : cuda_device_count());
    set_current_device(choice.device);
  } catch (const Error& e) {
    fail("--device {}: {} (--device cpu trains on the CPU)", requested, e.what());
  }
  if (choice.device.is_cuda() && !quiet) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    fmt::print("nanoddp-train: local rank {} uses {} ({}{}{})\n", local_rank, choice.device.str(),
               choice.why, visible != nullptr ? "; CUDA_VISIBLE_DEVICES=" : "",
               visible != nullptr ? visible : "");
    std::fflush(stdout);
  }
  return choice.device;
}

}  // namespace

struct Trainer::Window {
  double step_ms = 0, data_ms = 0, wall_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  double backward_ms = 0;  // backward compute: the backward() calls minus the exposed wait
  double forward_ms = 0;   // the forward pass and the loss
  // The optimizer step after backward, and the gradient NaN/Inf check before it (with
  // --optimizer-in-backward only the check: the updates are inside backward_ms), with, under DDP,
  // the one small all-reduce that exchanges the ranks' losses.
  double optimizer_ms = 0;
  std::int64_t steps = 0, samples = 0;
  std::int64_t host_syncs = 0;  // times the host waited for the device (engine/host_sync.h)
};

Trainer::Trainer(const TrainOptions& options) : o_(options) {
  world_ = comm::world_from_env();
  distributed_ = world_.launcher != "none";
  if (o_.global_batch) {
    // Elastic rounds: the same global batch at every world size that divides it.
    const std::int64_t ways = std::int64_t{world_.world_size} * o_.grad_accum;
    if (*o_.global_batch % ways != 0) {
      fail("--global-batch {} is not divisible by {} ranks x --grad-accum {}: pick a global batch "
           "that every world size of the job divides",
           *o_.global_batch, world_.world_size, o_.grad_accum);
    }
    o_.batch = *o_.global_batch / ways;
  }

  device_ = select_device(o_.device, world_.local_rank, o_.quiet);
  backend_for(device_).set_gemm_backend(o_.gemm == "cublas"  ? GemmBackend::kCublas
                                        : o_.gemm == "eigen" ? GemmBackend::kEigen
                                                             : GemmBackend::kHand);
  kernels::cpu::set_gemm_threads(o_.threads);

  // Rank 0 writes every output: find out now, not after hours of training, that it cannot.
  // (Before the process group: a launcher then stops the other ranks at once.)
  if (world_.rank == 0) check_output_paths();
  // Which run writes the checkpoints (a resumed run takes over the id it resumed): housekeeping
  // removes only this run's.
  run_id_ = fmt::format("{}-{}-{}", nn::this_host(), ::getpid(),
                        std::chrono::system_clock::now().time_since_epoch().count());

  if (distributed_) {
    dist_.emplace(comm::init_distributed(
        world_, comm::DistributedOptions{.backend = o_.backend, .device = device_}));
    rank_ = dist_->group->rank();
    world_size_ = dist_->group->size();
    check_same_settings();
  }

  if (!o_.data_path.empty()) {
    load_npy_dataset();
  } else {
    dataset_ = std::make_unique<nn::SyntheticRegression>(
        nn::SyntheticRegressionOptions{.in_features = o_.in_features,
                                       .out_features = o_.out_features,
                                       .size = o_.dataset_size,
                                       .seed = o_.seed,
                                       .noise_std = o_.noise_std,
                                       .teacher_hidden = o_.teacher_hidden});
  }
  if (distributed_) check_same_inputs();
  model_ =
      std::make_unique<nn::Mlp>(nn::MlpOptions{.in_features = dataset_->in_features(),
                                               .out_features = dataset_->out_features(),
                                               .hidden = o_.hidden,
                                               .layers = o_.layers,
                                               .activation = nn::parse_activation(o_.activation),
                                               .seed = o_.seed});
  params_ = std::make_unique<nn::FlatParameters>(*model_, device_);
  if (o_.optimizer == "sgd") {
    optimizer_ = std::make_unique<nn::SGD>(
        *params_,
        nn::SgdOptions{.lr = o_.lr, .momentum = o_.momentum, .weight_decay = o_.weight_decay});
  } else {
    optimizer_ = std::make_unique<nn::AdamW>(
        *params_, nn::AdamWOptions{.lr = o_.lr, .weight_decay = o_.weight_decay});
  }

  // The sampler holds the epoch's order: 8 bytes per sample, twice with --prefetch. A data set
  // whose order alone would take half the machine's memory is refused up front, naming the
  // flag, instead of ending in std::bad_alloc (or swapping for minutes).
  const double order_bytes = 8.0 * static_cast<double>(dataset_->size()) * (o_.prefetch ? 2 : 1);
  const double memory_bytes =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (memory_bytes > 0 && order_bytes > 0.5 * memory_bytes) {
    fail("{} {} samples: the sampling order alone needs {:.1f} GB, more than half of this "
         "machine's {:.1f} GB of memory",
         o_.data_path.empty() ? "--dataset-size" : "--data", dataset_->size(), order_bytes / 1e9,
         memory_bytes / 1e9);
  }
  try {
    sampler_ = std::make_unique<nn::Sampler>(nn::SamplerOptions{.size = dataset_->size(),
                                                                .shuffle = o_.shuffle,
                                                                .seed = o_.seed,
                                                                .rank = rank_,
                                                                .world_size = world_size_});
  } catch (const std::bad_alloc&) {
    fail("{} {} samples: out of memory for the sampling order ({:.1f} GB)",
         o_.data_path.empty() ? "--dataset-size" : "--data", dataset_->size(), order_bytes / 1e9);
  }
  // An epoch's last step may have fewer micro-batches (and its last micro-batch fewer rows),
  // exactly as --batch K*B's last batch is partial: no sample of the epoch is left out.
  micro_batches_per_epoch_ = sampler_->num_batches(o_.batch);
  steps_per_epoch_ = (micro_batches_per_epoch_ + o_.grad_accum - 1) / o_.grad_accum;
  if (steps_per_epoch_ == 0) fail("the data set has no samples");
  steps_ = o_.epochs ? *o_.epochs * steps_per_epoch_ : o_.steps.value_or(1000);
  if (o_.prefetch) {
    // Each rank's worker wants a core of its own; without one it slows the steps down (2 ranks
    // on 2 cores: -12 % samples/s measured). Say so rather than let it look like a bug.
    const unsigned cores = std::thread::hardware_concurrency();
    const int ranks_here = distributed_ ? world_.local_world_size : 1;
    const int threads_per_rank = o_.device == "cpu" ? o_.threads + 1 : 2;
    if (is_main() && cores > 0 && static_cast<unsigned>(ranks_here * threads_per_rank) > cores) {
      fmt::print(stderr,
                 "nanoddp-train: note: --prefetch adds a data thread to each of the {} rank(s) on "
                 "this host, which has {} cores: the threads will compete with the steps\n",
                 ranks_here, cores);
    }
    lookahead_sampler_ = std::make_unique<nn::Sampler>(sampler_->options());
    prefetcher_ = std::make_unique<nn::BatchPrefetcher>(
        *dataset_, nn::BatchPrefetcherOptions{.timeout = comm::default_timeout()});
  }

  // A given starting point: every rank reads and checks it (the ranks agreed on its bytes
  // above), so a bad file stops every rank at once instead of rank 0 alone while the others
  // wait for it; DDP's constructor then broadcasts rank 0's parameters. A checkpoint found by
  // --resume comes after it.
  if (!o_.init_path.empty()) {
    try {
      check_init_model();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.starts_with("--init")) throw;
      fail("--init: {}", what);  // the reader names the file; say which flag gave it
    }
    try {
      nn::load_parameters(o_.init_path, *model_);
    } catch (const Error& e) {
      fail("--init: {}", e.what());  // the loader names the file; say which flag gave it
    }
    if (is_main()) fmt::print("init: parameters from {}\n", o_.init_path);
  }
  if (o_.resume) resume();
  if (world_.restart_count > 0 && !o_.resume && is_main()) {
    // A restarted attempt (nanoddp-run --max-restarts, torchrun --max_restarts) without --resume
    // redoes the failed attempt's work from step 0: say so, it is rarely what was meant.
    fmt::print(stderr,
               "nanoddp-train: warning: this is restart {} of the job (NANODDP_RESTART_COUNT or "
               "TORCHELASTIC_RESTART_COUNT) but --resume is not set: training starts again from "
               "step 0. Pass --checkpoint-dir D --checkpoint-every N --resume to continue from the "
               "newest checkpoint.\n",
               world_.restart_count);
  }

  if (distributed_) {
    ddp_ = std::make_unique<comm::DistributedDataParallel>(
        *model_, *params_, dist_->group, dist_->store,
        comm::DdpOptions{
            .reducer = {.bucket_cap_mb = o_.bucket_cap_mb,
                        .first_bucket_mb = o_.first_bucket_mb,
                        .find_unused_parameters = o_.find_unused_parameters,
                        .comm_hook = comm::parse_comm_hook(o_.comm_hook),
                        .overlap = o_.overlap}});
  }
  if (o_.optimizer_in_backward) {
    // Single process: each parameter's own hook updates it. Under DDP its gradient is final only
    // once its bucket is averaged, so the Reducer hands over bucket after bucket instead.
    optimizer_in_backward_ = std::make_unique<nn::OptimizerInBackward>(
        *optimizer_, *params_, nn::OptimizerInBackwardOptions{.hook_parameters = !ddp_});
    if (ddp_) {
      ddp_->reducer().set_bucket_reduced_hook([this](const comm::Bucket& bucket) {
        optimizer_in_backward_->update_range(bucket.offset, bucket.numel, bucket.slots);
      });
    }
  }
  if (!o_.trace_path.empty()) tracer_ = std::make_unique<Tracer>(rank_);
  if (!o_.metrics_path.empty() && is_main()) {
    // A resumed run continues the earlier run's metrics instead of erasing them.
    metrics_.open(o_.metrics_path, start_step_ > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics_) fail("cannot open --metrics file '{}' for writing", o_.metrics_path);
  }
}

// Every rank must train with the same settings: a rank with another batch size or bucket cap
// would issue different collectives (a hang, not an error, without this check), and one with
// other data settings would train on other samples (no error at all).
void Trainer::check_same_settings() {
  const std::vector<std::string> settings = {
      fmt::format("--in {} --out {}", o_.in_features, o_.out_features),
      fmt::format("--hidden {} --layers {} --activation {}", o_.hidden, o_.layers, o_.activation),
      fmt::format("--batch {}", o_.batch),
      fmt::format("--grad-accum {}", o_.grad_accum),
      fmt::format("--steps {} --epochs {}", o_.steps.value_or(0), o_.epochs.value_or(0)),
      // Not --data's path: the same file may be mounted at other paths on other nodes, and the
      // same path may name other files. check_same_inputs() compares the contents.
      fmt::format("--dataset-size {} --data given {}", o_.dataset_size, !o_.data_path.empty()),
      fmt::format("--init given {}", !o_.init_path.empty()),
      // They define the synthetic samples: other values on one rank mean other data, silently.
      fmt::format("--noise {} --teacher-hidden {}", o_.noise_std, o_.teacher_hidden),
      fmt::format("--optimizer {} --lr {} --momentum {} --weight-decay {}", o_.optimizer, o_.lr,
                  o_.momentum, o_.weight_decay),
      fmt::format("--seed {} --shuffle {}", o_.seed, o_.shuffle),
      fmt::format("--log-every {}", o_.log_every),
      fmt::format("--skip-nonfinite {}", o_.skip_nonfinite),
      fmt::format("--optimizer-in-backward {}", o_.optimizer_in_backward),
      fmt::format("--checkpoint-every {} --resume {}", o_.checkpoint_every, o_.resume),
      fmt::format("--trace-steps {} (trace {})", o_.trace_steps, !o_.trace_path.empty()),
  };
  comm::check_same_on_all_ranks(*dist_->store, rank_, world_size_, "train/settings",
                                "command-line setting", settings);
}

// Every output path, checked by rank 0 (which writes them all) before the process group.
void Trainer::check_output_paths() const {
  std::error_code ec;
  if (!o_.checkpoint_dir.empty() && std::filesystem::exists(o_.checkpoint_dir, ec) &&
      !std::filesystem::is_directory(o_.checkpoint_dir, ec)) {
    // With --resume this used to find "no checkpoint" and train from step 0, silently.
    fail("--checkpoint-dir '{}' is a file, not a folder: name the folder of the checkpoints",
         o_.checkpoint_dir);
  }
  if (o_.checkpoint_every > 0) {
    check_dir_writable("--checkpoint-dir", o_.checkpoint_dir);
    // Another run's checkpoints: this run would write beside them (a later --resume takes the
    // newest of either run) and could meet one of the same step. Refused rather than guessed.
    const std::vector<std::string> earlier = nn::list_checkpoints(o_.checkpoint_dir);
    if (!o_.resume && !earlier.empty()) {
      fail(
          "--checkpoint-dir '{}' already holds {} checkpoint(s) of an earlier run (newest: {}). "
          "Pass --resume to continue that run, or use an empty folder (or remove them) to start "
          "a new one",
          o_.checkpoint_dir, earlier.size(), earlier.back());
    }
  }
  if (!o_.save_path.empty()) {
    // Written by rename: a device or FIFO of that name would be replaced, not written to.
    if (std::filesystem::exists(o_.save_path, ec) &&
        !std::filesystem::is_regular_file(o_.save_path, ec) &&
        !std::filesystem::is_directory(o_.save_path, ec)) {
      fail("--save '{}' exists and is not a regular file (a device or FIFO); name a file",
           o_.save_path);
    }
    check_output_file("--save", o_.save_path);
  }
  if (!o_.trace_path.empty()) check_output_file("--trace", o_.trace_path);
  if (!o_.metrics_path.empty()) check_output_file("--metrics", o_.metrics_path);
  check_paths_distinct();
}

// Two outputs on one file lose one of them silently (--save f --trace f kept the trace), and an
// output on an input destroys it (--metrics X.npy overwrote the data): refused before step 1.
// The final --save must not take a checkpoint's name either (a later --resume would find the
// parameters file where it expects the checkpoint).
void Trainer::check_paths_distinct() const {
  struct Named {
    const char* flag;
    const std::string* path;
    bool output;
  };
  const Named all[] = {{"--save", &o_.save_path, true},     {"--trace", &o_.trace_path, true},
                       {"--metrics", &o_.metrics_path, true}, {"--data", &o_.data_path, false},
                       {"--targets", &o_.targets_path, false}, {"--init", &o_.init_path, false}};
  const auto canonical = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path c = std::filesystem::weakly_canonical(path, ec);
    return ec ? std::filesystem::absolute(path).lexically_normal() : c;
  };
  for (std::size_t i = 0; i < std::size(all); ++i) {
    if (all[i].path->empty()) continue;
    for (std::size_t j = i + 1; j < std::size(all); ++j) {
      if (all[j].path->empty() || !(all[i].output || all[j].output)) continue;
      if (canonical(*all[i].path) == canonical(*all[j].path)) {
        fail("{} '{}' and {} '{}' name the same file: {}", all[i].flag, *all[i].path, all[j].flag,
             *all[j].path,
             all[j].output ? "one output would overwrite the other; give each its own file"
                           : "the output would overwrite the input; write it elsewhere");
      }
    }
  }
  if (!o_.save_path.empty() && !o_.checkpoint_dir.empty() &&
      canonical(o_.save_path).parent_path() == canonical(o_.checkpoint_dir) &&
      nn::checkpoint_step_from_name(std::filesystem::path(o_.save_path).filename().string())) {
    fail("--save '{}' takes the name of a checkpoint in --checkpoint-dir '{}': save elsewhere",
         o_.save_path, o_.checkpoint_dir);
  }
}

void Trainer::load_npy_dataset() {
  try {
    dataset_ = std::make_unique<nn::NpyDataset>(o_.data_path, o_.targets_path);
    // Recorded in checkpoints (data_description): a --resume on other data of the same shape
    // is refused, not trained on silently.
    npy_checksums_ = fmt::format("checksums {} / {}",
                                 nn::checksum_hex(nn::file_checksum(o_.data_path)),
                                 nn::checksum_hex(nn::file_checksum(o_.targets_path)));
  } catch (const Error& e) {
    // The reader names the file; say which flag gave it.
    const std::string what = e.what();
    const bool data = what.find(o_.data_path) != std::string::npos;
    const bool targets = what.find(o_.targets_path) != std::string::npos;
    fail("{}: {}",
         data && !targets   ? "--data"
         : !data && targets ? "--targets"
                            : "--data/--targets",
         what);
  }
}

namespace {

// What a rank loaded from `path`, for comparing with the other ranks: its size and a checksum of
// its bytes, or why it could not be read (so that the rank takes part in the comparison and
// every rank fails together instead of one failing alone and the others waiting).
std::string file_fingerprint(const std::string& path) {
  try {
    return fmt::format("{} bytes, checksum {}", std::filesystem::file_size(path),
                       nn::checksum_hex(nn::file_checksum(path)));
  } catch (const std::exception& e) {
    return fmt::format("unreadable ({})", e.what());
  }
}

}  // namespace

// The ranks must load the same bytes, not merely the same path: two nodes' copies of a file can
// differ, and one path can name other files on other nodes. Each rank checksums what it read.
void Trainer::check_same_inputs() {
  std::vector<std::string> items;
  std::vector<std::string> paths;
  const auto add = [&](const std::string& flag, const std::string& path) {
    items.push_back(fmt::format("{}: {}", flag, file_fingerprint(path)));
    paths.push_back(fmt::format("{} '{}'", flag, path));
  };
  if (!o_.data_path.empty()) {
    items.push_back(fmt::format("--data/--targets shape: {} samples x {} -> {}", dataset_->size(),
                                dataset_->in_features(), dataset_->out_features()));
    paths.push_back("--data/--targets");
    add("--data", o_.data_path);
    add("--targets", o_.targets_path);
  }
  if (!o_.init_path.empty()) add("--init", o_.init_path);
  check_same_files("train/inputs", items, paths);
}

void Trainer::check_same_files(const std::string& key, const std::vector<std::string>& items,
                               const std::vector<std::string>& paths) {
  try {
    comm::check_same_on_all_ranks(*dist_->store, rank_, world_size_, key, "input file", items);
  } catch (const Error& e) {
    // Name this rank's file of the item that differs, as every rank may have another path.
    const std::string what = e.what();
    std::string here;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (what.find(fmt::format("#{} ", i)) != std::string::npos) here = paths[i];
    }
    fail("{}{}", what, here.empty() ? "" : fmt::format(" This rank read {}.", here));
  }
}

// An --init file written by nanoddp-train --save records the model it came from: another
// activation (the one setting the tensors' shapes do not show) computes another function.
void Trainer::check_init_model() const {
  const nn::SafetensorsMetadata metadata = nn::read_safetensors_metadata(o_.init_path);
  std::string recorded;
  if (const auto model = metadata.find("model"); model != metadata.end()) {
    recorded = model->second;
  } else if (const auto act = metadata.find("activation"); act != metadata.end()) {
    // Written before "model" was recorded: the activation is all there is to compare.
    recorded = fmt::format("MLP(activation={})", act->second);
    const std::string current = fmt::format("MLP(activation={})", o_.activation);
    if (recorded == current) return;
    fail("--init '{}' was saved from another model: {}", o_.init_path,
         model_difference(recorded, current));
  } else {
    return;  // not nanoddp's (PyTorch's state_dict): the shapes are all that can be checked
  }
  const std::string difference = model_difference(recorded, model_->describe());
  if (!difference.empty()) {
    fail("--init '{}' was saved from another model: {}", o_.init_path, difference);
  }
}

void Trainer::resume() {
  // Rank 0 picks the checkpoint and tells the others, so all load the same file even if a new
  // one appears meanwhile.
  std::string path;
  if (is_main()) {
    const std::vector<std::string> all = nn::list_checkpoints(o_.checkpoint_dir);
    path = all.empty() ? "" : all.back();
  }
  if (distributed_) {
    if (is_main()) dist_->store->set("train/resume", path.empty() ? std::string("-") : path);
    path = dist_->store->get_string("train/resume");
    if (path == "-") path.clear();
  }
  if (path.empty()) {
    if (is_main())
      fmt::print("resume: no checkpoint in {}, starting from step 0\n", o_.checkpoint_dir);
    return;
  }
  // Every rank reads the file at that path: on several nodes it may be another file (or none).
  if (distributed_) {
    check_same_files("train/resume-file", {fmt::format("--resume: {}", file_fingerprint(path))},
                     {fmt::format("the checkpoint '{}'", path)});
  }
  nn::TrainingState state;
  try {
    state = nn::load_checkpoint(path, *model_, *optimizer_);
  } catch (const Error& e) {
    // The loader names the file and what differs in the library's terms; the flags that set
    // the optimizer's kind and state are this program's.
    fail("--resume: {} (the optimizer's settings come from --optimizer and --momentum)",
         e.what());
  }
  if (count_nonfinite(params_->values()) > 0) {
    fail("--resume: checkpoint '{}' holds NaN/Inf parameters; resume from an earlier one", path);
  }
  run_id_ = state.run_id;  // this run continues that one: its checkpoints are ours to prune
  // The shapes are checked by the loader; the activation is not visible in them.
  if (const auto model = state.info.find("model"); model != state.info.end()) {
    const std::string difference = model_difference(model->second, model_->describe());
    if (!difference.empty()) {
      fail("checkpoint '{}' was saved from another model: {}. Resume with the same model", path,
           difference);
    }
  }
  const std::int64_t global_batch = world_size_ * o_.batch * o_.grad_accum;
  if (state.epoch_samples % global_batch != 0) {
    fail(
        "checkpoint '{}' stopped after {} samples of epoch {}, which is not a whole number of "
        "this run's global batches ({} ranks x --batch {} x --grad-accum {} = {}). Resume with "
        "the same global batch.",
        path, state.epoch_samples, state.epoch, world_size_, o_.batch, o_.grad_accum, global_batch);
  }
  if (state.seed != o_.seed) {
    fail("checkpoint '{}' was trained with --seed {}, this run has --seed {}", path, state.seed,
         o_.seed);
  }
  // Other data would pass the position check below (it only counts samples): compare what the
  // data was. (Checkpoints written before this key existed have none to compare.)
  const auto data = state.info.find("data");
  if (data != state.info.end() && data->second != data_description()) {
    fail("checkpoint '{}' was trained on other data: {}; this run: {}. Resume with the same data",
         path, data->second, data_description());
  }
  start_step_ = state.epoch * steps_per_epoch_ + state.epoch_samples / global_batch;
  if (state.step != start_step_) {
    fail(
        "checkpoint '{}' is at step {} but its data position (epoch {}, {} samples) is step {} "
        "with this run's global batch and data set; resume with the same data and global batch",
        path, state.step, state.epoch, state.epoch_samples, start_step_);
  }
  // --skip-nonfinite's count goes on across the restart.
  if (const auto skipped = state.info.find("skipped_steps"); skipped != state.info.end()) {
    const std::string& text = skipped->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), skipped_steps_);
    if (ec != std::errc() || end != text.data() + text.size() || skipped_steps_ < 0) {
      fail("checkpoint '{}': info 'skipped_steps' = '{}' is not a count", path, text);
    }
  }
  if (start_step_ > steps_) {
    fail(
        "checkpoint '{}' is at step {}, past this run's last step {}: raise --steps (or "
        "--epochs), or resume from an earlier checkpoint",
        path, start_step_, steps_);
  }
  if (is_main()) {
    fmt::print("resume: loaded {} (step {}){}\n", path, start_step_,
               start_step_ == steps_ ? "; it is the last step: nothing left to train" : "");
  }
}

void Trainer::resize_batch(std::int64_t rows) {
  const std::int64_t in = dataset_->in_features(), out = dataset_->out_features();
  if (device_.is_cpu()) {
    if (!x_.defined() || x_.size(0) != rows) {
      x_ = Tensor::empty({rows, in}, device_);
      y_ = Tensor::empty({rows, out}, device_);
    }
  } else {
    next_device_batch(rows);
    next_staging_slot();  // the caller writes the staging buffers next
    Staging& slot = staging_[slot_];
    const auto x_bytes = static_cast<std::size_t>(rows * in) * sizeof(float);
    const auto y_bytes = static_cast<std::size_t>(rows * out) * sizeof(float);
    if (slot.x.size() < x_bytes) slot.x = PinnedBuffer(x_bytes);
    if (slot.y.size() < y_bytes) slot.y = PinnedBuffer(y_bytes);
  }
}

// Called before a micro-batch's upload, when everything that reads the previous micro-batch
// has been enqueued on the compute stream: that buffer is free once the compute stream gets
// past this point (its `free` event), and this micro-batch takes the other buffer, last read by
// the micro-batch before, which the upload stream waits for.
void Trainer::next_device_batch(std::int64_t rows) {
  const Stream compute = Stream::compute(device_);
  if (upload_stream_.native() == nullptr) upload_stream_ = Stream::create(device_);
  DeviceBatch& previous = device_batches_[device_slot_];
  if (previous.used) {
    if (previous.free.device() != device_) previous.free = Event(device_);
    previous.free.record(compute);
  }
  device_slot_ = 1 - device_slot_;
  DeviceBatch& batch = device_batches_[device_slot_];
  if (!batch.x.defined() || batch.x.size(0) != rows) {
    batch.x = Tensor::empty({rows, dataset_->in_features()}, device_);
    batch.y = Tensor::empty({rows, dataset_->out_features()}, device_);
    // New memory from the caching allocator may be a block that work already enqueued on the
    // compute stream still uses (blocks are handed out in compute-stream order): the upload
    // stream waits for all of it.
    if (batch.free.device() != device_) batch.free = Event(device_);
    batch.free.record(compute);
    batch.used = true;
  }
  if (batch.used) batch.free.block(upload_stream_);
  batch.used = true;
  x_ = batch.x;
  y_ = batch.y;
}

// The GPU copies a staging slot after the host has moved on (upload_batch): the slot is written
// again only once it has. The slot taken was uploaded kStagingSlots micro-batches ago, so this
// is usually an event query; the host waits (a counted synchronization) only when it has run
// that far ahead of the GPU, which is then busy, not idle.
void Trainer::next_staging_slot() {
  slot_ = (slot_ + 1) % kStagingSlots;
  Staging& slot = staging_[slot_];
  if (slot.busy && !slot.copied.query()) slot.copied.synchronize();
  slot.busy = false;
}

std::span<const std::int64_t> Trainer::lookahead_indices(std::int64_t g) {
  const std::int64_t step0 = g / o_.grad_accum;  // 0-based optimizer step
  const std::int64_t epoch = step0 / steps_per_epoch_;
  if (epoch != lookahead_epoch_) {
    lookahead_sampler_->set_epoch(epoch);
    lookahead_epoch_ = epoch;
  }
  return lookahead_sampler_->batch(first_micro_batch(step0 + 1) + g % o_.grad_accum, o_.batch);
}

std::string Trainer::data_description() const {
  const std::string order = o_.shuffle ? "shuffled" : "in order (--no-shuffle)";
  if (!o_.data_path.empty()) {
    return fmt::format(".npy data, {} samples x {} -> {}, {}, {}", dataset_->size(),
                       dataset_->in_features(), dataset_->out_features(), npy_checksums_, order);
  }
  return fmt::format("synthetic data, {} samples x {} -> {}, --noise {} --teacher-hidden {}, {}",
                     dataset_->size(), dataset_->in_features(), dataset_->out_features(),
                     o_.noise_std, o_.teacher_hidden, order);
}

std::int64_t Trainer::first_micro_batch(std::int64_t step) const {
  return ((step - 1) % steps_per_epoch_) * o_.grad_accum;
}

std::int64_t Trainer::micro_batches_in_step(std::int64_t step) const {
  return std::min<std::int64_t>(o_.grad_accum, micro_batches_per_epoch_ - first_micro_batch(step));
}

void Trainer::load_batch(std::int64_t step, std::int64_t m) {
  if (!prefetcher_) {
    fill_batch(first_micro_batch(step) + m);
    return;
  }
  const std::int64_t g = (step - 1) * o_.grad_accum + m;
  std::int64_t rows = 0;
  if (prefetched_ != g) {  // the first batch of the run: nothing was prefetched yet
    rows = static_cast<std::int64_t>(lookahead_indices(g).size());
    prefetcher_->start(lookahead_indices(g));
  } else {
    rows = prefetched_rows_;
  }
  resize_batch(rows);
  if (device_.is_cpu()) {
    prefetcher_->take(x_.data(), y_.data());
  } else {
    prefetcher_->take(x_staging(), y_staging());
    upload_batch();
  }
  prefetched_ = -1;
  // The next micro-batch is filled while this one trains: the next of this step, or the first
  // of the next step (an epoch's last step may have fewer than --grad-accum).
  const std::int64_t next_g = m + 1 < micro_batches_in_step(step) ? g + 1 : step * o_.grad_accum;
  if (next_g < steps_ * o_.grad_accum) {
    const std::span<const std::int64_t> next = lookahead_indices(next_g);
    prefetched_rows_ = static_cast<std::int64_t>(next.size());
    prefetcher_->start(next);
    prefetched_ = next_g;
  }
}

void Trainer::fill_batch(std::int64_t micro_batch_in_epoch) {
  const std::span<const std::int64_t> indices = sampler_->batch(micro_batch_in_epoch, o_.batch);
  const auto rows = static_cast<std::int64_t>(indices.size());
  resize_batch(rows);
  if (device_.is_cpu()) {
    dataset_->fill_batch(indices, x_.data(), y_.data());
    return;
  }
  dataset_->fill_batch(indices, x_staging(), y_staging());
  upload_batch();
}

void Trainer::upload_batch() {
  // From pinned memory, on the upload stream: the host does not wait, and the copy overlaps
  // the compute stream's work on the micro-batch before; the forward pass waits for it there.
  Staging& slot = staging_[slot_];
  upload_async_on(upload_stream_, x_.raw_data(), slot.x.data(), x_.nbytes());
  upload_async_on(upload_stream_, y_.raw_data(), slot.y.data(), y_.nbytes());
  if (slot.copied.device() != device_) slot.copied = Event(device_);
  slot.copied.record(upload_stream_);
  slot.copied.block(Stream::compute(device_));
  slot.busy = true;
}

float Trainer::train_step(std::int64_t step, Window& window) {
  const auto step_start = Clock::now();
  const std::int64_t host_syncs_before = host_sync_count();
  double data_ms = 0;
  optimizer_->zero_grad();
  double backward_ms = 0;
  Tensor loss_sum;
  // Each micro-batch's mean loss weighs by its share of the step's rows, so --grad-accum K with
  // --batch B equals --batch K*B, a partial last micro-batch included. (Every rank has the same
  // rows per micro-batch, so the all-reduce's average over ranks stays right.)
  const std::int64_t micro_batches = micro_batches_in_step(step);
  const std::int64_t first_micro = first_micro_batch(step);
  std::int64_t step_rows = 0;
  for (std::int64_t m = 0; m < micro_batches; ++m) {
    step_rows += static_cast<std::int64_t>(sampler_->batch(first_micro + m, o_.batch).size());
  }
  for (std::int64_t m = 0; m < micro_batches; ++m) {
    {
      TraceSpan span("data", TraceTrack::kData);
      const auto data_start = Clock::now();
      load_batch(step, m);
      data_ms += ms_since(data_start);
    }
    // All micro-batches but the last only accumulate locally; the last one's backward reduces
    // the accumulated gradients.
    std::optional<comm::DistributedDataParallel::NoSync> no_sync;
    if (ddp_ && m + 1 < micro_batches) no_sync.emplace(ddp_->reducer());
    Tensor loss;
    const auto forward_start = Clock::now();
    {
      TraceSpan span("forward", TraceTrack::kCompute, device_);
      loss = mse_loss(model_->forward(x_), y_);
      if (micro_batches > 1) {
        const double share = static_cast<double>(x_.size(0)) / static_cast<double>(step_rows);
        loss = mul(loss, static_cast<float>(share));
      }
    }
    window.forward_ms += ms_since(forward_start);
    // With --optimizer-in-backward the last micro-batch's backward also takes the step.
    if (optimizer_in_backward_ && m + 1 == micro_batches) optimizer_in_backward_->arm();
    const auto backward_start = Clock::now();
    loss.backward();
    backward_ms += ms_since(backward_start);
    loss_sum = m == 0 ? loss.detach() : add(loss_sum, loss.detach());
  }
  const auto optimizer_start = Clock::now();
  // Parameters whose gradient came from earlier micro-batches only are updated here.
  if (optimizer_in_backward_) optimizer_in_backward_->finish();
  // NaN/Inf policy. Decided from every rank's loss and the averaged gradients (identical on
  // every rank after the all-reduce), so all ranks stop, or skip, at the same step: a rank that
  // stopped alone would leave the others waiting in the next step's collectives.
  const Tensor health = gather_health(loss_sum);
  float loss = NAN;  // known to the host only where it reads the health
  if (!reads_health_at(step)) {
    // Nothing is read back in this step, so the host does not wait for the GPU: the step's
    // health stays on the device until the next read, which checks every kept step in order.
    // (A NaN found there stops the run then, naming its step; checkpoints and the last step are
    // reads, so no poisoned parameters are ever saved.)
    keep_health(health, step);
    if (!optimizer_in_backward_) {
      TraceSpan span("optimizer step", TraceTrack::kCompute, device_);
      optimizer_->step();
    }
  } else {
    loss = apply_health(read_health(health, step), step);
  }
  const double wall_ms = ms_since(step_start);
  window.optimizer_ms += ms_since(optimizer_start);
  window.backward_ms += backward_ms;
  window.step_ms += wall_ms - data_ms;
  window.data_ms += data_ms;
  window.wall_ms += wall_ms;
  window.steps += 1;
  window.samples += world_size_ * step_rows;
  window.host_syncs += host_sync_count() - host_syncs_before;
  if (ddp_) {
    const comm::ReducerStats& stats = ddp_->reducer().last_stats();
    window.comm_ms += stats.comm_ms;
    window.exposed_comm_ms += stats.exposed_comm_ms;
    // On the CPU backward() waited for the all-reduces; on a GPU the compute stream stalled
    // for them while the host went on, so the host's backward time does not contain the wait.
    if (device_.is_cpu()) window.backward_ms -= stats.wait_ms;
  }
  return loss;
}

// The NaN/Inf policy for a read health (the first bad kept step's, else this step's): the
// optimizer step, or a skipped step, or the end of the run. Returns the loss averaged over the
// ranks.
float Trainer::apply_health(const StepHealth& health, std::int64_t step) {
  std::vector<int> bad_ranks;
  for (int r = 0; r < world_size_; ++r) {
    if (!std::isfinite(health.losses[static_cast<std::size_t>(r)])) bad_ranks.push_back(r);
  }
  double loss_sum_all = 0;
  for (const float l : health.losses) loss_sum_all += l;
  const auto loss = static_cast<float>(loss_sum_all / world_size_);
  if (bad_ranks.empty() && health.grads_finite) {
    if (!optimizer_in_backward_) {
      TraceSpan span("optimizer step", TraceTrack::kCompute, device_);
      optimizer_->step();
    }
  } else {
    // "nan", not "-nan": the sign of a NaN means nothing.
    const auto text = [](float v) {
      return std::isnan(v) ? std::string("nan") : fmt::format("{}", v);
    };
    const std::string what =
        !bad_ranks.empty()
            ? fmt::format("the loss became {} at step {} on rank{} {}",
                          text(health.losses[static_cast<std::size_t>(bad_ranks.front())]),
                          health.step, bad_ranks.size() > 1 ? "s" : "", fmt::join(bad_ranks, ", "))
            : fmt::format(
                  "the gradients became non-finite at step {} (averaged over the ranks; "
                  "the loss was finite on every rank): {}{}",
                  health.step, describe_nonfinite_grads(),
                  health.step == step ? "" : fmt::format(" (counted at step {})", step));
    if (optimizer_in_backward_) {
      fail(
          "{} (with --optimizer-in-backward this step's update is already applied). Lower --lr "
          "or check the data.",
          what);
    }
    if (!o_.skip_nonfinite) {
      fail("{}. Lower --lr, check the data, or pass --skip-nonfinite to skip such steps.", what);
    }
    ++skipped_steps_;
    if (is_main()) {
      fmt::print(stderr,
                 "nanoddp-train: warning: {}: skipped this optimizer step on every rank "
                 "({} skipped so far)\n",
                 what, skipped_steps_);
      std::fflush(stderr);
    }
  }
  return loss;
}


Tensor Trainer::gather_health(const Tensor& local_loss) {
  params_->zero_missing_grads();  // a parameter without a gradient this step counts as zero
  // [loss of rank 0, ..., loss of rank W-1, non-finite gradient values on rank 0, ...], built
  // on the device: each rank writes its own entries (the loss copied, the count written by the
  // kernel), and the sum hands everyone all of them (x + 0 keeps NaN and Inf). No host read
  // here: read_health reads it, with the kept rows of earlier steps, in one copy.
  const auto w = static_cast<std::size_t>(distributed_ ? world_size_ : 1);
  const auto me = static_cast<std::size_t>(distributed_ ? rank_ : 0);
  Tensor values = Tensor::zeros({static_cast<std::int64_t>(2 * w)}, device_);
  Backend& backend = backend_for(device_);
  backend.copy(values.data() + me, local_loss.data(), sizeof(float));
  if (optimizer_in_backward_) {
    // The gradients were counted as they were applied (a host read of its own).
    backend.fill(values.data() + w + me, 1,
                 static_cast<float>(optimizer_in_backward_->nonfinite_gradients()));
  } else {
    const Tensor grads = params_->grads();
    backend.count_nonfinite(grads.data(), grads.numel(), values.data() + w + me);
  }
  if (distributed_) dist_->group->allreduce(values, comm::ReduceOp::kSum)->wait();
  return values;
}

bool Trainer::is_log_step(std::int64_t step) const {
  return step % o_.log_every == 0 || step == steps_ || step == start_step_ + 1;
}

// The host reads the health where it needs it: a logged step (its loss is printed), a
// checkpoint (nothing poisoned is saved), every step under --skip-nonfinite (the step is skipped
// or taken on the spot) and --optimizer-in-backward (its NaN/Inf count is a host read anyway),
// and when kKeptHealthRows steps are waiting.
bool Trainer::reads_health_at(std::int64_t step) const {
  return o_.skip_nonfinite || optimizer_in_backward_ != nullptr || is_log_step(step) ||
         (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) ||
         static_cast<std::int64_t>(unread_steps_.size()) + 1 >= kKeptHealthRows;
}

void Trainer::keep_health(const Tensor& values, std::int64_t step) {
  const std::int64_t width = values.numel();
  if (!health_rows_.defined()) health_rows_ = Tensor::empty({kKeptHealthRows * width}, device_);
  health_rows_.view(static_cast<std::int64_t>(unread_steps_.size()) * width, {width})
      .copy_from(values);
  unread_steps_.push_back(step);
}

Trainer::StepHealth Trainer::read_health(const Tensor& values, std::int64_t step) {
  const std::int64_t width = values.numel();
  const auto kept = static_cast<std::int64_t>(unread_steps_.size());
  std::vector<float> host;  // the kept rows, then this step's: the one host synchronization
  if (kept == 0) {
    host = values.to_vector();
  } else {
    health_rows_.view(kept * width, {width}).copy_from(values);
    host = health_rows_.view(0, {(kept + 1) * width}).to_vector();
  }
  std::vector<std::int64_t> steps = std::move(unread_steps_);
  unread_steps_.clear();
  steps.push_back(step);
  const auto w = static_cast<std::size_t>(width / 2);
  StepHealth health;
  for (std::size_t row = 0; row < steps.size(); ++row) {
    const auto first = host.begin() + static_cast<std::ptrdiff_t>(row * 2 * w);
    health.step = steps[row];
    health.losses.assign(first, first + static_cast<std::ptrdiff_t>(w));
    health.grads_finite = true;
    for (std::size_t r = 0; r < w; ++r) health.grads_finite &= first[w + r] == 0.0f;
    bool finite = health.grads_finite;
    for (const float l : health.losses) finite &= std::isfinite(l);
    if (!finite) break;  // the first bad step is the one to report
  }
  return health;
}

// Which parameters hold the NaN/Inf values, for the error message (a rare path: one count per
// parameter). After the all-reduce the gradients are the same on every rank.
std::string Trainer::describe_nonfinite_grads() const {
  std::vector<std::string> parts;
  for (const nn::ParameterSlot& slot : params_->slots()) {
    if (!slot.param.has_grad()) continue;
    const std::int64_t bad = count_nonfinite(slot.param.grad());
    if (bad > 0) parts.push_back(fmt::format("{} has {} of {}", slot.name, bad, slot.numel));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

void Trainer::log(std::int64_t step, std::int64_t epoch, float loss, Window& w) {
  if (!is_main()) return;
  const double samples_per_s = 1000.0 * w.samples / std::max(w.wall_ms, 1e-9);
  const double n = static_cast<double>(w.steps);
  const double eta_s = static_cast<double>(steps_ - step) * (w.wall_ms / n) / 1000.0;
  if (!o_.quiet) {
    std::string comm;
    if (ddp_)
      comm = fmt::format("  comm {:.3f} ms (exposed {:.3f})", w.comm_ms / n, w.exposed_comm_ms / n);
    fmt::print(
        "step {:>{}}/{}  epoch {}  loss {:.6e}  {:.0f} samples/s  step {:.3f} ms  data "
        "{:.3f} ms{}  eta {}\n",
        step, std::to_string(steps_).size(), steps_, epoch, loss, samples_per_s, w.step_ms / n,
        w.data_ms / n, comm, format_duration(eta_s));
    std::fflush(stdout);
  }
  if (metrics_.is_open()) {
    nlohmann::json line = {{"step", step},
                           {"epoch", epoch},
                           {"loss", loss},
                           {"step_ms", w.step_ms / n},
                           {"data_ms", w.data_ms / n},
                           {"samples_per_s", samples_per_s},
                           {"world_size", world_size_},
                           {"steps_in_window", w.steps}};
    line["forward_ms"] = w.forward_ms / n;
    line["backward_ms"] = w.backward_ms / n;
    line["optimizer_ms"] = w.optimizer_ms / n;
    line["host_syncs_per_step"] = static_cast<double>(w.host_syncs) / n;
    if (ddp_) {
      line["comm_ms"] = w.comm_ms / n;
      line["exposed_comm_ms"] = w.exposed_comm_ms / n;
      // Share of the all-reduce time hidden behind the backward pass.
      line["overlap_fraction"] =
          w.comm_ms > 0 ? std::clamp(1.0 - w.exposed_comm_ms / w.comm_ms, 0.0, 1.0) : 0.0;
    }
    if (o_.skip_nonfinite) line["skipped_steps"] = skipped_steps_;
    write_metrics_line(line.dump());
  }
}

void Trainer::write_metrics_line(const std::string& line) {
  metrics_ << line << "\n";
  metrics_.flush();
  if (metrics_) return;
  // A full disk (or a vanished file system) used to truncate the file silently. Training goes
  // on, as its checkpoints and output do not depend on the metrics; said once, on stderr.
  fmt::print(stderr,
             "nanoddp-train: warning: writing --metrics file '{}' failed ({}); its last lines are "
             "missing and no more are written\n",
             o_.metrics_path, errno != 0 ? std::strerror(errno) : "unknown error");
  std::fflush(stderr);
  metrics_.close();
}

void Trainer::save_checkpoint(std::int64_t step, std::int64_t epoch, std::int64_t step_in_epoch) {
  require_finite_parameters(step, "checkpoint");  // on every rank: they hold the same values
  if (!is_main()) return;
  nn::TrainingState state{.step = step,
                          .epoch = epoch,
                          .epoch_samples = step_in_epoch * world_size_ * o_.batch * o_.grad_accum,
                          .seed = o_.seed,
                          .run_id = run_id_,
                          .info = {{"model", model_->describe()},
                                   {"data", data_description()},
                                   {"world_size", std::to_string(world_size_)},
                                   {"batch", std::to_string(o_.batch)},
                                   {"grad_accum", std::to_string(o_.grad_accum)},
                                   {"skipped_steps", std::to_string(skipped_steps_)}}};
  // The position of the NEXT step: a checkpoint after the last step of an epoch points at the
  // start of the following one.
  if (step_in_epoch == steps_per_epoch_) {
    state.epoch += 1;
    state.epoch_samples = 0;
  }
  nn::save_checkpoint(o_.checkpoint_dir, *model_, *optimizer_, state, o_.keep);
}

// The loss and the gradients can be finite while the update itself overflows (a huge --lr):
// parameters are checked before they are written, so no checkpoint or --save holds NaN or Inf.
// Every rank checks (DDP keeps them equal), so all stop together.
void Trainer::require_finite_parameters(std::int64_t step, const char* what) {
  const std::int64_t bad = count_nonfinite(params_->values());
  if (bad > 0) {
    fail("after step {} the parameters hold {} NaN/Inf value(s) although the loss and gradients "
         "were finite: the update overflowed (lower --lr?). Not written ({}); the last good "
         "checkpoint, if any, is kept",
         step, bad, what);
  }
}

void Trainer::write_trace() {
  if (!tracer_) return;
  if (!distributed_) {
    Tracer::write_file(o_.trace_path, {tracer_->events_json()});
  } else {
    // Every rank hands its events to rank 0 through the store, in pieces far below the store's
    // value limit (a long trace exceeded it: the job failed after training); rank 0 takes each
    // piece and removes it, then writes one file.
    constexpr std::size_t kPiece = 4u << 20;
    const std::string events = tracer_->events_json();
    const std::size_t pieces = (events.size() + kPiece - 1) / kPiece;
    for (std::size_t k = 0; k < pieces; ++k) {
      dist_->store->set(fmt::format("train/trace/{}/{}", rank_, k),
                        events.substr(k * kPiece, kPiece));
    }
    dist_->store->set(fmt::format("train/trace/{}/pieces", rank_), std::to_string(pieces));
    if (is_main()) {
      std::vector<std::string> all;
      for (int r = 0; r < world_size_; ++r) {
        const std::string count = dist_->store->get_string(fmt::format("train/trace/{}/pieces", r));
        std::string text;
        for (std::size_t k = 0; k < std::stoull(count); ++k) {
          const std::string key = fmt::format("train/trace/{}/{}", r, k);
          text += dist_->store->get_string(key);
          dist_->store->remove(key);
        }
        all.push_back(std::move(text));
      }
      Tracer::write_file(o_.trace_path, all);
    }
  }
  if (is_main() && !o_.quiet) fmt::print("trace written to {}\n", o_.trace_path);
}

int Trainer::run() {
  if (is_main() && !o_.quiet) {
    fmt::print("nanoddp-train {} | device {} | {} | {} parameters | {}\n", NANODDP_VERSION,
               device_.str(), model_->describe(), params_->numel(), optimizer_->describe());
    fmt::print("data: {} samples x {} -> {} | {} rank(s) x batch {}{} | {} steps ({} per epoch)\n",
               dataset_->size(), dataset_->in_features(), dataset_->out_features(), world_size_,
               o_.batch, o_.grad_accum > 1 ? fmt::format(" x {} micro-batches", o_.grad_accum) : "",
               steps_, steps_per_epoch_);
    if (ddp_) {
      fmt::print(
          "ddp: backend {} | {} buckets (first {} MiB, then {} MiB) | overlap {} | hook {}\n",
          dist_->group->backend_name(), ddp_->reducer().buckets().size(), o_.first_bucket_mb,
          o_.bucket_cap_mb, o_.overlap ? "on" : "off", o_.comm_hook);
    }
  }
  const auto run_start = Clock::now();
  Window window;
  std::optional<float> first_loss;  // not NaN as "unset": a logged loss can be NaN
  float last_loss = NAN;
  for (std::int64_t step = start_step_ + 1; step <= steps_; ++step) {
    const std::int64_t epoch = (step - 1) / steps_per_epoch_;
    const std::int64_t step_in_epoch = (step - 1) % steps_per_epoch_;
    if (epoch != sampler_epoch_) {
      sampler_->set_epoch(epoch);
      sampler_epoch_ = epoch;
    }
    const bool tracing = tracer_ && step - start_step_ <= o_.trace_steps;
    std::optional<TraceScope> trace_scope;
    if (tracing) trace_scope.emplace(tracer_.get());

    const float world_loss = train_step(step, window);
    if (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) {
      save_checkpoint(step, epoch, step_in_epoch + 1);
    }
    const bool log_now = is_log_step(step);
    if (!log_now) continue;
    last_loss = world_loss;
    if (!first_loss) first_loss = last_loss;
    log(step, epoch, last_loss, window);
    window = Window{};
  }

  if (!o_.save_path.empty()) require_finite_parameters(steps_, "--save");
  if (!o_.save_path.empty() && is_main()) {
    std::vector<nn::NamedTensor> named = model_->named_parameters();
    std::vector<std::vector<float>> host;
    std::vector<nn::SafetensorsEntry> entries;
    host.reserve(named.size());
    for (const nn::NamedTensor& p : named) {
      host.push_back(p.tensor.to_vector());
      entries.push_back(
          {.name = p.name, .dtype = "F32", .shape = p.tensor.shape(), .data = host.back().data()});
    }
    nn::write_safetensors(o_.save_path, entries,
                          {{"format", "nanoddp-parameters"},
                           {"nanoddp_version", NANODDP_VERSION},
                           {"step", std::to_string(steps_)},
                           {"seed", std::to_string(o_.seed)},
                           {"world_size", std::to_string(world_size_)},
                           {"activation", o_.activation},
                           {"model", model_->describe()}});
  }
  write_trace();
  if (is_main()) {
    // "nan", not "-nan": the sign of a NaN means nothing.
    const auto text = [](std::optional<float> v) {
      if (!v) return std::string("-");
      return std::isnan(*v) ? std::string("nan") : fmt::format("{:.6e}", *v);
    };
    fmt::print(
        "done: {} steps in {:.2f} s, loss {} -> {}{}{}\n", steps_ - start_step_,
        ms_since(run_start) / 1000.0, text(first_loss),
        text(first_loss ? std::optional(last_loss) : std::nullopt),
        o_.skip_nonfinite ? fmt::format(", {} step(s) skipped for NaN/Inf", skipped_steps_) : "",
        o_.save_path.empty() ? "" : fmt::format(", parameters saved to {}", o_.save_path));
  }
  return 0;
}

}  // namespace nanoddp::train
