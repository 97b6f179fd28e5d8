#include "benchmarks/sim/profile.h"

#include <fmt/format.h>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

std::vector<ParameterInfo> mlp_parameters(const MlpShape& shape) {
  if (shape.in < 1) fail("--in must be >= 1, got {}", shape.in);
  if (shape.out < 1) fail("--out must be >= 1, got {}", shape.out);
  if (shape.layers < 0) fail("--layers must be >= 0, got {}", shape.layers);
  if (shape.layers > 0 && shape.hidden < 1) fail("--hidden must be >= 1, got {}", shape.hidden);
  if (shape.layers > kMaxMlpLayers) {
    fail(
        "--layers {}: at most {} (each layer is two gradients the replay walks per step, per "
        "configuration of a sweep)",
        shape.layers, kMaxMlpLayers);
  }
  const std::int64_t n_linear = shape.layers + 1;
  std::vector<ParameterInfo> params;
  // Checked: a product or sum past 2^63 would wrap to a negative parameter count.
  std::int64_t total = 0;
  const auto too_many = [&] {
    fail(
        "--in {} --hidden {} --out {} --layers {}: more than 2^63 parameters; no GPU holds such "
        "a model (use smaller --hidden/--in/--out or fewer --layers)",
        shape.in, shape.hidden, shape.out, shape.layers);
  };
  for (std::int64_t k = n_linear - 1; k >= 0; --k) {
    const std::int64_t fan_in = k == 0 ? shape.in : shape.hidden;
    const std::int64_t fan_out = k == n_linear - 1 ? shape.out : shape.hidden;
    std::int64_t weights = 0;
    if (__builtin_mul_overflow(fan_out, fan_in, &weights) ||
        __builtin_add_overflow(total, weights, &total) ||
        __builtin_add_overflow(total, fan_out, &total)) {
      too_many();
    }
    // Sequential index 2k: Linear modules sit between the activations.
    const std::string prefix = fmt::format("layers.{}", 2 * k);
    params.push_back({prefix + ".bias", fan_out, k});
    params.push_back({prefix + ".weight", weights, k});
  }
  return params;
}

std::string describe(const MlpShape& shape) {
  std::int64_t numel = 0;
  for (const ParameterInfo& p : mlp_parameters(shape)) numel += p.numel;
  return fmt::format("MLP in={} hidden={} layers={} out={}: {} Linear, {} parameters", shape.in,
                     shape.hidden, shape.layers, shape.out, shape.layers + 1, numel);
}

double ComputeProfile::backward_ms() const {
  double total = backward_tail_ms;
  for (const GradientWork& g : grads) total += g.work_ms;
  return total;
}

std::int64_t ComputeProfile::numel() const {
  std::int64_t total = 0;
  for (const GradientWork& g : grads) total += g.numel;
  return total;
}

}  // namespace nanoddp::sim
