#pragma once
// The order statistics every benchmark reports, defined once: the median of an even count is the
// mean of the middle two, and quantiles interpolate linearly between order statistics (numpy's
// default), so nanoddp's tables and a numpy re-analysis of the same samples agree.

#include <cstddef>
#include <vector>

namespace nanoddp::common {

// The q-quantile (q in 0..1). Empty: 0.
double quantile(std::vector<double> values, double q);

// quantile(values, 0.5). Empty: 0.
double median(std::vector<double> values);

// How a set of timings spreads, as every benchmark reports it: median, min, p10, p90, max
// (quantile's definitions). Empty: all 0.
struct Spread {
  double median = 0, min = 0, p10 = 0, p90 = 0, max = 0;
};
Spread spread(const std::vector<double>& values);

// A percentile-bootstrap confidence interval for the median: `resamples` resamples with
// replacement, the (1-level)/2 and (1+level)/2 quantiles of their medians. A fixed seed, so a
// table printed twice from the same samples reads the same. Empty: {0, 0}; one sample: {x, x}.
struct Interval {
  double lo = 0, hi = 0;
};
Interval bootstrap_median_ci(const std::vector<double>& values, double level = 0.95,
                             int resamples = 2000, unsigned seed = 12345);

// The fewest values whose bootstrap_median_ci at `level` can be narrower than their range. With
// fewer, a resample's median is the smallest value (and, alike, the largest) more often than the
// interval's tail, (1 - level) / 2, so the interval is exactly [min, max] of distinct values: it
// reads as a confidence interval but is only the range. Computed, not tabled: 6 at 0.95 (with 5,
// the median of 5 draws is the smallest value 5.8 % of the time).
std::size_t min_values_for_median_ci(double level = 0.95);

}  // namespace nanoddp::common
