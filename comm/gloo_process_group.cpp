#include "nanoddp/comm/gloo_process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>

#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/hierarchical_allreduce.h"
#include "nanoddp/comm/reduce_ops.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {
namespace {

// ---- element-wise reductions handed to gloo::allreduce ------------------------------------
// Gloo calls these on segments of the buffer as they arrive from the ring neighbour:
// c[i] = a[i] (op) b[i] for n elements. c may alias a.

using ReduceFunc = gloo::AllreduceOptions::Func;

using detail::Max;
using detail::Min;
using detail::Sum;

template <typename Op>
void reduce_f32(void* c, const void* a, const void* b, std::size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = Op{}(x[i], y[i]);
}

// bf16 values are widened to float32, reduced, and rounded back (kernels/bf16.h).
using kernels::bf16_to_float;
using kernels::float_to_bf16;

template <typename Op>
void reduce_bf16(void* c, const void* a, const void* b, std::size_t n) {
  std::uint16_t* out = static_cast<std::uint16_t*>(c);
  const std::uint16_t* x = static_cast<const std::uint16_t*>(a);
  const std::uint16_t* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = float_to_bf16(Op{}(bf16_to_float(x[i]), bf16_to_float(y[i])));
  }
}

ReduceFunc reduce_function(ReduceOp op, DType dtype) {
  const bool f32 = dtype == DType::kF32;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // summed on the wire, divided once afterwards (divide_by)
      return f32 ? ReduceFunc(&reduce_f32<Sum>) : ReduceFunc(&reduce_bf16<Sum>);
    case ReduceOp::kMax:
      return f32 ? ReduceFunc(&reduce_f32<Max>) : ReduceFunc(&reduce_bf16<Max>);
    case ReduceOp::kMin:
      return f32 ? ReduceFunc(&reduce_f32<Min>) : ReduceFunc(&reduce_bf16<Min>);
  }
  return {};
}

// Average = sum, then one division by the world size here on the worker thread: exactly one
// rounding for float32, and never divided twice (the Reducer relies on this).
void divide_by(void* data, DType dtype, std::size_t n, int size) {
  const float divisor = static_cast<float>(size);
  if (dtype == DType::kF32) {
    float* p = static_cast<float*>(data);
    for (std::size_t i = 0; i < n; ++i) p[i] /= divisor;
  } else {
    std::uint16_t* p = static_cast<std::uint16_t*>(data);
    for (std::size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / divisor);
  }
}

void require_cpu(const Tensor& t, const char* op, const char* role) {
  if (!t.defined()) fail("Gloo {}: the {} tensor is undefined", op, role);
  if (!t.device().is_cpu()) {
    fail(
        "Gloo runs on CPU tensors; use the NCCL backend for cuda (Gloo {}: the {} tensor is on "
        "{})",
        op, role, t.device().str());
  }
}

// Gloo's TCP pairs write to their sockets without MSG_NOSIGNAL, so a write to a peer that has
// just crashed raises SIGPIPE, whose default action kills this process silently (exit 141)
// instead of letting the write fail and the op report "rank 1 may have crashed". Ignore it —
// only if nobody chose a disposition for it already — and let the error path do its job.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      (current.sa_flags & SA_SIGINFO) == 0) {
    signal(SIGPIPE, SIG_IGN);
  }
}

std::string strip_gloo_location(std::string message) {
  // GLOO_ERROR_MSG prefixes "[/build/gloo/transport/tcp/pair.cc:598] ".
  if (!message.empty() && message[0] == '[') {
    const std::size_t end = message.find("] ");
    if (end != std::string::npos && message.find(':') < end) message.erase(0, end + 2);
  }
  return message;
}

// ---- Work ---------------------------------------------------------------------------------

// The error travels as text, and every thread that asks for it gets an exception object of its
// own. Handing the worker's exception object itself to the waiting thread (rethrow of a shared
// exception_ptr) would leave two threads sharing one object whose lifetime is counted inside
// the C++ runtime, out of ThreadSanitizer's sight: it reported the worker freeing the message
// a waiter had printed.
class GlooWork final : public Work {
 public:
  GlooWork(std::uint64_t sequence_number, std::string op_name)
      : sequence_number_(sequence_number), op_name_(std::move(op_name)) {}

