// The training loop: steps of forward, backward (DDP reduces the gradients meanwhile) and the
// optimizer, logged every --log-every steps. The jobs around it live beside it: setup
// (trainer_setup.cpp), input checks (trainer_inputs.cpp), batches (trainer_batches.cpp), step
// health (trainer_health.cpp), checkpoints (trainer_checkpoint.cpp), logs and traces
// (trainer_report.cpp).
#include "trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "final_output.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/functional.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/checkpoint.h"
#include "signal_dump.h"
#include "trainer_internal.h"

namespace nanoddp::train {

float Trainer::train_step(std::int64_t step, Window& window) {
  const auto step_start = Clock::now();
  const std::int64_t host_syncs_before = host_sync_count();
  double data_ms = 0;
  optimizer_->zero_grad();
  double backward_ms = 0;
  Tensor loss_sum;
  Tensor correct_sum;  // --task classify
  // Each micro-batch's mean loss weighs by its share of the step's rows, so --grad-accum K with
  // --batch B equals --batch K*B, a partial last micro-batch included. (Every rank has the same
  // rows per micro-batch, so the all-reduce's average over ranks stays right.)
  const std::int64_t micro_batches = micro_batches_in_step(step);
  const std::int64_t step_rows = rows_in_step(step);
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
    if (ddp_ && m + 1 < micro_batches) no_sync.emplace(*ddp_);
    Tensor loss;
    const auto forward_start = Clock::now();
    {
      TraceSpan span("forward", TraceTrack::kCompute, device_);
      // Through DDP's forward when there is one, as in PyTorch: it counts the call for the step
      // check, and with find_unused_parameters finds the parameters the output cannot reach.
      const Tensor output = ddp_ ? ddp_->forward(x_) : model_->forward(x_);
      loss = loss_of(output);
      if (classify()) {
        const Tensor correct = count_correct(output);
        correct_sum = m == 0 ? correct : add(correct_sum, correct);
      }
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
  const Tensor health = gather_health(loss_sum, correct_sum);
  float loss = NAN;  // known to the host only where it reads the health
  if (!reads_health_at(step)) {
    // Nothing is read back in this step, so the host does not wait for the GPU: the step's
    // health stays on the device until the next read, which checks every kept step in order.
    // (A NaN found there stops the run then, naming its step; checkpoints and the last step are
    // reads, so no poisoned parameters are ever saved.)
    keep_health(health, step);
    if (!optimizer_in_backward_) {
      TraceSpan span("optimizer step", TraceTrack::kCompute, device_);
      optimizer_step();
    }
  } else {
    loss = apply_health(read_health(health, step), step);
  }
  // One reading of the clock for both: read twice, a thread descheduled in between (a loaded
  // machine, a sanitizer) booked more optimizer time than the whole step, and other_ms < 0.
  const auto step_end = Clock::now();
  const double wall_ms = ms_between(step_start, step_end);
  window.optimizer_ms += ms_between(optimizer_start, step_end);
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
    // On the CPU backward() returned only when the all-reduces were done, so its time holds the
    // exposed communication (from the last gradient to the end of the last all-reduce): taken out
    // here, so that forward + backward + exposed + optimizer + other adds up to the step. (The
    // Reducer's wait_ms is shorter: it starts when finalize starts waiting, not at the last
    // gradient.) On a GPU the compute stream stalled for them while the host went on, so the
    // host's backward time does not contain them.
    if (device_.is_cpu()) window.backward_ms -= stats.exposed_comm_ms;
    // --zero: the parameter all-gather is communication, booked there, not as optimizer time;
    // the host waits for it after the step, or with --zero-overlap-gather in the forward before
    // the layers that read it (the waits are this step's forward's, for the last step's gathers).
    if (ddp_->zero() != nullptr && device_.is_cpu()) {
      const comm::Zero::GatherTimes gather = ddp_->zero()->take_gather_times();
      window.comm_ms += gather.comm_ms;
      // Never more exposed than there was communication: a wait also holds the hand-off from
      // the communication thread (overhead of the step, left in other_ms).
      window.exposed_comm_ms +=
          std::min(gather.after_step_ms + gather.in_forward_ms, gather.comm_ms);
      window.optimizer_ms -= gather.after_step_ms;
      window.forward_ms -= gather.in_forward_ms;
    }
  }
  return loss;
}

void Trainer::optimizer_step() {
  if (ddp_ && ddp_->zero() != nullptr) {
    ddp_->zero()->step();
  } else {
    optimizer_->step();
  }
}

void Trainer::wait_for_parameters() {
  if (ddp_ && ddp_->zero() != nullptr) ddp_->zero()->wait_for_parameters();
}

comm::ZeroMemory Trainer::memory() const {
  if (ddp_ && ddp_->zero() != nullptr) return ddp_->zero()->memory();
  return comm::unsharded_memory(*params_, *optimizer_);
}

void Trainer::gather_memory_per_rank() {
  memory_per_rank_ = comm::gather_memory(
      memory(), distributed_ && world_size_ > 1 ? dist_->group.get() : nullptr, device_);
}

Tensor Trainer::loss_of(const Tensor& output) const {
  return classify() ? cross_entropy(output, y_) : mse_loss(output, y_);
}

// The arg-max of each row (torch.argmax's, the first on ties) against the target, on the device:
// both index vectors become one-hot rows (the scatter of max's backward), whose elementwise
// product sums to the number of matches.
Tensor Trainer::count_correct(const Tensor& logits) const {
  const std::int64_t rows = logits.size(0), classes = logits.size(1);
  const Tensor predicted = max(logits.detach(), 1).indices;
  const Tensor ones = Tensor::ones({rows}, device_);
  Tensor hits = Tensor::empty({rows, classes}, device_);
  Tensor wanted = Tensor::empty({rows, classes}, device_);
  Backend& backend = backend_for(device_);
  backend.index_backward(ones.data(), predicted.data_i64(), rows, classes, 1, 0.0f, hits.data());
  backend.index_backward(ones.data(), y_.data_i64(), rows, classes, 1, 0.0f, wanted.data());
  const auto n = rows * classes;
  backend.binary(kernels::BinaryOp::kMul, hits.data(), {.div = 1, .mod = n}, wanted.data(),
                 {.div = 1, .mod = n}, hits.data(), n);
  Tensor count = Tensor::empty({1}, device_);
  backend.sum(hits.data(), n, count.data());
  return count;
}

void Trainer::write_trace_now(std::int64_t last_traced_step, std::vector<std::string> all) {
  last_traced_step_ = last_traced_step;
  // On rank 0, which writes it, a SIGTERM waits until the file is in place (or rescued), as at
  // the end of the run.
  std::optional<HeldSignals> held;
  if (is_main()) held.emplace();
  trace_outcome_ = write_trace(std::move(all));
  if (!trace_outcome_->empty() && is_main()) {
    fmt::print(stderr,
               "nanoddp-train: warning: {}; training goes on, and the run ends with this error "
               "after its other outputs\n",
               *trace_outcome_);
    std::fflush(stderr);
  }
}

// Said, not left to be found missing (an outside tester's NaN stop inside the window), once,
// by rank 0, from the main thread or SignalDump's.
void Trainer::note_trace_not_written() const {
  if (!is_main() || trace_not_written_noted_.exchange(true)) return;
  fmt::print(stderr,
             "nanoddp-train: note: --trace '{}' was not written: the run stopped before its "
             "traced steps were done (it is written after step {})\n",
             o_.trace_path, std::min(start_step_ + o_.trace_steps, steps_));
  std::fflush(stderr);
}

int Trainer::run() {
  try {
    return run_steps();
  } catch (...) {
    // A failed rank 0 does not hold the store up for peers that may be dead (~Distributed).
    if (dist_) dist_->abandon();
    if (tracer_ && !trace_outcome_) {
      note_trace_not_written();
      if (step_ > start_step_) write_partial_trace("stopped");
    }
    throw;
  }
}

int Trainer::run_steps() {
  metrics_lock_.keep();  // set up: the --metrics file is this run's output now, even if empty
  created_folders_.keep();
  print_banner();
  const auto run_start = Clock::now();
  Window window;
  // While the traced steps run, a signal first writes what this rank traced (a launcher
  // stopping a hung job's workers): the whole trace needs every rank, which a stop rules out.
  std::optional<SignalDump> signal_dump;
  std::optional<float> first_loss;  // not NaN as "unset": a logged loss can be NaN
  float last_loss = NAN;
  std::optional<double> last_accuracy;  // --task classify
  for (std::int64_t step = start_step_ + 1; step <= steps_; ++step) {
    const std::int64_t epoch = (step - 1) / steps_per_epoch_;
    const std::int64_t step_in_epoch = (step - 1) % steps_per_epoch_;
    step_ = step;
    if (epoch != sampler_epoch_) {
      sampler_->set_epoch(epoch);
      sampler_epoch_ = epoch;
    }
    const bool tracing = tracer_ && step - start_step_ <= o_.trace_steps;
    std::optional<TraceScope> trace_scope;
    if (tracing) trace_scope.emplace(tracer_.get());
    if (tracing && !signal_dump) {
      signal_dump.emplace([this](int signal_number) {
        note_trace_not_written();
        write_partial_trace(fmt::format("got SIG{}", sigabbrev_np(signal_number)));
      });
    }

    const float world_loss = train_step(step, window);
    if (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) {
      save_checkpoint(step, epoch, step_in_epoch + 1);
    }
    if (tracing && step == start_step_ + 1) warn_of_trace_size();
    if (tracing && (step - start_step_ == o_.trace_steps || step == steps_)) {
      // With --zero-overlap-gather the last traced step's gathers run into the next forward,
      // which is not traced: they are waited for here, so that the trace holds them.
      if (o_.zero_overlap_gather) wait_for_parameters();
      trace_scope.reset();
      // The ranks hand their events to rank 0 while a signal still writes this rank's own: a
      // peer stuck here held rank 0 for NANODDP_TIMEOUT_S, its signals held for a write that
      // had not begun, and a launcher's SIGKILL then left no trace at all (an outside tester's).
      std::vector<std::string> all = gather_trace_events();
      signal_dump.reset();  // rank 0 now writes the whole trace, its signals held meanwhile
      write_trace_now(step, std::move(all));
    }
    const bool log_now = is_log_step(step);
    if (!log_now) continue;
    if (step == start_step_ + 1 || step == steps_) gather_memory_per_rank();
    last_loss = world_loss;
    if (!first_loss) first_loss = last_loss;
    if (classify()) {
      // Every step of the window has had its health read by now (a logged step reads it): the
      // correct predictions over the samples all ranks saw.
      const std::int64_t counted = window.samples - unlogged_nonfinite_samples_;
      last_accuracy = counted > 0 ? unlogged_correct_ / static_cast<double>(counted) : NAN;
      unlogged_correct_ = 0;
      unlogged_nonfinite_samples_ = 0;
    }
    log(step, epoch, last_loss, last_accuracy, window);
    window = Window{};
  }

  // The run's time, not the final outputs' (a wait for another job's lock is not training).
  const double run_seconds = ms_since(run_start) / 1000.0;
  if (!o_.save_path.empty()) require_finite_parameters(steps_, "--save");
  // On rank 0, which writes them, a SIGTERM now waits until the outputs are in place (or
  // rescued); the other ranks only hand over their trace and stay stoppable at once.
  std::optional<HeldSignals> held;
  if (is_main()) held.emplace();
  const std::string save_problem = save_parameters();  // in this order
  // Written after its last traced step. A run with no step left to train (resumed at its end)
  // traced nothing: an empty trace would replace a good one at that path (an outside tester's).
  if (tracer_ && !trace_outcome_ && is_main()) {
    fmt::print(
        "nanoddp-train: note: no step was left to train, so nothing was traced; --trace "
        "'{}' is left as it is\n",
        o_.trace_path);
  }
  const std::string trace_problem = trace_outcome_.value_or("");
  keep_metrics();
  if (!save_problem.empty() || !trace_problem.empty()) {
    // What did go where it belongs is said too: the error alone left a user unsure whether the
    // parameters were saved when only the trace could not be written.
    std::vector<std::string> parts;
    for (const std::string& problem : {save_problem, trace_problem}) {
      if (!problem.empty()) parts.push_back(problem);
    }
    if (save_problem.empty() && !o_.save_path.empty()) {
      parts.push_back(fmt::format("the parameters were saved to {}", o_.save_path));
    }
    if (trace_problem.empty() && trace_outcome_ && is_main()) {
      parts.push_back(fmt::format("the trace was written to {}", o_.trace_path));
    }
    fail("{}", fmt::join(parts, "; "));
  }
  print_summary(run_seconds, first_loss, last_loss, last_accuracy);
  return 0;
}

}  // namespace nanoddp::train
