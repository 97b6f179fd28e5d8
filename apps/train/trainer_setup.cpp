// Building a Trainer from its options: device, process group, data, model, optimizer, DDP.
#include "trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "classification.h"
#include "nanoddp/comm/consistency.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/config.h"
#include "nanoddp/engine/allocator.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"
#include "trainer_internal.h"

namespace nanoddp::train {

namespace {

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

Trainer::Trainer(const TrainOptions& options) : o_(options) {
  try {
    set_up();
  } catch (const std::exception& e) {
    // A peer that died or did not answer (not bad input): rank 0 keeps the store up only
    // briefly for a check-out such a peer never makes (comm/init.h).
    if (dist_ && comm::is_communication_failure(e)) dist_->abandon_setup();
    // Inside init_distributed() the check-in tells the other ranks itself.
    if (!joining_ && !comm::is_communication_failure(e)) throw FailedBeforeJoining(e.what());
    throw;
  }
}

void Trainer::set_up() {
  world_ = comm::world_from_env();
  check_allocator_environment();
  distributed_ = world_.launcher != "none";
  if (o_.global_batch) {
    // Elastic rounds: the same global batch at every world size that divides it.
    const std::int64_t ways = std::int64_t{world_.world_size} * o_.grad_accum;
    if (*o_.global_batch % ways != 0) {
      fail(
          "--global-batch {} is not divisible by {} ranks x --grad-accum {}: pick a global batch "
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

  // A resume that will find a checkpoint starts from it, not from --init: the file is not read
  // (under --max-restarts an --init removed since the first attempt, a cleaned /tmp, used to
  // fail every restart with exit 2, which launchers do not restart).
  init_superseded_ =
      o_.resume && !o_.init_path.empty() && !nn::list_checkpoints(o_.checkpoint_dir).empty();
  if (init_superseded_ && world_.rank == 0 && !o_.quiet) {
    fmt::print("init: --init '{}' not read: --resume continues from a checkpoint in {}\n",
               o_.init_path, o_.checkpoint_dir);
  }
  // Rank 0 writes every output: find out now, not after hours of training, that it cannot.
  // (Before the process group: a launcher then stops the other ranks at once.)
  if (world_.rank == 0) check_output_paths();
  // Which run writes the checkpoints (a resumed run takes over the id it resumed): housekeeping
  // removes only this run's.
  run_id_ = fmt::format("{}-{}-{}", nn::this_host(), ::getpid(),
                        std::chrono::system_clock::now().time_since_epoch().count());

  // A single process reads NANODDP_TIMEOUT_S only for its final outputs' lock wait: a bad
  // value stops it now, not after the training (an adversary's run trained, then failed).
  if (!distributed_) comm::default_timeout();
  if (distributed_) {
    // The options first: their NANODDP_TIMEOUT_S is read here, and a bad value is this rank's
    // failure before it joins.
    const comm::DistributedOptions options{.backend = o_.backend, .device = device_};
    joining_ = true;
    dist_.emplace(comm::init_distributed(world_, options));
    rank_ = dist_->group->rank();
    world_size_ = dist_->group->size();
    check_same_settings();
  }

  // Each rank reads its own inputs. One that cannot says so to the others, which would wait in
  // the comparison below until their timeout (its files may differ: another node, a wrapper),
  // and every rank stops naming it.
  // (Under a launcher that stops the other ranks, this rank fails at once instead: the
  // launcher then names it as the one that failed first.)
  std::string input_problem;
  try {
    read_inputs();
  } catch (const std::exception& e) {
    if (!distributed_ || comm::is_communication_failure(e) || comm::launcher_stops_other_ranks()) {
      throw;
    }
    input_problem = e.what();
  }
  if (distributed_) {
    agree_inputs_read(input_problem);
    check_same_inputs();
  }
  model_ = std::make_unique<nn::Mlp>(
      nn::MlpOptions{.in_features = dataset_->in_features(),
                     .out_features = classify() ? o_.classes : dataset_->out_features(),
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
    fail(
        "{} {} samples: the sampling order alone needs {:.1f} GB, more than half of this "
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
  if (!o_.init_path.empty() && !init_superseded_) {
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
        comm::DdpOptions{.reducer = {.bucket_cap_mb = o_.bucket_cap_mb,
                                     .first_bucket_mb = o_.first_bucket_mb,
                                     .find_unused_parameters = o_.find_unused_parameters,
                                     .comm_hook = comm::parse_comm_hook(o_.comm_hook),
                                     .overlap = o_.overlap},
                         .zero_stage = o_.zero,
                         .zero_overlap_gather = o_.zero_overlap_gather},
        optimizer_.get());
    if (o_.zero_overlap_gather && is_main()) note_gather_overlap();
    if (o_.zero == 1 && o_.optimizer == "sgd" && o_.momentum == 0.0f && is_main()) {
      // Plain SGD keeps no state: stage 1 has nothing to shard and still pays the all-gather.
      fmt::print(stderr,
                 "nanoddp-train: note: --zero 1 with --optimizer sgd and no --momentum shards "
                 "nothing (plain SGD keeps no state) and adds a parameter all-gather per step\n");
    }
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
  if (!o_.trace_path.empty()) {
    tracer_ = std::make_unique<Tracer>(rank_);
    remove_stale_partial_traces(o_.trace_path);
  }
  if (!o_.metrics_path.empty() && is_main()) open_metrics();
}

// A bucket is gathered whole before the first layer that reads it, so the forward waits at its
// start for the bucket of the first layer: the one holding the model's first parameter, which is
// the last slot (the flat layout is in reverse registration order). When that bucket holds most
// of the parameters
// there is little to overlap: an outside tester's run with one bucket got no word of it, and
// the default caps put 3 of 4 × Linear(1024) in that bucket.
void Trainer::note_gather_overlap() const {
  const std::vector<comm::Bucket>& buckets = ddp_->reducer().buckets();
  const std::size_t first_parameter = params_->slots().size() - 1;
  std::int64_t total = 0, first = 0;
  for (const comm::Bucket& b : buckets) {
    total += b.numel;
    if (std::find(b.slots.begin(), b.slots.end(), first_parameter) != b.slots.end()) {
      first = b.numel;
    }
  }
  const double share = total > 0 ? static_cast<double>(first) / static_cast<double>(total) : 1.0;
  if (share < 0.75) return;
  const std::string what =
      buckets.size() == 1
          ? std::string(
                "with 1 bucket has nothing to overlap (the forward waits for the whole "
                "all-gather at its start)")
          : fmt::format(
                "can overlap at most {:.0f}% of the all-gather: the first layer's bucket "
                "holds {:.0f}% of the parameters, waited for at the forward's start",
                100.0 * (1.0 - share), 100.0 * share);
  fmt::print(stderr,
             "nanoddp-train: note: --zero-overlap-gather {}: lower --bucket-cap-mb and "
             "--first-bucket-mb to about one layer's size\n",
             what);
}

// Every rank must train with the same settings: a rank with another batch size or bucket cap
// would issue different collectives (a hang, not an error, without this check), and one with
// other data settings would train on other samples (no error at all).
void Trainer::check_same_settings() {
  const std::vector<std::string> settings = {
      fmt::format("--task {}", task_description()),  // "classify --classes K" or "regression"
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
      fmt::format("--zero {}", o_.zero),
      fmt::format("--checkpoint-every {} --resume {}", o_.checkpoint_every, o_.resume),
      fmt::format("--trace-steps {} (trace {})", o_.trace_steps, !o_.trace_path.empty()),
  };
  comm::check_same_on_all_ranks(*dist_->store, rank_, world_size_, "train/settings",
                                "command-line setting", settings);
  // What rank 0 alone writes: another value on another rank is no error (a node-local path per
  // host is common), but it is not used either, which is said rather than left to be found (an
  // outside operator's wrapper gave --metrics to rank 1 alone, and no file came).
  const std::vector<std::pair<const char*, std::string>> outputs = {
      {"--save", o_.save_path},
      {"--metrics", o_.metrics_path},
      {"--keep", o_.checkpoint_every > 0 ? std::to_string(o_.keep) : ""}};
  std::string mine;
  for (const auto& [flag, value] : outputs) mine += value + '\n';
  const std::vector<std::string> all =
      comm::exchange_on_all_ranks(*dist_->store, rank_, world_size_, "train/outputs", mine);
  if (!is_main()) return;
  const auto given = [](const std::string& value) {
    return value.empty() ? std::string("none") : fmt::format("'{}'", value);
  };
  for (int r = 1; r < world_size_; ++r) {
    std::vector<std::string> theirs;
    std::string line;
    for (std::istringstream in(all[static_cast<std::size_t>(r)]); std::getline(in, line);) {
      theirs.push_back(line);
    }
    for (std::size_t k = 0; k < outputs.size() && k < theirs.size(); ++k) {
      if (theirs[k] == outputs[k].second) continue;
      fmt::print(stderr,
                 "nanoddp-train: note: rank {} gives {} {}, rank 0 {}: only rank 0 writes {}, so "
                 "rank {}'s is not used\n",
                 r, outputs[k].first, given(theirs[k]), given(outputs[k].second),
                 outputs[k].first, r);
    }
  }
  std::fflush(stderr);
}

// The --init header and the data set, read by every rank from its own files.
void Trainer::read_inputs() {
  // --init's header (its tensors' shapes, and that the file holds all their bytes) before the
  // data, which may take seconds to read: a truncated file is refused at once.
  if (!o_.init_path.empty() && !init_superseded_) {
    try {
      nn::read_safetensors_shapes(o_.init_path);
    } catch (const Error& e) {
      fail("--init: {}", e.what());
    }
  }
  if (!o_.data_path.empty()) {
    load_npy_dataset();
  } else {
    const nn::SyntheticRegressionOptions teacher{.in_features = o_.in_features,
                                                 .out_features = o_.out_features,
                                                 .size = o_.dataset_size,
                                                 .seed = o_.seed,
                                                 .noise_std = o_.noise_std,
                                                 .teacher_hidden = o_.teacher_hidden};
    if (classify()) {
      dataset_ = std::make_unique<SyntheticClassification>(teacher);
    } else {
      dataset_ = std::make_unique<nn::SyntheticRegression>(teacher);
    }
  }
}

void Trainer::agree_inputs_read(const std::string& problem) {
  const std::vector<std::string> problems =
      comm::exchange_on_all_ranks(*dist_->store, rank_, world_size_, "train/inputs-read", problem);
  if (!problem.empty()) fail("{}", problem);  // as a rank alone would say it
  for (int r = 0; r < world_size_; ++r) {
    const std::string& theirs = problems[static_cast<std::size_t>(r)];
    if (!theirs.empty()) {
      throw comm::PeerFailedError(
          r, fmt::format("rank {} could not read its inputs, so every rank stops: {}", r, theirs));
    }
  }
}

}  // namespace nanoddp::train
