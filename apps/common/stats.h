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

}  // namespace nanoddp::common
