#include "stats.h"

#include <algorithm>
#include <cmath>

#include "common/stats.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::bench_ddp {

using common::median;
using common::quantile;

Summary summarize(const std::vector<RankSteps>& ranks) {
  NANODDP_CHECK(!ranks.empty(), "summarize: no ranks");
  const std::size_t steps = ranks.front().step_ms.size();
  for (const RankSteps& r : ranks) {
    NANODDP_CHECK(r.step_ms.size() == steps && r.compute_ms.size() == steps &&
                      r.comm_ms.size() == steps && r.exposed_ms.size() == steps,
                  "summarize: ranks with different step counts");
  }
  Summary out;
  RankSteps& slowest_steps = out.per_step;
  for (std::size_t s = 0; s < steps; ++s) {
    std::size_t slowest = 0;
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      if (ranks[r].step_ms[s] > ranks[slowest].step_ms[s]) slowest = r;
    }
    const RankSteps& r = ranks[slowest];
    slowest_steps.step_ms.push_back(r.step_ms[s]);
    slowest_steps.compute_ms.push_back(r.compute_ms[s]);
    slowest_steps.comm_ms.push_back(r.comm_ms[s]);
    slowest_steps.exposed_ms.push_back(r.exposed_ms[s]);
  }
  const std::vector<double>& step = slowest_steps.step_ms;
  out.steps = static_cast<int>(steps);
  out.step_ms_median = median(step);
  out.step_ms_p10 = quantile(step, 0.1);
  out.step_ms_p90 = quantile(step, 0.9);
  const common::Interval ci = common::bootstrap_median_ci(step);
  out.step_ms_ci_lo = ci.lo;
  out.step_ms_ci_hi = ci.hi;
  if (steps == 0) return out;
  std::vector<std::size_t> order(steps);
  for (std::size_t i = 0; i < steps; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return step[a] < step[b]; });
  const std::size_t m = order[(steps - 1) / 2];
  out.median_step = static_cast<int>(m);
  out.median_step_ms = step[m];
  out.allreduce_ms = slowest_steps.comm_ms[m];
  // exposed <= comm in every step (the worker caps it): hidden is never negative.
  out.exposed_comm_ms = std::min(slowest_steps.exposed_ms[m], out.allreduce_ms);
  out.compute_ms = out.median_step_ms - out.exposed_comm_ms;
  out.hidden_comm_ms = out.allreduce_ms - out.exposed_comm_ms;
  out.overlap_fraction = out.allreduce_ms > 0 ? out.hidden_comm_ms / out.allreduce_ms : 0.0;
  return out;
}

namespace {

// (in, out) of each Linear of the MLP, first layer first.
std::vector<std::pair<std::int64_t, std::int64_t>> linear_shapes(const MlpShape& m) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
  std::int64_t width = m.in;
  for (std::int64_t i = 0; i < m.layers; ++i) {
    shapes.emplace_back(width, m.hidden);
    width = m.hidden;
  }
  shapes.emplace_back(width, m.out);
  return shapes;
}

}  // namespace

std::int64_t mlp_parameter_count(const MlpShape& shape) {
  std::int64_t n = 0;
  for (const auto& [in, out] : linear_shapes(shape)) n += in * out + out;
  return n;
}

double mlp_training_flops(const MlpShape& shape, std::int64_t batch) {
  const auto shapes = linear_shapes(shape);
  const auto b = static_cast<double>(batch);
  double flops = 0;
  for (const auto& [in, out] : shapes) {
    flops += 6.0 * b * static_cast<double>(in) * static_cast<double>(out);
  }
  const auto& [in0, out0] = shapes.front();
  flops -= 2.0 * b * static_cast<double>(in0) * static_cast<double>(out0);  // no dX for the input
  return flops;
}

double step_bus_bytes(double grad_bytes, double param_bytes, int world, int zero_stage) {
  if (world <= 1) return 0;
  const double n = world;
  const double share = (n - 1) / n;
  const double gradients = grad_bytes * (zero_stage == 2 ? 1.0 : 2.0) * share;
  const double parameters = zero_stage > 0 ? param_bytes * share : 0.0;
  return gradients + parameters;
}

double busbw_gbs(double bus_bytes, double ms) {
  if (ms <= 0) return 0;
  return bus_bytes / (ms / 1000.0) / 1e9;
}

}  // namespace nanoddp::bench_ddp