  void wait() override {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return done_; });
    if (error_message_) throw CommError(*error_message_);
  }
  bool is_completed() override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  std::exception_ptr error() override {
    std::lock_guard lock(mutex_);
    if (!error_message_) return nullptr;
    return std::make_exception_ptr(CommError(*error_message_));
  }
  std::uint64_t sequence_number() const override { return sequence_number_; }
  const std::string& op_name() const override { return op_name_; }
  std::optional<WorkTiming> timing() const override {
    std::lock_guard lock(mutex_);
    if (!done_) return std::nullopt;
    return timing_;
  }

  // `error`: what went wrong, or nullopt on success.
  void finish(std::optional<std::string> error, WorkTiming timing) {
    {
      std::lock_guard lock(mutex_);
      error_message_ = std::move(error);
      timing_ = timing;
      done_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  const std::uint64_t sequence_number_;
  const std::string op_name_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::optional<std::string> error_message_;
  WorkTiming timing_;
};

}  // namespace

// ---- the group ----------------------------------------------------------------------------

namespace {

// The options of failed Gloo ops, never destroyed (see Impl::run_gloo). Reachable from a static
// pointer, so LeakSanitizer does not count them as leaks: they are kept on purpose.
void keep_failed_gloo_op(std::shared_ptr<void> op) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(op));
}

}  // namespace

struct GlooProcessGroup::Impl {
  struct Job {
    std::shared_ptr<GlooWork> work;
    std::string description;  // "allreduce #7 (sum, 1237 x float32)"
    std::function<void(std::uint64_t sequence_number)> run;
  };

  GlooProcessGroup* owner = nullptr;  // records every op's fingerprint
  int rank = 0;
  int size = 1;
  ProcessGroupOptions options;
  GlooConnection connection;
  // Same host: allreduce (and reduce-scatter, which is one) goes through shared memory instead
  // of Gloo's TCP ring. Runs on the worker thread like every op, so order, sequence numbers,
  // Work and timings are unchanged. Null or disabled: everything goes over TCP.
  std::unique_ptr<ShmAllreduce> shm;
  // Several hosts, some with several ranks: shared memory within each, TCP across them
  // (hierarchical_allreduce.h). When enabled, `shm` is not made (it would span hosts).
  std::unique_ptr<HierarchicalAllreduce> hier;
  std::shared_ptr<Store> diagnostics;  // "<name>/gloo/diag/...": timeout reports only

  std::mutex mutex;  // guards everything below
  std::condition_variable queue_cv;
  std::deque<Job> queue;
  bool stopping = false;
  std::uint64_t last_sequence_number = 0;

  // Touched by the worker thread only.
  std::string first_failure;          // set by the first failed op: later ops fail fast
  std::vector<std::uint8_t> scratch;  // reduce-scatter result, coalesced packing; kept, reused

  std::thread worker;

  std::uint32_t tag(std::uint64_t sequence_number) const {
    // A distinct tag per op (Gloo slots are built from it), so messages of op N can never be
    // mistaken for messages of op N+1, even if ranks drift out of step.
    return static_cast<std::uint32_t>(sequence_number);
  }

  // Runs one Gloo collective on `opts` (worker thread). When it fails (a peer died or timed
  // out), Gloo's transport thread may still complete a send on the op's buffers later, under a
  // lock the failed op never took again: destroying the options then is a use after free
  // (ThreadSanitizer caught UnboundBuffer's destructor destroying the condition variable that
  // handleSendCompletion was signalling). The buffers also hold the transport context, so no
  // destruction order inside the group helps. A failed group is done anyway (later ops fail
  // fast) and the job is ending, so a failed op's options are kept for the life of the process.
  template <typename Options, typename Collective>
  void run_gloo(std::unique_ptr<Options> opts, Collective collective) {
    try {
      collective(*opts);
    } catch (...) {
      keep_failed_gloo_op(std::shared_ptr<Options>(std::move(opts)));
      throw;
    }
  }

  std::uint8_t* scratch_bytes(std::size_t nbytes) {
    // Grows to the largest size seen and stays: first touch of fresh memory is slow here.
    if (scratch.size() < nbytes) scratch.resize(nbytes);
    return scratch.data();
  }

