// The bucket rule shared by the Reducer and nanoddp-sim (comm/bucket_assignment.h).

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "nanoddp/comm/bucket_assignment.h"
#include "nanoddp/kernels/error.h"

using nanoddp::comm::assign_buckets;
using nanoddp::comm::bucket_cap_elements;

TEST_CASE("bucket assignment: first cap, then the cap, never split, a big one alone") {
  // Caps of 256 and 512 floats (1 KiB and 2 KiB).
  const std::vector<std::int64_t> numels{100, 200, 100, 300, 600, 5};
  const auto b = assign_buckets(numels, 1.0 / 1024, 2.0 / 1024);
  REQUIRE(b.size() == 3);
  CHECK((b[0].first == 0 && b[0].count == 2 && b[0].numel == 300));  // closes at >= 256
  // 100 + 300 = 400 < 512 goes on; + 600 = 1000 >= 512 closes it (a bucket holds at least its
  // cap, PyTorch's rule too). (This test never ran before: its name held a ';', which ctest
  // cannot select, and its old expectations here were wrong.)
  CHECK((b[1].first == 2 && b[1].count == 3 && b[1].numel == 1000));
  CHECK((b[2].first == 5 && b[2].count == 1 && b[2].numel == 5));  // the rest, closed by the end
  const auto alone =
      assign_buckets(std::vector<std::int64_t>{10, 5000, 10}, 1.0 / 1024, 1.0 / 1024);
  REQUIRE(alone.size() == 2);
  CHECK(alone[0].numel == 5010);  // the big one closes bucket 0
  CHECK(alone[1].numel == 10);    // the rest, closed by the end
  CHECK(assign_buckets(std::vector<std::int64_t>{}, 1, 25).empty());
}

TEST_CASE("bucket assignment: caps count MiB of float32, at least one element, bad caps refused") {
  CHECK(bucket_cap_elements(25.0) == 25 * 1024 * 1024 / 4);
  CHECK(bucket_cap_elements(1e-12) == 1);
  const std::vector<std::int64_t> one{1};
  CHECK_THROWS_AS(assign_buckets(one, 0.0, 25.0), nanoddp::Error);
  CHECK_THROWS_AS(assign_buckets(one, 1.0, -1.0), nanoddp::Error);
  CHECK_THROWS_AS(assign_buckets(one, 1.0, std::numeric_limits<double>::quiet_NaN()),
                  nanoddp::Error);
  CHECK_THROWS_AS(assign_buckets(one, std::numeric_limits<double>::infinity(), 1.0),
                  nanoddp::Error);
}
