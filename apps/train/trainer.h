#pragma once
// The training loop of nanoddp-train, on one process or as one rank of a DDP job.

#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "common/output_files.h"
#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/trace.h"
#include "nanoddp/nn/dataset.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/optimizer_in_backward.h"
#include "nanoddp/nn/prefetcher.h"
#include "nanoddp/nn/sampler.h"
#include "options.h"

namespace nanoddp::train {

// A set-up failure before this rank entered init_distributed() (a bad RANK, an output path rank
// 0 cannot write, a bad value): main() prints it, then tells the other ranks
// (comm::tell_peers_setup_failed), which would otherwise wait their whole timeout for this one.
class FailedBeforeJoining : public Error {
 public:
  using Error::Error;
};

class Trainer {
 public:
  // Builds everything from the options: device, process group, data, model, optimizer,
  // checkpoint state, DDP. Errors here are the user's input (exit code 2), except communication
  // failures (comm::is_communication_failure: a peer died or did not answer; exit code 1).
  explicit Trainer(const TrainOptions& options);
  // Runs the steps; returns the process exit code. Errors here are runtime failures.
  int run();

 private:
  void set_up();  // the constructor's work
  int run_steps();
  // Statistics between two log lines.
  struct Window {
    double step_ms = 0, data_ms = 0, wall_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
    double backward_ms = 0;  // backward compute: the backward() calls minus exposed comm
    double forward_ms = 0;   // the forward pass and the loss
    // The optimizer step after backward, and the gradient NaN/Inf check before it (with
    // --optimizer-in-backward only the check: the updates are inside backward_ms), with, under
    // DDP, the one small all-reduce that exchanges the ranks' losses.
    double optimizer_ms = 0;
    std::int64_t steps = 0, samples = 0;
    std::int64_t host_syncs = 0;  // times the host waited for the device (engine/host_sync.h)
  };

