#include "nanoddp/comm/bucket_assignment.h"

#include <algorithm>
#include <cmath>

#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

std::int64_t bucket_cap_elements(double mb) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(mb * 1024.0 * 1024.0 / 4.0));
}

std::vector<BucketRange> assign_buckets(std::span<const std::int64_t> numels,
                                        double first_bucket_mb, double bucket_cap_mb) {
  if (!(first_bucket_mb > 0) || !std::isfinite(first_bucket_mb) || !(bucket_cap_mb > 0) ||
      !std::isfinite(bucket_cap_mb)) {
    fail("bucket caps must be positive numbers of MiB (got first_bucket_mb={}, bucket_cap_mb={})",
         first_bucket_mb, bucket_cap_mb);
  }
  std::vector<BucketRange> buckets;
  BucketRange current;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    if (current.count == 0) current.first = i;
    ++current.count;
    current.numel += numels[i];
    const double cap_mb = buckets.empty() ? first_bucket_mb : bucket_cap_mb;
    if (current.numel >= bucket_cap_elements(cap_mb) || i + 1 == numels.size()) {
      buckets.push_back(current);
      current = BucketRange{};
    }
  }
  return buckets;
}

}  // namespace nanoddp::comm
