#include "nanoddp/nn/prefetcher.h"

#include <algorithm>

#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/trace.h"

namespace nanoddp::nn {

BatchPrefetcher::BatchPrefetcher(Dataset& dataset, const BatchPrefetcherOptions& options)
    : dataset_(dataset), options_(options), worker_([this] { work(); }) {}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();  // a batch in flight finishes first: fill_batch is bounded work
}

void BatchPrefetcher::start(std::span<const std::int64_t> indices) {
  {
    std::lock_guard lock(mutex_);
    NANODDP_CHECK(!requested_,
                  "BatchPrefetcher::start() while a batch is in flight: take() it first");
    indices_.assign(indices.begin(), indices.end());
    requested_ = true;
    ready_ = false;
    error_ = nullptr;
  }
  wake_.notify_one();
}

bool BatchPrefetcher::in_flight() const {
  std::lock_guard lock(mutex_);
  return requested_;
}

std::int64_t BatchPrefetcher::take(float* x, float* y) {
  std::unique_lock lock(mutex_);
  NANODDP_CHECK(requested_, "BatchPrefetcher::take() without start()");
  if (!done_.wait_for(lock, options_.timeout, [this] { return ready_; })) {
    fail(
        "the data worker did not deliver a batch of {} samples within {} ms (set by "
        "NANODDP_TIMEOUT_S); the data set's fill_batch is stuck or the machine is overloaded",
        indices_.size(), options_.timeout.count());
  }
  requested_ = false;
  if (error_) std::rethrow_exception(error_);
  const auto rows = static_cast<std::int64_t>(indices_.size());
  std::copy(x_.begin(), x_.end(), x);
  std::copy(y_.begin(), y_.end(), y);
  return rows;
}

void BatchPrefetcher::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || (requested_ && !ready_); });
    if (stop_) return;
    // Fill outside the lock (take() may already be waiting); nothing else touches the buffers
    // or the indices until ready_ is set.
    const std::span<const std::int64_t> indices(indices_);
    lock.unlock();
    std::exception_ptr error;
    try {
      // On the data track, under the previous step's compute, which is the point. Not named
      // "data": that span marks the start of the step that uses the batch.
      TraceSpan span("prefetch data", TraceTrack::kData);
      const auto rows = static_cast<std::size_t>(indices.size());
      x_.resize(rows * static_cast<std::size_t>(dataset_.in_features()));
      y_.resize(rows * static_cast<std::size_t>(dataset_.out_features()));
      dataset_.fill_batch(indices, x_.data(), y_.data());
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    ready_ = true;
    done_.notify_all();
  }
}

}  // namespace nanoddp::nn
