// The background batch worker (nn/prefetcher.h): it hands over exactly what the data set fills,
// passes the data set's errors on, refuses misuse, and never waits forever.

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/dataset.h"
#include "nanoddp/nn/prefetcher.h"

namespace nanoddp::nn {
namespace {

SyntheticRegression small_set() {
  return SyntheticRegression({.in_features = 7, .out_features = 3, .size = 500, .seed = 4});
}

// A data set whose batches take `delay` each: for the timeout.
class SlowDataset final : public Dataset {
 public:
  explicit SlowDataset(std::chrono::milliseconds delay) : delay_(delay) {}
  std::int64_t size() const override { return 10; }
  std::int64_t in_features() const override { return 1; }
  std::int64_t out_features() const override { return 1; }
  void fill_batch(std::span<const std::int64_t> indices, float* x, float* y) override {
    std::this_thread::sleep_for(delay_);
    for (std::size_t k = 0; k < indices.size(); ++k) x[k] = y[k] = static_cast<float>(indices[k]);
  }

 private:
  std::chrono::milliseconds delay_;
};

}  // namespace

TEST_CASE("prefetcher: each batch is what the data set fills, batch after batch") {
  SyntheticRegression worker_set = small_set(), reference = small_set();
  BatchPrefetcher prefetch(worker_set, {});
  // Batches of different sizes (an epoch's last batch is shorter), indices in any order.
  const std::vector<std::vector<std::int64_t>> batches = {
      {0, 1, 2, 3}, {499, 17, 250, 3, 3}, {42}, {5, 6, 7, 8, 9, 10, 11, 12}};
  prefetch.start(batches[0]);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    CAPTURE(b);
    const auto rows = static_cast<std::int64_t>(batches[b].size());
    std::vector<float> x(static_cast<std::size_t>(rows * 7), -1.0f), y(rows * 3, -1.0f);
    CHECK(prefetch.in_flight());
    CHECK(prefetch.take(x.data(), y.data()) == rows);
    CHECK_FALSE(prefetch.in_flight());
    if (b + 1 < batches.size()) prefetch.start(batches[b + 1]);  // fills while we compare
    std::vector<float> want_x(x.size()), want_y(y.size());
    reference.fill_batch(batches[b], want_x.data(), want_y.data());
    CHECK(x == want_x);
    CHECK(y == want_y);
  }
}

TEST_CASE("prefetcher: a data set's error comes out of take(), and the next batch works") {
  SyntheticRegression set = small_set();
  BatchPrefetcher prefetch(set, {});
  const std::vector<std::int64_t> bad = {1, 2, 500};  // 500 is outside [0, 500)
  prefetch.start(bad);
  std::vector<float> x(3 * 7), y(3 * 3);
  CHECK_THROWS_WITH_AS(prefetch.take(x.data(), y.data()), doctest::Contains("sample index 500"),
                       Error);
  const std::vector<std::int64_t> good = {1, 2, 3};
  prefetch.start(good);
  CHECK(prefetch.take(x.data(), y.data()) == 3);
}

TEST_CASE("prefetcher: misuse is an Error") {
  SyntheticRegression set = small_set();
  BatchPrefetcher prefetch(set, {});
  std::vector<float> x(7), y(3);
  CHECK_THROWS_AS(prefetch.take(x.data(), y.data()), Error);  // nothing started
  const std::vector<std::int64_t> one = {0};
  prefetch.start(one);
  CHECK_THROWS_AS(prefetch.start(one), Error);  // one batch at a time
  CHECK(prefetch.take(x.data(), y.data()) == 1);
}

TEST_CASE("prefetcher: a batch that does not come within the timeout is an Error, not a hang") {
  SlowDataset slow(std::chrono::milliseconds(400));
  const auto begin = std::chrono::steady_clock::now();
  {
    BatchPrefetcher prefetch(slow, {.timeout = std::chrono::milliseconds(50)});
    const std::vector<std::int64_t> indices = {1, 2};
    prefetch.start(indices);
    std::vector<float> x(2), y(2);
    CHECK_THROWS_WITH_AS(prefetch.take(x.data(), y.data()), doctest::Contains("did not deliver"),
                         Error);
    // The destructor waits for the batch in flight (bounded work), then stops the worker.
  }
  const double waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  CHECK(waited_s < 5.0);
}

}  // namespace nanoddp::nn