  bool is_main() const { return rank_ == 0; }
  bool classify() const { return o_.task == "classify"; }
  // The step's loss on this micro-batch: MSE, or --task classify's cross-entropy (the mean over
  // the micro-batch, as mse_loss's).
  Tensor loss_of(const Tensor& output) const;
  // --task classify: how many rows of `logits` have their arg-max at the target (a one-element
  // float tensor on the device: no host read).
  Tensor count_correct(const Tensor& logits) const;
  // Where the dataset writes the targets of a `rows`-row batch, and, after it has, their
  // conversion (--task classify: the float class indices become int64, in the staging buffer or
  // y_ itself).
  float* target_rows(std::int64_t rows);
  void finish_targets(std::int64_t rows);
  // Puts micro-batch m of (1-based) `step` into x_ and y_: filled here, or, with --prefetch,
  // taken from the background worker (which then starts on the micro-batch after it).
  void load_batch(std::int64_t step, std::int64_t m);
  void fill_batch(std::int64_t micro_batch_in_epoch);
  // What the data is, for checkpoints: --resume refuses other data.
  std::string data_description() const;
  // The index within its epoch of (1-based) `step`'s first micro-batch.
  std::int64_t first_micro_batch(std::int64_t step) const;
  // --grad-accum or fewer: the micro-batches of (1-based) `step` (fewer at an epoch's end).
  std::int64_t micro_batches_in_step(std::int64_t step) const;
  // The sample indices of global micro-batch g = (step - 1) * grad_accum + m, from a sampler of
  // its own (the batch after the last of an epoch belongs to the next epoch).
  std::span<const std::int64_t> lookahead_indices(std::int64_t g);
  void resize_batch(std::int64_t rows);
  void upload_batch();         // CUDA: the host staging buffers into x_ and y_, asynchronously
  void next_staging_buffer();  // CUDA: a free staging buffer for the next micro-batch
  // The optimizer's update: optimizer.step(), or under --zero the step on this rank's shard and
  // the all-gather of the parameters.
  void optimizer_step();
  // The bytes of parameters, gradients and optimizer state this rank holds (--metrics).
  comm::ZeroMemory memory() const;
  // Every rank's memory(), exchanged at the first logged step and at the last (every rank takes
  // part: those steps are logged on every rank); --metrics reports the latest exchange.
  void gather_memory_per_rank();
  // One optimizer step; returns the loss averaged over the ranks.
  float train_step(std::int64_t step, Window& window);
  // Every rank's loss of a step (index = rank), and whether the averaged gradients were finite:
  // one small all-reduce per step (on the device), so that every rank takes the same decision
  // at the same step. The host reads it only where it must (reads_health_at): a step that is
  // not logged makes no host synchronization.
  struct StepHealth {
    std::int64_t step = 0;
    std::vector<float> losses;
    bool grads_finite = true;
  };
  // local_correct: --task classify's correct predictions of this rank's step (else undefined),
  // a third block of W entries in the same all-reduce.
  Tensor gather_health(const Tensor& local_loss, const Tensor& local_correct);
  bool is_log_step(std::int64_t step) const;
  bool reads_health_at(std::int64_t step) const;
  void keep_health(const Tensor& values, std::int64_t step);
  // The first kept step whose health is bad, else this step's.
  StepHealth read_health(const Tensor& values, std::int64_t step);
  float apply_health(const StepHealth& health, std::int64_t step);
  std::string describe_nonfinite_grads() const;
  void log(std::int64_t step, std::int64_t epoch, float loss, std::optional<double> accuracy,
           Window& window);
  // --task classify: the correct predictions summed over the ranks, of the steps whose health
  // the host has read since the last log line; over the window's samples, the train accuracy.
  // A non-finite step's predictions come from NaN/Inf logits and mean nothing: its rows count
  // in neither (a window of only such steps has no accuracy: NaN).
  double unlogged_correct_ = 0;
  std::int64_t unlogged_nonfinite_samples_ = 0;
  // The rows one rank trains on in `step` (all its micro-batches).
  std::int64_t rows_in_step(std::int64_t step) const;
  void save_checkpoint(std::int64_t step, std::int64_t epoch, std::int64_t step_in_epoch);
  // --save: the trained parameters as safetensors (rank 0). The final outputs return "" or why
  // they are not where asked (write_final_output), so that one's failure does not lose another.
  std::string save_parameters();
  void print_banner() const;
  // The last line: steps, time, first and last logged loss, skips, where the parameters went.
  void print_summary(double run_seconds, std::optional<float> first_loss, float last_loss,
                     std::optional<double> last_accuracy) const;
  // The task as checkpoints and --save record it ("regression" or "classify K").
  std::string task_description() const;
  void check_checkpoint_model(const std::string& path) const;  // before --resume loads it
  void resume();
  // --resume under DDP: every rank's newest checkpoint in its own --checkpoint-dir (or none) must
  // be rank 0's; else every rank stops naming each one's host, folder and newest checkpoint.
  void check_same_newest_checkpoint(const std::string& newest);
  // --trace: every rank's events, written by rank 0, as soon as the traced steps are done (a
  // run killed later keeps its trace). "" or the problem, kept for the end of the run.
  // Every rank's events, on rank 0 (a collective through the store; empty on the others).
  std::vector<std::string> gather_trace_events();
  std::string write_trace(std::vector<std::string> all);
  void write_trace_now(std::int64_t last_traced_step, std::vector<std::string> all);
  // A run that stops inside its traced steps (`cause`: "stopped", "got SIGTERM"): each rank's
  // own events beside --trace, once; from the main thread or SignalDump's.
  void write_partial_trace(const std::string& cause) const noexcept;
  mutable std::atomic<bool> partial_trace_written_ = false;
  void note_trace_not_written() const;
  mutable std::atomic<bool> trace_not_written_noted_ = false;
  void warn_of_trace_size() const;            // after the first traced step, from its size
  std::atomic<std::int64_t> step_ = 0;        // the step being trained, once training started
  std::optional<std::string> trace_outcome_;  // set once the trace was written (or failed)
  std::int64_t last_traced_step_ = 0;
  void check_same_settings();
  // --zero-overlap-gather with most of the parameters in the first layer's bucket: says so.
  void note_gather_overlap() const;
  // Input checks of issue #13, each before step 1: outputs writable (rank 0), the ranks' input
  // files identical (by content), an --init file of the same model.
  void check_output_paths();  // also takes --metrics' lock (metrics_lock_)
  void lock_metrics();        // into metrics_lock_; held by another run: exit 2
  void lock_checkpoint_dir();    // into checkpoint_lock_; held by another process: exit 2
  void follow_checkpoint_dir();  // at each checkpoint: the folder the name reaches now, locked
  void check_paths_distinct() const;
  // --zero-overlap-gather: the last step's all-gathers done, before the parameters are read.
  void wait_for_parameters();
  void require_finite_parameters(std::int64_t step, const char* what);
  std::string npy_checksums_;  // of --data and --targets, for data_description()
  void read_inputs();          // --init's header and the data set
  bool init_superseded_ = false;  // --resume will find a checkpoint: --init is not read
  // Every rank learns whether each read its inputs; any failure stops every rank, naming it.
  void agree_inputs_read(const std::string& problem);
  void load_npy_dataset();
  void check_same_inputs();
  void check_same_files(const std::string& key, const std::vector<std::string>& items,
                        const std::vector<std::string>& paths);
  void check_init_model() const;
  // A failed --metrics write: one warning naming the file, then no more metrics lines.
  void write_metrics_line(const std::string& line);
  // At the end of the run (rank 0): a --metrics file whose name was removed during the run (its
  // folder deleted) is written again, or to a rescue file (write_final_output), with a warning.
  void keep_metrics();
  // Opens --metrics (rank 0): a new run truncates it; a resumed run first drops the lines of
  // steps after the checkpoint's (they are trained again) and an incomplete last line, as
  // TensorBoard's purge_step does, then appends.
  void open_metrics();
  // A resumed run's purge of the lines it trains again from the regular file `target`; returns
  // whether the file still ends without a newline (the caller appends one).
  bool purge_metrics(const std::filesystem::path& target);

