#include "nanoddp/nn/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "nanoddp/kernels/error.h"
#include "nanoddp/kernels/philox.h"

namespace nanoddp::nn {

Sampler::Sampler(SamplerOptions options) : options_(options) {
  const auto& o = options_;
  if (o.size <= 0) fail("Sampler: size must be positive, got {}", o.size);
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    fail("Sampler: rank {} is not in [0, world_size {}); check RANK and WORLD_SIZE", o.rank,
         o.world_size);
  }
  num_samples_ = o.drop_last ? o.size / o.world_size : (o.size + o.world_size - 1) / o.world_size;
  if (num_samples_ == 0) {
    fail(
        "Sampler: drop_last with {} samples and world size {} leaves no samples per rank; use "
        "fewer ranks or drop_last = false",
        o.size, o.world_size);
  }
  set_epoch(0);
}

void Sampler::set_epoch(std::int64_t epoch) {
  if (epoch < 0) fail("Sampler: epoch must be >= 0, got {}", epoch);
  epoch_ = epoch;
  const std::int64_t n = options_.size;
  order_.resize(static_cast<std::size_t>(n));
  std::iota(order_.begin(), order_.end(), std::int64_t{0});
  if (options_.shuffle) {
    // Fisher-Yates from the back: swap element i with a uniform j in [0, i]. Draw i uses Philox
    // counter (i, kShuffleStream + epoch) under key seed, so the order is a pure function of
    // (seed, epoch). j = r mod (i + 1) with a 64-bit r: the modulo bias is below (i+1) / 2^64,
    // far beneath anything measurable.
    const std::uint64_t stream = kShuffleStream + static_cast<std::uint64_t>(epoch);
    for (std::int64_t i = n - 1; i > 0; --i) {
      const kernels::Philox4 r =
          kernels::philox4x32_10(static_cast<std::uint64_t>(i), stream, options_.seed);
      const std::uint64_t bits = (static_cast<std::uint64_t>(r.v[0]) << 32) | r.v[1];
      const auto j = static_cast<std::int64_t>(bits % static_cast<std::uint64_t>(i + 1));
      std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
    }
  }
  const std::int64_t total = num_samples_ * options_.world_size;
  if (total <= n) {
    order_.resize(static_cast<std::size_t>(total));  // drop_last: drop the tail
  } else {
    // Pad by wrapping around (possibly several times when size < world_size).
    order_.reserve(static_cast<std::size_t>(total));
    for (std::int64_t i = n; i < total; ++i)
      order_.push_back(order_[static_cast<std::size_t>(i % n)]);
  }
}

std::int64_t Sampler::num_batches(std::int64_t batch_size) const {
  if (batch_size <= 0) fail("Sampler: batch size must be positive, got {}", batch_size);
  return (num_samples_ + batch_size - 1) / batch_size;
}

std::span<const std::int64_t> Sampler::batch(std::int64_t step_in_epoch,
                                             std::int64_t batch_size) const {
  const std::int64_t steps = num_batches(batch_size);
  if (step_in_epoch < 0 || step_in_epoch >= steps) {
    fail("Sampler: step {} is outside the epoch's {} batches of {} samples per rank", step_in_epoch,
         steps, batch_size);
  }
  const std::int64_t world = options_.world_size;
  // Global batch k covers order_[k*W*B, min((k+1)*W*B, total)); its length is a multiple of W
  // because total is, so it splits evenly into W contiguous per-rank slices.
  const std::int64_t global_begin = step_in_epoch * world * batch_size;
  const std::int64_t global_length =
      std::min(world * batch_size, static_cast<std::int64_t>(order_.size()) - global_begin);
  const std::int64_t length = global_length / world;
  return std::span<const std::int64_t>(order_).subspan(
      static_cast<std::size_t>(global_begin + options_.rank * length),
      static_cast<std::size_t>(length));
}

std::vector<std::int64_t> Sampler::indices(std::int64_t batch_size) const {
  std::vector<std::int64_t> result;
  result.reserve(static_cast<std::size_t>(num_samples_));
  const std::int64_t steps = num_batches(batch_size);
  for (std::int64_t step = 0; step < steps; ++step) {
    const auto b = batch(step, batch_size);
    result.insert(result.end(), b.begin(), b.end());
  }
  return result;
}

}  // namespace nanoddp::nn
