#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "nanoddp/nn/sampler.h"
#include "nn/data_test_util.h"

namespace {

using nanoddp::nn::Sampler;
using nanoddp::nn::SamplerOptions;
using nanoddp::nn::testing::error_message;

std::vector<std::int64_t> to_vector(std::span<const std::int64_t> s) {
  return {s.begin(), s.end()};
}

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), std::int64_t{0});
  return v;
}

}  // namespace

TEST_CASE("sampler: without shuffling, world size 1 is the identity") {
  Sampler s({.size = 10, .shuffle = false});
  CHECK(s.num_samples() == 10);
  CHECK(s.indices(3) == iota(10));
  CHECK(s.num_batches(3) == 4);
  CHECK(to_vector(s.batch(0, 3)) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(to_vector(s.batch(3, 3)) == std::vector<std::int64_t>{9});
  s.set_epoch(5);
  CHECK(s.indices(4) == iota(10));
}

TEST_CASE("sampler: shuffling is a permutation, a pure function of (seed, epoch)") {
  Sampler a({.size = 1000, .seed = 11});
  Sampler b({.size = 1000, .seed = 11});
  Sampler other_seed({.size = 1000, .seed = 12});
  const auto e0 = a.indices(32);
  CHECK(e0 != iota(1000));
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota(1000));
  CHECK(b.indices(32) == e0);
  CHECK(other_seed.indices(32) != e0);
  a.set_epoch(1);
  const auto e1 = a.indices(32);
  CHECK(e1 != e0);  // reshuffled per epoch
  a.set_epoch(0);
  CHECK(a.indices(32) == e0);  // and reproducible
  // Roughly uniform: element 0's position over many seeds spreads over the whole range.
  std::vector<int> first_half(2, 0);
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    Sampler s({.size = 10, .seed = seed});
    const auto order = s.indices(10);
    const auto pos = std::find(order.begin(), order.end(), 0) - order.begin();
    ++first_half[pos < 5 ? 0 : 1];
  }
  CHECK(first_half[0] > 150);
  CHECK(first_half[1] > 150);
}

TEST_CASE("sampler: ranks get disjoint, equal shares that cover the data") {
  for (const std::int64_t size : {1, 5, 10, 17, 100, 101}) {
    for (const int world : {1, 2, 3, 4, 7}) {
      for (const bool drop_last : {false, true}) {
        if (drop_last && size < world) continue;
        for (const std::int64_t batch : {1, 2, 5, 64}) {
          CAPTURE(size);
          CAPTURE(world);
          CAPTURE(drop_last);
          CAPTURE(batch);
          std::vector<Sampler> ranks;
          for (int r = 0; r < world; ++r) {
            ranks.emplace_back(SamplerOptions{.size = size,
                                              .shuffle = true,
                                              .seed = 3,
                                              .rank = r,
                                              .world_size = world,
                                              .drop_last = drop_last});
            ranks.back().set_epoch(2);
          }
          const std::int64_t per_rank = drop_last ? size / world : (size + world - 1) / world;
          std::multiset<std::int64_t> all;
          for (int r = 0; r < world; ++r) {
            const auto mine = ranks[static_cast<std::size_t>(r)].indices(batch);
            CHECK(static_cast<std::int64_t>(mine.size()) == per_rank);
            CHECK(ranks[static_cast<std::size_t>(r)].num_samples() == per_rank);
            all.insert(mine.begin(), mine.end());
            // The same number of batches, each of the same length, on every rank.
            CHECK(ranks[static_cast<std::size_t>(r)].num_batches(batch) ==
                  ranks[0].num_batches(batch));
            for (std::int64_t k = 0; k < ranks[0].num_batches(batch); ++k) {
              CHECK(ranks[static_cast<std::size_t>(r)].batch(k, batch).size() ==
                    ranks[0].batch(k, batch).size());
            }
          }
          // Together the ranks see exactly the padded (or truncated) global order.
          const auto order = ranks[0].global_order();
          CHECK(all == std::multiset<std::int64_t>(order.begin(), order.end()));
          const std::set<std::int64_t> distinct(all.begin(), all.end());
          if (drop_last) {
            CHECK(distinct.size() == all.size());  // disjoint
            CHECK(static_cast<std::int64_t>(all.size()) == size / world * world);
          } else {
            CHECK(static_cast<std::int64_t>(distinct.size()) == size);  // covers everything
            // Duplicates only from the wrap-around padding.
            CHECK(static_cast<std::int64_t>(all.size()) - size < world);
          }
        }
      }
    }
  }
}

