#pragma once
// The Reducer's bucket rule (comm/reducer.cpp), reproduced without the Reducer: the
// gradients sit in one flat buffer in the order backward produces them (reverse registration
// order); walking it front to back, a parameter joins the open bucket, and the bucket closes as
// soon as it holds at least its cap -- `first_bucket_mb` for bucket 0, `bucket_cap_mb` for the
// others -- or when the parameters run out. So no parameter is ever split, and a parameter
// larger than the cap gets a bucket of its own. Caps count MiB of float32 (PyTorch's
// bucket_cap_mb), whatever the wire dtype.

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
