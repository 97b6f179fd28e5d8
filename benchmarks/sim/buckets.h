#pragma once
// The simulator's buckets: the Reducer's own rule (comm/bucket_assignment.h, one function for
// both), with the simulator's flag names in its errors.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace nanoddp::sim {

struct SimBucket {
  std::size_t first = 0;   // index of its first parameter in layout (= production) order
  std::size_t count = 0;   // parameters in it
  std::int64_t numel = 0;  // elements
};

// The cap in elements, as the Reducer computes it: max(1, floor(mb * 2^20 / 4)).
std::int64_t cap_elements(double mb);

// `numels` in layout order. Throws SimError for non-positive caps (as the Reducer does).
std::vector<SimBucket> cut_buckets(const std::vector<std::int64_t>& numels, double first_bucket_mb,
                                   double bucket_cap_mb);

}  // namespace nanoddp::sim
