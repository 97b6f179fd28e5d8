// The worst of a test's errors, where NaN is worse than any number. std::max(worst, NaN) returns
// worst (NaN compares false), so a comparison loop built on it passes over a NaN result as if it
// were exact; and a check written `error > bound` is false for a NaN error too.
#pragma once

#include <cmath>
#include <limits>

namespace nanoddp::test {

inline double worse(double worst, double error) {
  if (std::isnan(worst) || std::isnan(error)) return std::numeric_limits<double>::quiet_NaN();
  return error > worst ? error : worst;
}

}  // namespace nanoddp::test
