#include "benchmarks/sim/buckets.h"

#include <algorithm>
#include <cmath>

#include "benchmarks/sim/error.h"
#include "nanoddp/comm/bucket_assignment.h"

namespace nanoddp::sim {

std::int64_t cap_elements(double mb) {
  return comm::bucket_cap_elements(mb);
}

std::vector<SimBucket> cut_buckets(const std::vector<std::int64_t>& numels, double first_bucket_mb,
                                   double bucket_cap_mb) {
  // The flags named here; the rule itself is the Reducer's (comm/bucket_assignment.h).
  if (!(first_bucket_mb > 0) || !std::isfinite(first_bucket_mb)) {
    fail("--first-bucket-mb must be a positive number of MiB, got {}", first_bucket_mb);
  }
  if (!(bucket_cap_mb > 0) || !std::isfinite(bucket_cap_mb)) {
    fail("--bucket-cap-mb must be a positive number of MiB, got {}", bucket_cap_mb);
  }
  std::vector<SimBucket> buckets;
  for (const comm::BucketRange& r : comm::assign_buckets(numels, first_bucket_mb, bucket_cap_mb)) {
    buckets.push_back({.first = r.first, .count = r.count, .numel = r.numel});
  }
  return buckets;
}

}  // namespace nanoddp::sim