  TrainOptions o_;
  comm::WorldInfo world_;
  bool distributed_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  Device device_;
  std::optional<comm::Distributed> dist_;
  bool joining_ = false;  // init_distributed() was entered: a failure from here is the group's
  // Declared before everything that records spans (the prefetcher's thread, the Reducer), so it
  // is destroyed after them: members go in reverse order.
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<nn::Dataset> dataset_;
  std::unique_ptr<nn::Mlp> model_;
  std::vector<float> class_scratch_;  // --task classify: a batch's class indices as floats
  std::unique_ptr<nn::FlatParameters> params_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  std::unique_ptr<nn::OptimizerInBackward> optimizer_in_backward_;  // --optimizer-in-backward
  std::unique_ptr<comm::DistributedDataParallel> ddp_;
  std::unique_ptr<nn::Sampler> sampler_;
  std::unique_ptr<nn::BatchPrefetcher> prefetcher_;  // --prefetch
  std::unique_ptr<nn::Sampler> lookahead_sampler_;   // --prefetch: the next batch's epoch
  std::int64_t lookahead_epoch_ = -1;
  std::int64_t prefetched_ = -1;  // the global micro-batch in flight, -1 for none
  std::int64_t prefetched_rows_ = 0;
  // Before metrics_lock_, so destroyed after it: a --metrics file it created goes first.
  common::CreatedFolders created_folders_;  // by check_output_paths; kept once the run starts
  common::FileLock metrics_lock_;    // held on --metrics while this run writes it (released last)
  common::FileLock checkpoint_lock_;  // on --checkpoint-dir itself, while this run writes there
  // What --save and --trace named at their check (rank 0): a file another job wrote there since
  // is not replaced (write_final_output).
  common::FileState save_checked_, trace_checked_;
  std::string save_target_, trace_target_;  // where each path led at its check (links followed)
  std::ofstream metrics_file_;       // --metrics, when it names a file or a device
  std::ostream* metrics_ = nullptr;  // where the lines go: metrics_file_, std::cout or std::cerr

  std::int64_t steps_ = 0;            // total optimizer steps of the run
  std::int64_t steps_per_epoch_ = 0;  // optimizer steps per epoch
  std::int64_t micro_batches_per_epoch_ = 0;
  std::int64_t start_step_ = 0;  // steps already done (resume)
  std::int64_t sampler_epoch_ = -1;
  std::int64_t skipped_steps_ = 0;  // optimizer steps skipped for NaN/Inf (--skip-nonfinite)
  std::vector<comm::ZeroMemory> memory_per_rank_;  // gather_memory_per_rank(), by rank
  std::string run_id_;              // recorded in checkpoints: see nn::TrainingState::run_id

  // The health of the steps since the host last read it, one row each, on the device.
  static constexpr std::int64_t kKeptHealthRows = 64;
  Tensor health_rows_;
  std::vector<std::int64_t> unread_steps_;

  // CUDA: pinned host staging buffers, uploaded without the host waiting. A ring of them, as
  // PyTorch's caching host allocator hands out another pinned block while a copy is in flight:
  // the host, which waits for the GPU only at logged steps, runs ahead, and refills a staging
  // buffer only once the GPU has copied it (`copied`, recorded after its upload on the compute
  // stream).
  struct Staging {
    PinnedBuffer x, y;
    Event copied;
    bool busy = false;
  };
  static constexpr std::size_t kStagingBuffers = 4;
  std::array<Staging, kStagingBuffers> staging_;
  std::size_t staging_index_ = 0;  // the current micro-batch's
  float* x_staging() const { return static_cast<float*>(staging_[staging_index_].x.data()); }
  float* y_staging() const { return static_cast<float*>(staging_[staging_index_].y.data()); }
  // CUDA: the batches go up on a stream of their own into two device buffers used in turn, so
  // that a micro-batch's copy runs while the GPU still computes the one before (the host runs
  // ahead between logged steps). `free` follows the last work that read a buffer.
  struct DeviceBatch {
    Tensor x, y;
    Event free;
    bool used = false;
  };
  Stream upload_stream_;
  std::array<DeviceBatch, 2> device_batches_;
  std::size_t device_batch_index_ = 0;  // the current micro-batch's
  void next_device_batch(std::int64_t rows);
  // The current micro-batch on its device.
  Tensor x_, y_;
};

}  // namespace nanoddp::train
