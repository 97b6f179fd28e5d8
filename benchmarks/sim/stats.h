#pragma once
// Small statistics the simulator needs: medians of measured samples, and the least-squares line
// through them.

#include <vector>

namespace nanoddp::sim {

// The median (mean of the middle two for an even count). Throws SimError when empty.
double median(std::vector<double> values);

struct Line {
  double intercept = 0;
  double slope = 0;
};
// Least squares of y = intercept + slope * x, each point weighted by 1/y^2: it minimises the
// relative error, so small messages (microseconds) count as much as large ones (milliseconds).
// Throws SimError with fewer than two distinct x.
Line fit_line_relative(const std::vector<double>& x, const std::vector<double>& y);
// The same least squares with the intercept held at 0: y = slope * x.
Line fit_line_relative_through_origin(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace nanoddp::sim
