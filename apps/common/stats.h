#pragma once
// The order statistics every benchmark reports, defined once: the median of an even count is the
// mean of the middle two, and quantiles interpolate linearly between order statistics (numpy's
// default), so nanoddp's tables and a numpy re-analysis of the same samples agree.

#include <vector>

namespace nanoddp::common {

// The q-quantile (q in 0..1). Empty: 0.
double quantile(std::vector<double> values, double q);

// quantile(values, 0.5). Empty: 0.
double median(std::vector<double> values);

// A percentile-bootstrap confidence interval for the median: `resamples` resamples with
// replacement, the (1-level)/2 and (1+level)/2 quantiles of their medians. A fixed seed, so a
// table printed twice from the same samples reads the same. Empty: {0, 0}; one sample: {x, x}.
struct Interval {
  double lo = 0, hi = 0;
};
Interval bootstrap_median_ci(const std::vector<double>& values, double level = 0.95,
                             int resamples = 2000, unsigned seed = 12345);

}  // namespace nanoddp::common
