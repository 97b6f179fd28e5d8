#include "common/stats.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace nanoddp::common {

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

double median(std::vector<double> values) {
  return quantile(std::move(values), 0.5);
}

Spread spread(const std::vector<double>& values) {
  if (values.empty()) return {};
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  return {.median = quantile(sorted, 0.5),
          .min = sorted.front(),
          .p10 = quantile(sorted, 0.1),
          .p90 = quantile(sorted, 0.9),
          .max = sorted.back()};
}

Interval bootstrap_median_ci(const std::vector<double>& values, double level, int resamples,
                             unsigned seed) {
  if (values.empty()) return {};
  if (values.size() == 1) return {values[0], values[0]};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
  std::vector<double> medians, sample(values.size());
  medians.reserve(static_cast<std::size_t>(std::max(resamples, 1)));
  for (int r = 0; r < std::max(resamples, 1); ++r) {
    for (double& x : sample) x = values[pick(rng)];
    medians.push_back(median(sample));
  }
  const double tail = (1.0 - std::clamp(level, 0.0, 1.0)) / 2.0;
  return {quantile(medians, tail), quantile(medians, 1.0 - tail)};
}

std::size_t min_values_for_median_ci(double level) {
  const double tail = (1.0 - std::clamp(level, 0.0, 1.0)) / 2.0;
  for (std::size_t n = 2; n < 1000; ++n) {
    // The median of n draws (of an even n, the mean of the middle two) is the smallest of n
    // distinct values when at least n/2 + 1 of the draws are that value: P(Binomial(n, 1/n) >= k).
    const std::size_t k = n / 2 + 1;
    const double p = 1.0 / static_cast<double>(n);
    double at_min = 0.0;
    for (std::size_t j = k; j <= n; ++j) {
      double choose = 1.0;
      for (std::size_t i = 0; i < j; ++i) {
        choose *= static_cast<double>(n - i) / static_cast<double>(i + 1);
      }
      at_min += choose * std::pow(p, static_cast<double>(j)) *
                std::pow(1.0 - p, static_cast<double>(n - j));
    }
    if (at_min < tail) return n;
  }
  return 1000;
}

}  // namespace nanoddp::common
