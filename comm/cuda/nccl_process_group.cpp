// The NCCL process group: collectives on CUDA tensors, on a communication stream of their own.
//
// The stream/event dance of one op (the heart of the overlap; docs/ddp-internals.md, step 4):
//
//   compute stream:  ... backward kernels writing the gradient ... [ready] ........ [wait done]
//   comm stream:                                  (waits for ready) ncclAllReduce [done]
//
// 1. record `ready` on the caller's compute stream: the point where the tensor's producer has
//    been enqueued;
// 2. make the (high-priority) communication stream wait for `ready` — the GPU waits, the host
//    does not;
// 3. enqueue the NCCL call on the communication stream and record `done` after it;
// 4. Work::wait() makes the compute stream wait for `done`: kernels enqueued afterwards (the
//    optimizer step) see the reduced values, and the host still never blocks.
//
// NCCL reports nothing by itself when a peer dies or falls out of step: the kernel just spins.
// So a watchdog thread polls ncclCommGetAsyncError and each in-flight op's `done` event; an
// error, or an op older than the timeout, prints what was running (op, sequence number, count),
// aborts the communicator and ends the process. Detecting is not enough: a process stuck in a
// collective never reaches its own error handling, so the watchdog must be the one to exit.

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "nanoddp/comm/cuda/nccl_check.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/cuda/device_guard.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/kernels/cuda/check.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

void throw_nccl_error(const char* call, ncclResult_t result, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw CommError(fmt::format("NCCL call {} failed: {} ({}){}{} at {}:{}", call,
                              ncclGetErrorString(result), static_cast<int>(result),
                              last != nullptr && *last != '\0' ? ": " : "",
                              last != nullptr ? last : "", file, line));
}

namespace {

// Exit code of a process ended by the watchdog (EX_SOFTWARE from sysexits.h).
constexpr int kWatchdogExitCode = 70;
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
// If ncclCommAbort itself hangs (it can, with a wedged GPU), this ends the process anyway.
constexpr auto kAbortGrace = std::chrono::seconds(10);
// How often op timings get a fresh GPU clock anchor (see renew_anchor_if_due).
constexpr auto kAnchorRenewal = std::chrono::seconds(60);

ncclDataType_t nccl_dtype(DType dtype) {
  return dtype == DType::kF32 ? ncclFloat : ncclBfloat16;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;  // NCCL divides once, in the reduction kernel
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// What the watchdog sees of an op: its events and its description. No tensors here, so the
// watchdog thread never drops the last handle to a buffer (the allocator is the issuing
// thread's business).
struct OpState {
  std::uint64_t sequence_number = 0;
  std::string op_name;
  std::string description;  // "allreduce #7 (sum, 1237 x float32)"
  Event ready;
  Event started;  // on the comm stream, once the inputs are ready: the op's real start
  Event done;
  std::shared_ptr<const ClockAnchor> anchor;
  std::chrono::steady_clock::time_point issued;
  bool host_blocking = false;  // barrier: wait() blocks the host
  OpState(Device device) : ready(device), started(device), done(device) {}
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<OpState> state, Device device)
      : state_(std::move(state)), device_(device) {}
  void wait() override {
    if (state_->host_blocking) {
      state_->done.synchronize();
    } else {
      // The GPU waits; the host returns at once.
      state_->done.block(Stream::compute(device_));
    }
  }
  bool is_completed() override { return state_->done.query(); }
  // A failed NCCL op never comes back here: the watchdog ends the process.
  std::exception_ptr error() override { return nullptr; }
  std::uint64_t sequence_number() const override { return state_->sequence_number; }
  const std::string& op_name() const override { return state_->op_name; }
  // When the collective ran on the GPU, in host steady-clock time (timelines and statistics).
  std::optional<WorkTiming> timing() const override {
    if (!state_->done.query()) return std::nullopt;
    // The start through the anchor; the duration from the op's own two events. (Both ends
    // through the anchor would lose it: GPU event intervals are float milliseconds, which an
    // hour after the anchor step by 0.25 ms.)
    const auto start = state_->anchor->host_time_of(state_->started);
    const auto duration = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double, std::milli>(state_->started.elapsed_ms(state_->done)));
    return WorkTiming{.start = start, .end = start + duration};
  }