  std::shared_ptr<Work> enqueue(OpRecord record, const std::string& detail,
                                std::function<void(std::uint64_t)> run) {
    std::unique_lock lock(mutex);
    const std::uint64_t seq = ++last_sequence_number;
    record.sequence_number = seq;
    owner->record_op(record);
    const std::string op = op_kind_name(record.kind);
    auto work = std::make_shared<GlooWork>(seq, op);
    std::string description = fmt::format("{} #{}", op, seq);
    if (!detail.empty()) description += " (" + detail + ")";
    debug_log(DebugLevel::kDetail, "gloo {} issued", description);
    queue.push_back(Job{work, std::move(description), std::move(run)});
    lock.unlock();
    queue_cv.notify_one();
    return work;
  }

  void worker_loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex);
        queue_cv.wait(lock, [&] { return stopping || !queue.empty(); });
        // On shutdown the queue is drained first: those ops were issued on every rank, and
        // the peers are waiting for them.
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      std::optional<std::string> error;
      WorkTiming timing{.start = std::chrono::steady_clock::now()};
      if (!first_failure.empty()) {
        error = fmt::format("Gloo {} on rank {} was not run: the group failed earlier ({})",
                            job.description, rank, first_failure);
      } else {
        try {
          job.run(job.work->sequence_number());
        } catch (const ShmError& e) {
          first_failure = job.description + " failed";
          error = explain_shm(job.description, e);
        } catch (const HierarchicalError& e) {
          first_failure = job.description + " failed";
          error = fmt::format("Gloo {} failed on rank {} of {} (hierarchical): {}", job.description,
                              rank, size, e.what());
        } catch (const std::exception& e) {
          error = explain(job.description, job.work->sequence_number(), e.what());
          first_failure = job.description + " failed";
        }
      }
      timing.end = std::chrono::steady_clock::now();
      if (debug_enabled(DebugLevel::kDetail)) {
        const double ms =
            std::chrono::duration<double, std::milli>(timing.end - timing.start).count();
        debug_log(DebugLevel::kDetail, "gloo {} {} in {:.3f} ms", job.description,
                  error ? "failed" : "finished", ms);
      }
      job.work->finish(std::move(error), timing);
    }
  }

  // Which ranks are behind? Gloo's timeout only says "a recv did not complete". On a timeout
  // (the failure path only, never per op), every rank that timed out in op `seq` checks in
  // under "timeout/<seq>/<rank>" and looks, for a short grace period, for the others. A rank
  // stuck before the op (in a long computation, a deadlock, a different op) never checks in:
  // that is the rank to look at.
  std::vector<int> ranks_without_report(std::uint64_t seq) const {
    std::vector<int> missing;
    if (diagnostics == nullptr) return missing;
    try {
      const auto key = [&](int r) { return fmt::format("timeout/{}/{}", seq, r); };
      diagnostics->set(key(rank), std::string("1"));
      const auto grace =
          std::min<std::chrono::milliseconds>(options.timeout / 2, std::chrono::seconds(3));
      const auto deadline = std::chrono::steady_clock::now() + grace;
      for (;;) {
        missing.clear();
        for (int r = 0; r < size; ++r) {
          if (r != rank && !diagnostics->check({key(r)})) missing.push_back(r);
        }
        if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception&) {
      missing.clear();  // the store is gone too: say nothing rather than something wrong
    }
    return missing;
  }

  std::string explain(const std::string& description, std::uint64_t seq,
                      const std::string& what) const {
    const std::string gloo_message = strip_gloo_location(what);
    std::string address;
    const int peer = gloo_peer_from_message(gloo_message, connection.addresses, &address);
    const bool timed_out = gloo_message.find("Timed out") != std::string::npos ||
                           gloo_message.find("timeout") != std::string::npos;
    std::string who = peer >= 0 ? fmt::format("rank {}", peer) : std::string("another rank");
    std::string cause;
    if (timed_out) {
      cause = fmt::format("timed out after {:.1f} s",
                          static_cast<double>(options.timeout.count()) / 1000.0);
      const std::vector<int> missing = ranks_without_report(seq);
      if (!missing.empty()) {
        who = fmt::format("rank{} {}", missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
        cause += fmt::format(
            "; {} did not report reaching this op (every rank that times out "
            "in it reports so through the store)",
            who);
      }
    } else {
      cause = peer >= 0 ? fmt::format("lost the connection to rank {} ({})", peer, address)
                        : std::string("lost the connection to a peer");
    }
    return fmt::format(
        "Gloo {} failed on rank {} of {}: {} (Gloo: \"{}\"). Hint: {} may have crashed or be "
        "stuck; ops must be issued in the same order on every rank",
        description, rank, size, cause, gloo_message, who);
  }

  // The shared-memory path knows exactly who is missing (their arrival counters are behind,
  // or their process is gone), so no store round is needed to find out.
  std::string explain_shm(const std::string& description, const ShmError& e) const {
    std::string who = "another rank";
    if (!e.suspects().empty()) {
      who = fmt::format("rank{} {}", e.suspects().size() > 1 ? "s" : "",
                        fmt::join(e.suspects(), ", "));
    }
    return fmt::format(
        "Gloo {} failed on rank {} of {} (shared memory): {}. Hint: {} may have crashed or be "
        "stuck; ops must be issued in the same order on every rank",
        description, rank, size, e.what(), who);
  }

  // ---- the Gloo calls (worker thread) ----

  void run_allreduce(void* data, std::size_t n, DType dtype, ReduceOp op, std::uint64_t seq,
                     const void* input = nullptr) {
    if (n == 0) return;
    if (hier != nullptr && hier->enabled()) {
      hier->run(data, input, n, dtype, op, seq);  // divides once itself for avg
      return;
    }
    if (shm != nullptr && shm->enabled()) {
      shm->run(data, input, n, dtype, op, seq);  // divides once itself for avg
      return;
    }
    auto opts = std::make_unique<gloo::AllreduceOptions>(connection.context);
    if (dtype == DType::kF32) {
      if (input != nullptr) opts->setInput(static_cast<float*>(const_cast<void*>(input)), n);
      opts->setOutput(static_cast<float*>(data), n);
    } else {
      if (input != nullptr) {
        opts->setInput(static_cast<std::uint16_t*>(const_cast<void*>(input)), n);
      }
      opts->setOutput(static_cast<std::uint16_t*>(data), n);
    }
    opts->setReduceFunction(reduce_function(op, dtype));
    opts->setTag(tag(seq));
    opts->setTimeout(options.timeout);
    run_gloo(std::move(opts), [](gloo::AllreduceOptions& o) { gloo::allreduce(o); });
    if (op == ReduceOp::kAvg) divide_by(data, dtype, n, size);
  }
};

GlooProcessGroup::GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   const ProcessGroupOptions& options)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>()) {
  impl_->owner = this;
  impl_->rank = rank;
  impl_->size = size;
  impl_->options = options;
  impl_->diagnostics = std::make_shared<PrefixStore>(options.name + "/gloo/diag", store);
  ignore_sigpipe_unless_handled();
  impl_->connection = connect_gloo(store, rank, size, options);
  // After the TCP connection (which still carries broadcast, allgather and barrier, and is
  // the fallback): all ranks agree here whether allreduce goes hierarchical (several hosts),
  // else whether they can share memory (one host).
  impl_->hier = std::make_unique<HierarchicalAllreduce>(store, rank, size, options);
  if (!impl_->hier->enabled()) {
    impl_->shm = std::make_unique<ShmAllreduce>(*store, rank, size, options.timeout, options.name);
  }
  impl_->worker = std::thread([impl = impl_.get()] { impl->worker_loop(); });
  debug_log(DebugLevel::kInfo, "gloo group '{}': rank {} of {}, allreduce over {}", options.name,
            rank, size, allreduce_transport());
}

