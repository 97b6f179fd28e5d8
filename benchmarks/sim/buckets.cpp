#include "benchmarks/sim/buckets.h"

#include <algorithm>
#include <cmath>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

std::int64_t cap_elements(double mb) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(mb * 1024.0 * 1024.0 / 4.0));
}

std::vector<SimBucket> cut_buckets(const std::vector<std::int64_t>& numels, double first_bucket_mb,
                                   double bucket_cap_mb) {
  if (!(first_bucket_mb > 0) || !std::isfinite(first_bucket_mb)) {
    fail("--first-bucket-mb must be a positive number of MiB, got {}", first_bucket_mb);
  }
  if (!(bucket_cap_mb > 0) || !std::isfinite(bucket_cap_mb)) {
    fail("--bucket-cap-mb must be a positive number of MiB, got {}", bucket_cap_mb);
  }
  std::vector<SimBucket> buckets;
  SimBucket current;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    if (current.count == 0) current.first = i;
    ++current.count;
    current.numel += numels[i];
    const double cap_mb = buckets.empty() ? first_bucket_mb : bucket_cap_mb;
    if (current.numel >= cap_elements(cap_mb) || i + 1 == numels.size()) {
      buckets.push_back(current);
      current = SimBucket{};
    }
  }
  return buckets;
}

}  // namespace nanoddp::sim