 private:
  std::shared_ptr<OpState> state_;
  Device device_;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options)
      : ProcessGroup(rank, size), options_(options), device_(Device::cuda(options.device_index)) {
    require_device(device_);
    // One GPU per process: make it this thread's current device for good, as torchrun users
    // do with torch.cuda.set_device(local_rank).
    NANODDP_CUDA_CHECK(cudaSetDevice(device_.index));

    // 1. The unique id: rank 0 creates it, everyone else reads it from the store.
    auto prefixed = std::make_shared<PrefixStore>(options.name + "/nccl", std::move(store));
    ncclUniqueId id;
    if (rank == 0) {
      NANODDP_NCCL_CHECK(ncclGetUniqueId(&id));
      prefixed->set("unique_id", std::span<const std::uint8_t>(
                                     reinterpret_cast<const std::uint8_t*>(&id), sizeof(id)));
    } else {
      prefixed->wait({"unique_id"}, options.timeout);
      const Bytes bytes = prefixed->get("unique_id");
      if (bytes.size() != sizeof(id)) {
        throw CommError(
            fmt::format("NCCL group '{}': the unique id in the store has {} bytes, "
                        "expected {}",
                        options.name, bytes.size(), sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }

    // 2. The communicator, non-blocking: ncclCommInitRankConfig returns at once and we poll,
    // so a rank that never joins is a timeout with a message instead of a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    NANODDP_NCCL_CHECK_ASYNC(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
    try {
      wait_ready("ncclCommInitRankConfig", deadline);
    } catch (...) {
      if (comm_ != nullptr) (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }

    // 3. The communication stream (high priority: NCCL's kernels are scheduled ahead of queued
    // compute kernels) and a one-element buffer for barrier().
    // A throw from here on leaves the constructor without the destructor: the communicator is
    // aborted here, or it would leak and the peers would wait out their timeout.
    try {
      comm_stream_ = Stream::create(device_, StreamPriority::kHigh);
      // The ops' GPU event times (Work::timing()) map onto the host clock through this anchor.
      anchor_ = std::make_shared<const ClockAnchor>(comm_stream_);
      barrier_buffer_ = Tensor::zeros({1}, device_);
      watchdog_ = std::thread([this] { watchdog_loop(); });
    } catch (...) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
    int nccl_version = 0;
    (void)ncclGetVersion(&nccl_version);
    debug_log(DebugLevel::kInfo, "nccl communicator ready: rank {} of {} on cuda:{} (NCCL {})",
              rank, size, device_.index, nccl_version);
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_ == nullptr) return;
    // Flush what was issued (ncclCommFinalize), bounded by the timeout; destroy. If the flush
    // fails or never finishes, abort instead: a finished job must exit.
    bool clean = false;
    try {
      NANODDP_NCCL_CHECK_ASYNC(ncclCommFinalize(comm_));
      wait_ready("ncclCommFinalize", std::chrono::steady_clock::now() + options_.timeout);
      clean = true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[nanoddp] rank %d: NCCL shutdown: %s; aborting the communicator\n",
                   rank(), e.what());
    }
    if (clean) {
      // The ops' buffers (in_flight_'s keep_alive) go back to the caching allocator below:
      // make sure no NCCL kernel still uses them.
      try {
        comm_stream_.synchronize();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[nanoddp] rank %d: NCCL shutdown: %s\n", rank(), e.what());
      }
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
    std::lock_guard lock(watch_mutex_);
    in_flight_.clear();
  }

  std::string backend_name() const override { return "nccl"; }

  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) override {
    require_cuda(tensor, "allreduce", "input");
    const auto n = static_cast<std::size_t>(tensor.numel());
    return issue("allreduce", {.kind = OpKind::kAllreduce, .count = n, .dtype = tensor.dtype()},
                 fmt::format("{}, {} x {}", reduce_op_name(op), n, dtype_name(tensor.dtype())),
                 {tensor}, [&](cudaStream_t stream) {
                   if (n == 0) return;
                   NANODDP_NCCL_CHECK_ASYNC(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), n,
                                                          nccl_dtype(tensor.dtype()), nccl_op(op),
                                                          comm_, stream));
                 });
  }

  std::shared_ptr<Work> allreduce_coalesced(std::vector<Tensor>& tensors, ReduceOp op) override {
    std::size_t total = 0;
    for (const Tensor& t : tensors) {
      require_cuda(t, "allreduce_coalesced", "input");
      total += static_cast<std::size_t>(t.numel());
    }
    return issue(
        "allreduce_coalesced",
        {.kind = OpKind::kAllreduceCoalesced,
         .count = total,
         .dtype = tensors.empty() ? DType::kF32 : tensors.front().dtype()},
        fmt::format("{}, {} tensors, {} elements", reduce_op_name(op), tensors.size(), total),
        tensors, [&](cudaStream_t stream) {
          // One group: NCCL fuses the calls into one launch, one synchronization.
          NANODDP_NCCL_CHECK(ncclGroupStart());
          try {
            for (const Tensor& t : tensors) {
              if (t.numel() == 0) continue;
              NANODDP_NCCL_CHECK_ASYNC(
                  ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()),
                                nccl_dtype(t.dtype()), nccl_op(op), comm_, stream));
            }
          } catch (...) {
            (void)ncclGroupEnd();  // a group left open would break every later NCCL call
            throw;
          }
          NANODDP_NCCL_CHECK_ASYNC(ncclGroupEnd());
        });
  }

  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override {
    require_cuda(tensor, "broadcast", "input");
    if (root < 0 || root >= size()) {
      fail("NCCL broadcast: root {} is outside the group (size {})", root, size());
    }
    const auto n = static_cast<std::size_t>(tensor.numel());
    return issue(
        "broadcast", {.kind = OpKind::kBroadcast, .count = n, .dtype = tensor.dtype()},
        fmt::format("root {}, {} x {}", root, n, dtype_name(tensor.dtype())), {tensor},
        [&](cudaStream_t stream) {
          if (n == 0) return;
          NANODDP_NCCL_CHECK_ASYNC(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), n,
                                                 nccl_dtype(tensor.dtype()), root, comm_, stream));
        });
  }

  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output) override {
    require_cuda(input, "allgather", "input");
    require_cuda(output, "allgather", "output");
    if (input.dtype() != output.dtype() || output.numel() != input.numel() * size()) {
      fail(
          "NCCL allgather: the output must hold size() x input elements of the input's dtype "
          "({} x {} {}), got {} {}",
          size(), input.numel(), dtype_name(input.dtype()), output.numel(),
          dtype_name(output.dtype()));
    }
    const auto n = static_cast<std::size_t>(input.numel());
    return issue(
        "allgather", {.kind = OpKind::kAllgather, .count = n, .dtype = input.dtype()},
        fmt::format("{} x {} per rank", n, dtype_name(input.dtype())), {input, output},
        [&](cudaStream_t stream) {
          if (n == 0) return;
          NANODDP_NCCL_CHECK_ASYNC(ncclAllGather(input.raw_data(), output.raw_data(), n,
                                                 nccl_dtype(input.dtype()), comm_, stream));
        });
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) override {
    require_cuda(input, "reduce_scatter", "input");
    require_cuda(output, "reduce_scatter", "output");
    if (input.dtype() != output.dtype() || input.numel() != output.numel() * size()) {
      fail(
          "NCCL reduce_scatter: the input must hold size() x output elements of the output's "
          "dtype ({} x {} {}), got {} {}",
          size(), output.numel(), dtype_name(output.dtype()), input.numel(),
          dtype_name(input.dtype()));
    }
    const auto n = static_cast<std::size_t>(output.numel());
    return issue(
        "reduce_scatter", {.kind = OpKind::kReduceScatter, .count = n, .dtype = output.dtype()},
        fmt::format("{}, {} x {} per rank", reduce_op_name(op), n, dtype_name(output.dtype())),
        {input, output}, [&](cudaStream_t stream) {
          if (n == 0) return;
          NANODDP_NCCL_CHECK_ASYNC(ncclReduceScatter(input.raw_data(), output.raw_data(), n,
                                                     nccl_dtype(output.dtype()), nccl_op(op), comm_,
                                                     stream));
        });
  }

  std::shared_ptr<Work> barrier() override {
    // NCCL has no barrier: a one-element allreduce is one, and its Work blocks the host.
    return issue(
        "barrier", {.kind = OpKind::kBarrier}, "", {barrier_buffer_},
        [&](cudaStream_t stream) {
          NANODDP_NCCL_CHECK_ASYNC(ncclAllReduce(barrier_buffer_.raw_data(),
                                                 barrier_buffer_.raw_data(), 1, ncclFloat, ncclSum,
                                                 comm_, stream));
        },
        /*host_blocking=*/true);
  }

 private:
  void require_cuda(const Tensor& t, const char* op, const char* role) const {
    if (!t.defined()) fail("NCCL {}: the {} tensor is undefined", op, role);
    if (t.device() != device_) {
      fail("NCCL {}: the {} tensor is on {}, but this rank's NCCL group runs on {}{}", op, role,
           t.device().str(), device_.str(),
           t.device().is_cpu() ? " (use the Gloo backend for CPU tensors)" : "");
    }
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) {
      fail("NCCL {}: the {} tensor is {}; collectives carry float32 and bfloat16 tensors", op,
           role, dtype_name(t.dtype()));
    }
  }

  // Polls a non-blocking communicator until its last call has finished.
  void wait_ready(const char* what, std::chrono::steady_clock::time_point deadline) {
    for (int polls = 0;;) {
      ncclResult_t state = ncclSuccess;
      NANODDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) throw_nccl_error(what, state, __FILE__, __LINE__);
      if (std::chrono::steady_clock::now() > deadline) {
        throw CommError(fmt::format(
            "NCCL group '{}': {} did not finish within {:.1f} s on rank {} of {} (is every rank "
            "running and calling the same ops in the same order?)",
            options_.name, what, std::chrono::duration<double>(options_.timeout).count(), rank(),
            size()));
      }
      // Spin briefly (an op's launch usually finishes in microseconds), then back off so a
      // slow communicator set-up does not burn a core.
      if (++polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  std::shared_ptr<Work> issue(const char* op, OpRecord record, const std::string& arguments,
                              std::vector<Tensor> keep_alive,
                              const std::function<void(cudaStream_t)>& launch,
                              bool host_blocking = false) {
    // One op at a time from any number of host threads: NCCL calls on one communicator must
    // not interleave, and sequence numbers must follow the launch order.
    std::lock_guard issue_lock(issue_mutex_);
    detail::CudaDeviceGuard guard(device_.index);
    auto state = std::make_shared<OpState>(device_);
    state->sequence_number = ++last_sequence_number_;
    state->host_blocking = host_blocking;
    record.sequence_number = state->sequence_number;
    record_op(record);
    trace_issue(*state, op, arguments);

    state->ready.record(Stream::compute(device_));  // 1. inputs are produced up to here
    state->ready.block(comm_stream_);               // 2. comm stream waits (GPU-side)
    trace_start(*state);
    launch(static_cast<cudaStream_t>(comm_stream_.native()));  // 3. the collective
    wait_ready(op, state->issued + options_.timeout);
    state->done.record(comm_stream_);  //    and its completion marker
    watch(state, std::move(keep_alive));
    return std::make_shared<NcclWork>(state, device_);
  }

  // ---- issue()'s instrumentation: names and clock marks, apart from the algorithm ----

  // Before the op touches the comm stream: its name (for the debug log and the watchdog's
  // messages) and, when due, a fresh clock anchor for its timing.
  void trace_issue(OpState& state, const char* op, const std::string& arguments) {
    renew_anchor_if_due();
    state.op_name = op;
    state.description = fmt::format("{} #{}", op, state.sequence_number);
    if (!arguments.empty()) state.description += " (" + arguments + ")";
    debug_log(DebugLevel::kDetail, "nccl {} issued on cuda:{}", state.description, device_.index);
  }

  // Once the comm stream waits for the inputs: when the op really starts on the GPU (its
  // Work::timing()) and on the host (the watchdog's timeout and wait_ready's deadline).
  void trace_start(OpState& state) {
    state.started.record(comm_stream_);
    state.anchor = anchor_;
    state.issued = std::chrono::steady_clock::now();
  }

  // Hands the op to the watchdog, keeping its tensors alive until it has run.
  void watch(std::shared_ptr<OpState> state, std::vector<Tensor> keep_alive) {
    std::lock_guard lock(watch_mutex_);
    // Drop finished ops (and their tensor handles) here, on the issuing thread.
    while (!in_flight_.empty() && in_flight_.front().state->done.query()) {
      in_flight_.pop_front();
    }
    in_flight_.push_back(InFlight{std::move(state), std::move(keep_alive)});
  }

  // Op timings read GPU event times as float milliseconds since the anchor, which an hour later
  // step by 0.25 ms. So the anchor is renewed every minute, at a moment the communication stream
  // is idle (every issued op has finished): waiting for the new anchor's event then takes
  // microseconds and never stalls behind a collective. Ops keep the anchor they were issued with.
  void renew_anchor_if_due() {
    if (std::chrono::steady_clock::now() - anchor_->host_time() < kAnchorRenewal) return;
    {
      std::lock_guard lock(watch_mutex_);
      while (!in_flight_.empty() && in_flight_.front().state->done.query()) {
        in_flight_.pop_front();
      }
      if (!in_flight_.empty()) return;  // try again at the next op
    }
    anchor_ = std::make_shared<const ClockAnchor>(comm_stream_);
  }

  [[noreturn]] void die(const std::string& message) {
    // A kernel fault (an illegal address, a trap, a failed launch) is sticky: every later CUDA
    // call of the process returns it, and the watchdog's event queries are usually the first
    // to ask. It is then this process's GPU work that failed, not NCCL: say so, and name the
    // last op the main thread enqueued.
    if (const std::string fault = sticky_cuda_error(); !fault.empty()) {
      const char* op = last_device_op();
      std::fprintf(stderr,
                   "[nanoddp] rank %d of %d: a CUDA error on cuda:%d: %s. It is a fault in GPU "
                   "work this process enqueued (a kernel or a copy), not a communication error; "
                   "the NCCL watchdog only saw it first (%s). The last op enqueued on the "
                   "device: %s; the last collective issued: %s. Rerun with "
                   "CUDA_LAUNCH_BLOCKING=1 (or under compute-sanitizer) to find the failing "
                   "kernel. Aborting the communicator and exiting with code %d.\n",
                   rank(), size(), device_.index, fault.c_str(), message.c_str(),
                   op != nullptr ? op : "none", last_issued_description().c_str(),
                   kWatchdogExitCode);
    } else {
      std::fprintf(stderr,
                   "[nanoddp] rank %d of %d: NCCL watchdog: %s. Hint: a rank may have crashed "
                   "or be stuck; ops must be issued in the same order on every rank. Aborting "
                   "the communicator and exiting with code %d.\n",
                   rank(), size(), message.c_str(), kWatchdogExitCode);
    }
    std::fflush(stderr);
    // A second line of defence: if ncclCommAbort hangs, end the process anyway.
    std::thread([] {
      std::this_thread::sleep_for(kAbortGrace);
      std::_Exit(kWatchdogExitCode);
    }).detach();
    (void)ncclCommAbort(comm_);
    std::_Exit(kWatchdogExitCode);
  }

  // The device's sticky error as "cudaErrorIllegalAddress (an illegal memory access ...)", or
  // empty when the device is healthy. cudaStreamQuery never blocks (a spinning NCCL kernel
  // cannot hang it) and returns a sticky error like every call does.
  std::string sticky_cuda_error() const {
    const cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(comm_stream_.native()));
    if (err == cudaSuccess || err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return {};
    }
    return fmt::format("{} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
  }

  // Called from die() on the watchdog thread, which holds watch_mutex_.
  std::string last_issued_description() const {
    return in_flight_.empty() ? std::string("none") : in_flight_.back().state->description;
  }

  void watchdog_loop() {
    try {
      NANODDP_CUDA_CHECK(cudaSetDevice(device_.index));
    } catch (const std::exception& e) {
      std::lock_guard lock(watch_mutex_);  // die() reads in_flight_
      die(e.what());
    }
    std::unique_lock lock(watch_mutex_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, kWatchdogPeriod, [&] { return stopping_; });
      if (stopping_) break;
      try {
        ncclResult_t async_error = ncclSuccess;
        NANODDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async_error));
        const InFlight* oldest = nullptr;
        for (const InFlight& entry : in_flight_) {
          if (!entry.state->done.query()) {
            oldest = &entry;
            break;
          }
        }
        if (async_error != ncclSuccess && async_error != ncclInProgress) {
          const char* last = ncclGetLastError(comm_);
          die(fmt::format("asynchronous NCCL error {} ({}){}; oldest unfinished op: {}",
                          ncclGetErrorString(async_error), last != nullptr ? last : "", "",
                          oldest != nullptr ? oldest->state->description : "none"));
        }
        if (oldest != nullptr) {
          const auto age = std::chrono::steady_clock::now() - oldest->state->issued;
          if (age > options_.timeout) {
            die(
                fmt::format("{} timed out: not finished {:.1f} s after it was issued (timeout "
                            "{:.1f} s)",
                            oldest->state->description, seconds(age),
                            std::chrono::duration<double>(options_.timeout).count()));
          }
        }
      } catch (const std::exception& e) {
        die(e.what());  // a CUDA error seen by cudaEventQuery (e.g. an illegal address)
      }
    }
  }

  struct InFlight {
    std::shared_ptr<OpState> state;
    std::vector<Tensor> keep_alive;  // the op's buffers stay allocated until it has run
  };

  ProcessGroupOptions options_;
  Device device_;
  ncclComm_t comm_ = nullptr;
  Stream comm_stream_;
  std::shared_ptr<const ClockAnchor> anchor_;
  Tensor barrier_buffer_;
  std::mutex issue_mutex_;
  std::uint64_t last_sequence_number_ = 0;

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::deque<InFlight> in_flight_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size,
                                                      const ProcessGroupOptions& options) {
  return std::make_shared<NcclProcessGroup>(std::move(store), rank, size, options);
}

}  // namespace nanoddp::comm
