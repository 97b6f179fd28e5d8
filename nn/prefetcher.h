#pragma once
// Prepares the next batch on a background thread while the current step computes: PyTorch's
// DataLoader with one worker, for nanoddp's data sets.
//
// Why: a batch of the synthetic data set is Philox draws and a teacher network's forward pass
// (1.7 ms for 64 x 1024 on the dev VM); a training step that waits for it is that much slower.
// A step only needs its batch when it starts, and the data set is addressed by sample index,
// so the batch after it can be filled meanwhile, on another core. Where there is no idle core
// (as many busy ranks as cores) the worker competes with the step instead: measure first.
//
//   BatchPrefetcher prefetch(dataset, {.timeout = 300s});
//   prefetch.start(indices_of_batch(0));
//   for (k = 0; ...) {
//     prefetch.take(x, y);                              // waits for batch k, copies it out
//     if (k + 1 < n) prefetch.start(indices_of_batch(k + 1));
//     ... forward/backward on x, y while batch k + 1 is being filled ...
//   }
//
// One batch is in flight at a time, filled into the prefetcher's own buffers and copied out by
// take() (a memcpy: tens of microseconds). The data set is used by the worker only, so its
// fill_batch need not be thread-safe; the caller must not use the data set while a batch is
// in flight. An error in fill_batch (a bad index) is rethrown by take().

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "nanoddp/nn/dataset.h"

namespace nanoddp::nn {

struct BatchPrefetcherOptions {
  // take() fails after waiting this long for one batch (a batch that takes minutes is a bug or
  // a machine in trouble, not something to wait for forever).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

class BatchPrefetcher {
 public:
  BatchPrefetcher(Dataset& dataset, const BatchPrefetcherOptions& options);
  ~BatchPrefetcher();  // waits for a batch in flight, then stops the worker
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Starts filling the batch of these samples in the background. One batch at a time: take()
  // the previous one first.
  void start(std::span<const std::int64_t> indices);
  bool in_flight() const;
  // Waits for the started batch and copies it into x (rows x in_features) and y (rows x
  // out_features), rows = the number of indices given to start(). Returns rows.
  std::int64_t take(float* x, float* y);

 private:
  void work();

  Dataset& dataset_;
  BatchPrefetcherOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the worker waits here for a batch or for stop
  std::condition_variable done_;  // take() waits here for the worker
  std::vector<std::int64_t> indices_;
  std::vector<float> x_, y_;
  bool requested_ = false;  // start() was called and take() has not yet collected
  bool ready_ = false;      // the worker has filled the buffers (or failed)
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace nanoddp::nn