TEST_CASE(
    "sampler: W ranks with batch B see the world-size-1 run's batches of W*B, split "
    "contiguously") {
  for (const std::int64_t size : {96, 100, 1000}) {
    for (const int world : {2, 3, 4}) {
      for (const std::int64_t batch : {1, 4, 7}) {
        CAPTURE(size);
        CAPTURE(world);
        CAPTURE(batch);
        Sampler single({.size = size, .shuffle = true, .seed = 5});
        std::vector<Sampler> ranks;
        for (int r = 0; r < world; ++r) {
          ranks.emplace_back(SamplerOptions{
              .size = size, .shuffle = true, .seed = 5, .rank = r, .world_size = world});
        }
        for (const std::int64_t epoch : {0, 3}) {
          single.set_epoch(epoch);
          for (auto& s : ranks) s.set_epoch(epoch);
          const std::int64_t global = world * batch;
          const std::int64_t full = size / global;  // full global batches
          for (std::int64_t k = 0; k < full; ++k) {
            const auto whole = single.batch(k, global);
            REQUIRE(static_cast<std::int64_t>(whole.size()) == global);
            for (int r = 0; r < world; ++r) {
              CHECK(to_vector(ranks[static_cast<std::size_t>(r)].batch(k, batch)) ==
                    to_vector(whole.subspan(static_cast<std::size_t>(r * batch),
                                            static_cast<std::size_t>(batch))));
            }
          }
          if (size % world == 0) {
            // No padding: the last, partial global batch also matches, split evenly.
            CHECK(ranks[0].num_batches(batch) == single.num_batches(global));
            const std::int64_t last = single.num_batches(global) - 1;
            const auto whole = single.batch(last, global);
            const auto share =
                static_cast<std::size_t>(whole.size()) / static_cast<std::size_t>(world);
            for (int r = 0; r < world; ++r) {
              CHECK(to_vector(ranks[static_cast<std::size_t>(r)].batch(last, batch)) ==
                    to_vector(whole.subspan(static_cast<std::size_t>(r) * share, share)));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sampler: with batch 1 the split is PyTorch DistributedSampler's round-robin") {
  const int world = 3;
  Sampler single({.size = 20, .seed = 9});
  const auto order = single.indices(1);
  // PyTorch pads the order by wrapping: [o0..o19, o0], then rank r takes every W-th from r.
  std::vector<std::int64_t> padded = order;
  padded.push_back(order[0]);
  for (int r = 0; r < world; ++r) {
    Sampler s({.size = 20, .seed = 9, .rank = r, .world_size = world});
    std::vector<std::int64_t> expected;
    for (std::size_t i = static_cast<std::size_t>(r); i < padded.size(); i += world) {
      expected.push_back(padded[i]);
    }
    CHECK(s.indices(1) == expected);
  }
}

TEST_CASE("sampler: bad options and steps are refused") {
  error_message([] { Sampler({.size = 10, .rank = 2, .world_size = 2}); },
                {"rank 2", "world_size 2"});
  error_message([] { Sampler({.size = 0}); }, {"size"});
  error_message([] { Sampler({.size = 3, .world_size = 4, .drop_last = true}); },
                {"drop_last", "no samples"});
  Sampler s({.size = 10});
  error_message([&] { (void)s.batch(4, 3); }, {"step 4", "4 batches"});
  error_message([&] { (void)s.num_batches(0); }, {"batch size"});
  error_message([&] { s.set_epoch(-1); }, {"epoch"});
}
