#include "benchmarks/sim/stats.h"

#include <algorithm>
#include <cmath>

#include "benchmarks/sim/error.h"
#include "common/stats.h"

namespace nanoddp::sim {

double median(std::vector<double> values) {
  if (values.empty()) fail("median of no values");
  return common::median(std::move(values));
}

Line fit_line_relative(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) fail("fit: {} x values for {} y values", x.size(), y.size());
  // Weighted normal equations: minimise sum w (a + b x - y)^2 with w = 1/y^2.
  double sw = 0, swx = 0, swy = 0, swxx = 0, swxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(y[i] > 0)) fail("fit: a measured time is not positive ({})", y[i]);
    const double w = 1.0 / (y[i] * y[i]);
    sw += w;
    swx += w * x[i];
    swy += w * y[i];
    swxx += w * x[i] * x[i];
    swxy += w * x[i] * y[i];
  }
  const double det = sw * swxx - swx * swx;
  if (x.size() < 2 || !(std::fabs(det) > 1e-12 * sw * swxx)) {
    fail(
        "the {} measurement(s) determine no line: they need two or more different sizes, with "
        "times of one scale (a time of 1e300 us weighs nothing beside one of 10)",
        x.size());
  }
  Line line;
  line.slope = (sw * swxy - swx * swy) / det;
  line.intercept = (swy - line.slope * swx) / sw;
  return line;
}

Line fit_line_relative_through_origin(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.empty())
    fail("fit: {} x values for {} y values", x.size(), y.size());
  // Minimise sum ((b x - y) / y)^2 = sum (b r - 1)^2 with r = x / y: b = sum r / sum r^2.
  double sr = 0, srr = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(y[i] > 0)) fail("fit: a measured time is not positive ({})", y[i]);
    const double r = x[i] / y[i];
    sr += r;
    srr += r * r;
  }
  if (!(srr > 0)) fail("fit: the sizes are all 0");
  return {.intercept = 0, .slope = sr / srr};
}

}  // namespace nanoddp::sim
