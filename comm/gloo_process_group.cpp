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

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>

#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/gloo_group_impl.h"
#include "nanoddp/comm/gloo_helpers.h"
#include "nanoddp/comm/reduce_ops.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {
namespace {

void require_cpu(const Tensor& t, const char* op, const char* role) {
  if (!t.defined()) fail("Gloo {}: the {} tensor is undefined", op, role);
  if (!t.device().is_cpu()) {
    fail(
        "Gloo runs on CPU tensors; use the NCCL backend for cuda (Gloo {}: the {} tensor is on "
        "{})",
        op, role, t.device().str());
  }
  // (int64 tensors exist for class indices; every reduction here reads float32 or bfloat16.)
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) {
    fail("Gloo {}: the {} tensor is {}; collectives carry float32 and bfloat16 tensors", op, role,
         dtype_name(t.dtype()));
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
}  // namespace

// ---- the group ----------------------------------------------------------------------------

std::shared_ptr<Work> GlooProcessGroup::Impl::enqueue(OpRecord record, const std::string& detail,
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

void GlooProcessGroup::Impl::worker_loop() {
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
        error = explain_shm(job.description, e);
      } catch (const TcpRingError& e) {
        error = explain_ring(job.description, job.work->sequence_number(), e);
      } catch (const HierarchicalError& e) {
        error = fmt::format("Gloo {} failed on rank {} of {} (hierarchical): {}", job.description,
                            rank, size, e.what());
      } catch (const std::exception& e) {
        error = explain(job.description, job.work->sequence_number(), e.what());
      }
      // Later ops fail fast and carry the first failure whole: a caller that waits only on a
      // later op (a benchmark's last) still learns why (an outside tester's).
      if (error) first_failure = *error;
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

// ---- the Gloo calls (worker thread) ----

void GlooProcessGroup::Impl::run_allreduce(void* data, std::size_t n, DType dtype, ReduceOp op,
                                           std::uint64_t seq, const void* input) {
  if (n == 0) return;
  if (hier != nullptr && hier->enabled()) {
    hier->run(data, input, n, dtype, op, seq);  // divides once itself for avg
    return;
  }
  if (shm != nullptr && shm->enabled()) {
    shm->run(data, input, n, dtype, op, seq);  // divides once itself for avg
    return;
  }
  if (ring != nullptr && ring->enabled()) {
    ring->allreduce(data, input, n, dtype, op, seq);
    if (op == ReduceOp::kAvg) divide_by(data, dtype, n, size);
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
  opts->setReduceFunction(gloo_reduce_function(op, dtype));
  opts->setTag(tag(seq));
  opts->setTimeout(options.timeout);
  run_gloo(std::move(opts), [](gloo::AllreduceOptions& o) { gloo::allreduce(o); });
  if (op == ReduceOp::kAvg) divide_by(data, dtype, n, size);
}

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
  // After the TCP connection (which carries every op that neither nanoddp's TCP ring nor shared
  // memory does, and is the fallback): all ranks agree here whether allreduce goes hierarchical
  // (several hosts), else whether they can share memory (one host).
  impl_->hier = std::make_unique<HierarchicalAllreduce>(store, rank, size, options);
  if (!impl_->hier->enabled()) {
    impl_->shm = std::make_unique<ShmAllreduce>(*store, rank, size, options.timeout, options.name);
  }
  if (size > 1 && !impl_->hier->enabled() && !impl_->shm->enabled()) {
    impl_->ring = std::make_unique<TcpRing>(*store, rank, size, options.timeout, options.name,
                                            own_ip(impl_->connection, rank));
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

bool GlooProcessGroup::uses_tcp_ring() const {
  return impl_->ring != nullptr && impl_->ring->enabled();
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
  if (impl_->ring != nullptr && impl_->ring->enabled()) {
    return fmt::format("TCP ring ({}; {}{})", impl_->connection.device_description,
                       impl_->ring->describe(), why);
  }
  if (impl_->ring != nullptr && size() > 1) why += "; " + impl_->ring->fallback_reason();
  return fmt::format("Gloo's TCP ring ({}{})", impl_->connection.device_description, why);
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
        if (impl->ring != nullptr && impl->ring->enabled()) {
          // Even of nothing: the ring checks that every rank runs this op, from this root.
          impl->ring->broadcast(tensor.raw_data(), static_cast<std::size_t>(tensor.numel()),
                                tensor.dtype(), root, seq);
          return;
        }
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
  const auto block = static_cast<std::size_t>(input.numel());
  const DType dtype = input.dtype();
  Impl* impl = impl_.get();
  return impl->enqueue({.kind = OpKind::kAllgather,
                        .count = static_cast<std::uint64_t>(input.numel()),
                        .dtype = input.dtype()},
                       fmt::format("{} x {} per rank", input.numel(), dtype_name(input.dtype())),
                       [impl, input, output, block, dtype](std::uint64_t seq) {
                         impl->run_allgather(input.raw_data(), output.raw_data(), block, dtype,
                                             seq);
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
        impl->run_reduce_scatter(input.raw_data(), output.raw_data(), block, dtype, op, seq);
      });
}

std::shared_ptr<Work> GlooProcessGroup::barrier() {
  Impl* impl = impl_.get();
  return impl->enqueue({.kind = OpKind::kBarrier}, "", [impl](std::uint64_t seq) {
    if (impl->ring != nullptr && impl->ring->enabled()) {
      impl->ring->barrier(seq);
      return;
    }
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