GlooProcessGroup::~GlooProcessGroup() {
  // Order matters (PyTorch's Gloo group can hang here): 1. tell the worker to stop once the
  // queue is empty, 2. join it, 3. only then destroy the context, which closes the sockets and
  // stops Gloo's own event-loop thread. A finished job must exit.
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->queue_cv.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
  impl_->connection.context.reset();
}

std::string GlooProcessGroup::backend_name() const {
  if (impl_->hier != nullptr && impl_->hier->enabled()) return "gloo+shm+hier";
  return uses_shared_memory() ? "gloo+shm" : "gloo";
}

bool GlooProcessGroup::uses_shared_memory() const {
  return impl_->shm != nullptr && impl_->shm->enabled();
}

std::string GlooProcessGroup::allreduce_transport() const {
  if (impl_->hier != nullptr && impl_->hier->enabled()) {
    return "hierarchical (" + impl_->hier->describe() + ")";
  }
  if (uses_shared_memory()) {
    return fmt::format("shared memory (same host; {} KiB chunks)",
                       impl_->shm->chunk_bytes() / 1024);
  }
  std::string why;
  if (impl_->shm != nullptr && size() > 1) why = "; " + impl_->shm->fallback_reason();
  return fmt::format("TCP ring ({}{})", impl_->connection.device_description, why);
}

