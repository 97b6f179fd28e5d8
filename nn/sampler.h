#pragma once
// Which samples each rank trains on, epoch by epoch.
//
// Each epoch has one global order P of the indices [0, size): a permutation (shuffle) or the
// identity, the same on every rank because it is a pure function of (seed, epoch). Like
// PyTorch's DistributedSampler, P is padded by wrapping around (or its tail dropped, drop_last)
// to a multiple of world_size so every rank gets the same number of samples and therefore runs
// the same number of steps (a rank with one step fewer would leave the others waiting forever in
// an all-reduce).
//
// Unlike DistributedSampler, which deals indices round-robin (rank r gets P[r], P[r+W], ...),
// the split here is "strided by batch": P is cut into global batches of W*B, and each global
// batch is split contiguously, rank r taking the slice [r*B, (r+1)*B). So with world size W and
// per-rank batch B, rank r's k-th batch is exactly rows [r*B, (r+1)*B) of the k-th batch of a
// world-size-1 run with batch W*B: the W ranks together see, step by step, the same samples as
// the single process, and since the gradient all-reduce averages, the training run matches the
// single-process run (up to floating-point summation order). That is the property that makes
// "DDP = big-batch SGD" testable. (It holds for every full global batch; when size is not a
// multiple of W*B the last, partial global batch has (padded size mod W*B) / W samples per
// rank, split the same contiguous way.)
//
// A consequence: which samples a rank sees depends on B, so indices() takes the batch size.

#include <cstdint>
#include <span>
#include <vector>

namespace nanoddp::nn {

struct SamplerOptions {
  std::int64_t size = 0;  // number of samples in the data set
  bool shuffle = true;
  std::uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  // false: pad by repeating indices from the start of the epoch's order up to a multiple of
  // world_size. true: drop the last size % world_size indices of the order instead.
  bool drop_last = false;
};

class Sampler {
 public:
  // Philox stream (counter_hi) of the shuffle is kShuffleStream + epoch; the key is the seed.
  static constexpr std::uint64_t kShuffleStream = 0x5A3B'0000'0000'0000ull;

  explicit Sampler(SamplerOptions options);

  // Builds the epoch's order (a Fisher-Yates shuffle keyed by (seed, epoch) when shuffling).
  // Call it at the start of every epoch, with the same value on every rank.
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const { return epoch_; }
  const SamplerOptions& options() const { return options_; }

  // Samples per rank per epoch: ceil(size / W), or floor(size / W) with drop_last.
  std::int64_t num_samples() const { return num_samples_; }
  // Batches per rank per epoch: ceil(num_samples() / batch_size); the same on every rank, and
  // the i-th batch has the same length on every rank.
  std::int64_t num_batches(std::int64_t batch_size) const;
  // This rank's batch `step_in_epoch` (0-based) of at most `batch_size` samples. The span points
  // into the sampler and stays valid until the next set_epoch.
  std::span<const std::int64_t> batch(std::int64_t step_in_epoch, std::int64_t batch_size) const;
  // This rank's samples for the epoch in the order its batches of `batch_size` visit them.
  std::vector<std::int64_t> indices(std::int64_t batch_size) const;
  // The epoch's padded global order (length num_samples() * world_size), the same on all ranks.
  std::span<const std::int64_t> global_order() const { return order_; }

 private:
  SamplerOptions options_;
  std::int64_t num_samples_ = 0;
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace nanoddp::nn
