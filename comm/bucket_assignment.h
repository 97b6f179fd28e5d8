#pragma once
// Which parameters share a bucket: the one rule, used by the Reducer and by nanoddp-sim.
//
// The gradients sit in one flat buffer in the order backward produces them (reverse
// registration order, nn/flat_parameters.h). Walking it front to back, a parameter joins the
// open bucket, and the bucket closes as soon as it holds at least its cap -- `first_bucket_mb`
// for bucket 0, `bucket_cap_mb` for the others -- or when the parameters run out. So no
// parameter is ever split, and a parameter larger than the cap gets a bucket of its own. Caps
// count MiB of float32 (PyTorch's bucket_cap_mb), whatever the wire dtype.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace nanoddp::comm {

struct BucketRange {
  std::size_t first = 0;   // index of its first parameter, in layout order
  std::size_t count = 0;   // parameters in it
  std::int64_t numel = 0;  // elements
};

// A cap in elements: max(1, floor(mb * 2^20 / 4)).
std::int64_t bucket_cap_elements(double mb);

// `numels` in layout order. Caps must be positive and finite (an Error otherwise).
std::vector<BucketRange> assign_buckets(std::span<const std::int64_t> numels,
                                        double first_bucket_mb, double bucket_cap_mb);

}  // namespace nanoddp::comm