const std::string& GlooProcessGroup::device_description() const {
  return impl_->connection.device_description;
}

std::uint64_t GlooProcessGroup::ops_issued() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->last_sequence_number;
}

std::shared_ptr<Work> GlooProcessGroup::allreduce(Tensor& tensor, ReduceOp op) {
  require_cpu(tensor, "allreduce", "input");
  const auto n = static_cast<std::size_t>(tensor.numel());
  const DType dtype = tensor.dtype();
  Impl* impl = impl_.get();
  // The job holds a handle to the tensor, so its storage stays alive until the op has run.
  return impl->enqueue({.kind = OpKind::kAllreduce, .count = n, .dtype = dtype},
                       fmt::format("{}, {} x {}", reduce_op_name(op), n, dtype_name(dtype)),
                       [impl, tensor, n, dtype, op](std::uint64_t seq) {
                         impl->run_allreduce(tensor.raw_data(), n, dtype, op, seq);
                       });
}

std::shared_ptr<Work> GlooProcessGroup::allreduce_coalesced(std::vector<Tensor>& tensors,
                                                            ReduceOp op) {
  std::size_t total = 0;
  const DType dtype = tensors.empty() ? DType::kF32 : tensors.front().dtype();
  for (const Tensor& t : tensors) {
    require_cpu(t, "allreduce_coalesced", "input");
    if (t.dtype() != dtype) {
      fail("Gloo allreduce_coalesced: all tensors must have one dtype (got {} and {})",
           dtype_name(dtype), dtype_name(t.dtype()));
    }
    total += static_cast<std::size_t>(t.numel());
  }
  Impl* impl = impl_.get();
  return impl->enqueue({.kind = OpKind::kAllreduceCoalesced, .count = total, .dtype = dtype},
                       fmt::format("{}, {} tensors, {} x {}", reduce_op_name(op), tensors.size(),
                                   total, dtype_name(dtype)),
                       [impl, tensors, total, dtype, op](std::uint64_t seq) {
                         if (tensors.size() == 1) {
                           impl->run_allreduce(tensors[0].raw_data(), total, dtype, op, seq);
                           return;
                         }
                         // Gloo's list form reduces several buffers of equal length *into one
                         // result*; it is not a list of independent tensors. So: pack into the
                         // scratch buffer, one ring allreduce over the whole (one latency instead
                         // of one per tensor), unpack.
                         const std::size_t elem = dtype_size(dtype);
                         std::uint8_t* flat = impl->scratch_bytes(total * elem);
                         std::size_t offset = 0;
                         for (const Tensor& t : tensors) {
                           if (t.nbytes() > 0) std::memcpy(flat + offset, t.raw_data(), t.nbytes());
                           offset += t.nbytes();
                         }
                         impl->run_allreduce(flat, total, dtype, op, seq);
                         offset = 0;
                         for (const Tensor& t : tensors) {
                           if (t.nbytes() > 0) std::memcpy(t.raw_data(), flat + offset, t.nbytes());
                           offset += t.nbytes();
                         }
                       });
}

std::shared_ptr<Work> GlooProcessGroup::broadcast(Tensor& tensor, int root) {
  require_cpu(tensor, "broadcast", "input");
  if (root < 0 || root >= size()) {
    fail("Gloo broadcast: root {} is outside the group (size {})", root, size());
  }
  const std::size_t nbytes = tensor.nbytes();
  Impl* impl = impl_.get();
  return impl->enqueue(
      {.kind = OpKind::kBroadcast,
       .count = static_cast<std::uint64_t>(tensor.numel()),
       .dtype = tensor.dtype()},
      fmt::format("root {}, {} x {}", root, tensor.numel(), dtype_name(tensor.dtype())),
      [impl, tensor, nbytes, root](std::uint64_t seq) {
        if (nbytes == 0) return;
        // Bytes are bytes: broadcast moves them as uint8 whatever the dtype.
        auto opts = std::make_unique<gloo::BroadcastOptions>(impl->connection.context);
        opts->setOutput(static_cast<std::uint8_t*>(tensor.raw_data()), nbytes);
        opts->setRoot(root);
        opts->setTag(impl->tag(seq));
        opts->setTimeout(impl->options.timeout);
        impl->run_gloo(std::move(opts), [](gloo::BroadcastOptions& o) { gloo::broadcast(o); });
      });
}

