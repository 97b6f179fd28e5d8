#pragma once
// The arithmetic of the benchmark: from every rank's per-step timings to the figures of one
// point, and the model's parameter count, FLOPs and gradient traffic.

#include <cstdint>
#include <vector>

namespace nanoddp::bench_ddp {

// One rank's measured steps (warm-up excluded), all in milliseconds, index = step.
struct RankSteps {
  std::vector<double> step_ms;     // forward + backward + optimizer, wall time
  std::vector<double> compute_ms;  // step_ms - exposed_ms
  std::vector<double> comm_ms;     // the buckets' all-reduce durations, summed
  std::vector<double> exposed_ms;  // the part of comm_ms the step waited for (<= comm_ms)
};

struct Summary {
  int steps = 0;
  double step_ms_median = 0;  // common::median: the mean of the middle two for an even count
  double step_ms_p10 = 0;
  double step_ms_p90 = 0;
  double step_ms_ci_lo = 0, step_ms_ci_hi = 0;  // bootstrap 95 % interval of the median
  // The breakdown is the median step's own (the lower middle one of the steps sorted by time),
  // so its parts add up: median_step_ms = compute_ms + exposed_comm_ms, and allreduce_ms =
  // hidden_comm_ms + exposed_comm_ms. (Medians taken column by column come from different
  // steps and do not add up.)
  int median_step = 0;  // its index among the measured steps
  double median_step_ms = 0;
  double compute_ms = 0;
  double allreduce_ms = 0;
  double exposed_comm_ms = 0;
  double hidden_comm_ms = 0;    // allreduce_ms - exposed_comm_ms
  double overlap_fraction = 0;  // hidden_comm_ms / allreduce_ms (0 without communication)
  // The slowest rank's figures per step: the samples behind every figure above.
  RankSteps per_step;
};

// A step is as slow as its slowest rank (the others wait for it in the all-reduce), so for each
// step the figures are the slowest rank's; then the median, p10 and p90 over the steps, and the
// median step's parts. Every rank must have the same number of steps.
Summary summarize(const std::vector<RankSteps>& ranks);

struct MlpShape {
  std::int64_t in = 0, out = 0, hidden = 0, layers = 0;
};

// Weights and biases of the L+1 Linear layers (nn::Mlp's layout).
std::int64_t mlp_parameter_count(const MlpShape& shape);

// Floating-point operations of one training step on `batch` samples, counting the GEMMs only
// (bias, activation, loss and optimizer are O(batch x width), negligible next to them):
//   per Linear(in, out):  forward  y = x W^T      2 * B * in * out
//                         backward dW = dY^T X    2 * B * in * out
//                                  dX = dY W      2 * B * in * out
// minus the first layer's dX: the input does not require a gradient, and autograd skips that
// GEMM (GradSink::accumulate does nothing for an input that needs no gradient).
double mlp_training_flops(const MlpShape& shape, std::int64_t batch);

// nccl-tests' bus bytes of one step's collectives over `world` ranks (n): the gradients'
// all-reduce, 2(n-1)/n of their bytes on the wire (`grad_bytes`, the hook's dtype); under ZeRO
// stage 2 a reduce-scatter instead, (n-1)/n; under stage 1 and 2 also the parameters' all-gather
// after the step, (n-1)/n of `param_bytes`. (Stage 2's left-over elements, fewer than n per
// bucket, take a tiny extra collective: not counted.) 0 for one rank.
double step_bus_bytes(double grad_bytes, double param_bytes, int world, int zero_stage);

// Bus bandwidth in GB/s (1e9) of `bus_bytes` moved in `ms`; 0 for no time.
double busbw_gbs(double bus_bytes, double ms);

}  // namespace nanoddp::bench_ddp