std::shared_ptr<Work> GlooProcessGroup::allgather(const Tensor& input, Tensor& output) {
  require_cpu(input, "allgather", "input");
  require_cpu(output, "allgather", "output");
  if (input.dtype() != output.dtype() || output.numel() != input.numel() * size()) {
    fail(
        "Gloo allgather: the output must hold size() x input elements of the input's dtype "
        "({} x {} {}), got {} {}",
        size(), input.numel(), dtype_name(input.dtype()), output.numel(),
        dtype_name(output.dtype()));
  }
  const std::size_t in_bytes = input.nbytes();
  Impl* impl = impl_.get();
  return impl->enqueue(
      {.kind = OpKind::kAllgather,
       .count = static_cast<std::uint64_t>(input.numel()),
       .dtype = input.dtype()},
      fmt::format("{} x {} per rank", input.numel(), dtype_name(input.dtype())),
      [impl, input, output, in_bytes](std::uint64_t seq) {
        if (in_bytes == 0) return;
        auto opts = std::make_unique<gloo::AllgatherOptions>(impl->connection.context);
        opts->setInput(static_cast<std::uint8_t*>(input.raw_data()), in_bytes);
        opts->setOutput(static_cast<std::uint8_t*>(output.raw_data()),
                        in_bytes * static_cast<std::size_t>(impl->size));
        opts->setTag(impl->tag(seq));
        opts->setTimeout(impl->options.timeout);
        impl->run_gloo(std::move(opts), [](gloo::AllgatherOptions& o) { gloo::allgather(o); });
      });
}

std::shared_ptr<Work> GlooProcessGroup::reduce_scatter(const Tensor& input, Tensor& output,
                                                       ReduceOp op) {
  require_cpu(input, "reduce_scatter", "input");
  require_cpu(output, "reduce_scatter", "output");
  if (input.dtype() != output.dtype() || input.numel() != output.numel() * size()) {
    fail(
        "Gloo reduce_scatter: the input must hold size() x output elements of the output's "
        "dtype ({} x {} {}), got {} {}",
        size(), output.numel(), dtype_name(output.dtype()), input.numel(),
        dtype_name(input.dtype()));
  }
  const auto block = static_cast<std::size_t>(output.numel());
  const DType dtype = output.dtype();
  Impl* impl = impl_.get();
  return impl->enqueue(
      {.kind = OpKind::kReduceScatter, .count = block, .dtype = dtype},
      fmt::format("{}, {} x {} per rank", reduce_op_name(op), block, dtype_name(dtype)),
      [impl, input, output, block, dtype, op](std::uint64_t seq) {
        if (block == 0) return;
        // No options-style reduce-scatter in this Gloo: allreduce the whole input into the
        // reused scratch buffer (the input is left untouched) and keep our block. An average
        // is summed on the wire and only our block is divided, once.
        const std::size_t elem = dtype_size(dtype);
        const std::size_t total = block * static_cast<std::size_t>(impl->size);
        std::uint8_t* reduced = impl->scratch_bytes(total * elem);
        const ReduceOp wire_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
        impl->run_allreduce(reduced, total, dtype, wire_op, seq, input.raw_data());
        std::memcpy(output.raw_data(),
                    reduced + static_cast<std::size_t>(impl->rank) * block * elem, block * elem);
        if (op == ReduceOp::kAvg) divide_by(output.raw_data(), dtype, block, impl->size);
      });
}

std::shared_ptr<Work> GlooProcessGroup::barrier() {
  Impl* impl = impl_.get();
  return impl->enqueue({.kind = OpKind::kBarrier}, "", [impl](std::uint64_t seq) {
    auto opts = std::make_unique<gloo::BarrierOptions>(impl->connection.context);
    opts->setTag(impl->tag(seq));
    opts->setTimeout(impl->options.timeout);
    impl->run_gloo(std::move(opts), [](gloo::BarrierOptions& o) { gloo::barrier(o); });
  });
}

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size,
                                                      const ProcessGroupOptions& options) {
  return std::make_shared<GlooProcessGroup>(std::move(store), rank, size, options);
}

}  // namespace nanoddp::comm
