#include "benchmarks/sim/flop_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

const std::vector<GpuSpec>& named_gpus() {
  // NVIDIA datasheets; tensor-core figures there are "with sparsity": dense is half.
  static const std::vector<GpuSpec> gpus = {
      {.name = "h100",
       .description = "H100 SXM5 80 GB (FP32 66.9, TF32 494.7, BF16 989.4 dense TFLOP/s; "
                      "HBM3 3.35 TB/s)",
       .fp32_tflops = 66.9,
       .tf32_tflops = 494.7,
       .bf16_tflops = 989.4,
       .hbm_gbs = 3350.0,
       .launch_us = 4.0,
       .memory_gb = 80.0,
       .fabrics = {"nvlink4-ib400"}},
      {.name = "h200",
       .description = "H200 SXM 141 GB (FP32 66.9, TF32 494.7, BF16 989.4 dense TFLOP/s; "
                      "HBM3e 4.8 TB/s)",
       .fp32_tflops = 66.9,
       .tf32_tflops = 494.7,
       .bf16_tflops = 989.4,
       .hbm_gbs = 4800.0,
       .launch_us = 4.0,
       .memory_gb = 141.0,
       .fabrics = {"nvlink4-ib400"}},
      {.name = "a100",
       .description = "A100 SXM4 80 GB (FP32 19.5, TF32 156, BF16 312 dense TFLOP/s; "
                      "HBM2e 2.04 TB/s)",
       .fp32_tflops = 19.5,
       .tf32_tflops = 156.0,
       .bf16_tflops = 312.0,
       .hbm_gbs = 2039.0,
       .launch_us = 4.0,
       .memory_gb = 80.0,
       .fabrics = {"nvlink3-ib200"}},
  };
  return gpus;
}

const GpuSpec& find_gpu(const std::string& name) {
  std::vector<std::string> names;
  for (const GpuSpec& g : named_gpus()) {
    if (g.name == name) return g;
    names.push_back(g.name);
  }
  fail("--gpu {}: unknown GPU; known: {}", name, fmt::join(names, ", "));
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "tf32") return Precision::kTf32;
  if (name == "bf16") return Precision::kBf16;
  fail("--precision {}: expected fp32, tf32 or bf16", name);
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

namespace {

struct Roofline {
  double flops_per_ms = 0;
  double bytes_per_ms = 0;
  double launch_ms = 0;
  double element_bytes = 4;

  double gemm(double m, double n, double k) const {
    const double flops = 2.0 * m * n * k;
    const double bytes = (m * k + k * n + m * n) * element_bytes;
    return std::max(flops / flops_per_ms, bytes / bytes_per_ms) + launch_ms;
  }
  // An elementwise kernel reading `reads` and writing `writes` tensors of `elements`.
  double elementwise(double elements, double reads, double writes) const {
    return elements * (reads + writes) * element_bytes / bytes_per_ms + launch_ms;
  }
  // A kernel over fp32 buffers (optimizer, NaN check): `bytes` in total.
  double stream(double bytes) const { return bytes / bytes_per_ms + launch_ms; }
};

}  // namespace

ComputeProfile profile_from_flops(const GpuSpec& gpu, const FlopModelOptions& o) {
  const std::vector<ParameterInfo> params = mlp_parameters(o.shape);
  if (o.batch < 1) fail("--batch must be >= 1, got {}", o.batch);
  if (!(o.efficiency > 0 && o.efficiency <= 1)) {
    fail("--efficiency must be in (0, 1], got {}", o.efficiency);
  }
  double bytes_per_param = 0;
  if (o.optimizer == "adamw") {
    bytes_per_param = 28;
  } else if (o.optimizer == "sgd") {
    bytes_per_param = 12;
  } else if (o.optimizer == "sgd-momentum") {
    bytes_per_param = 20;
  } else {
    fail("--optimizer {}: expected adamw, sgd or sgd-momentum", o.optimizer);
  }
  const double peak_tflops = o.precision == Precision::kFp32   ? gpu.fp32_tflops
                             : o.precision == Precision::kTf32 ? gpu.tf32_tflops
                                                               : gpu.bf16_tflops;
  Roofline r{.flops_per_ms = peak_tflops * 1e9 * o.efficiency,
             .bytes_per_ms = gpu.hbm_gbs * 1e6 * o.efficiency,
             .launch_ms = gpu.launch_us / 1000.0,
             .element_bytes = o.precision == Precision::kBf16 ? 2.0 : 4.0};

  const std::int64_t n_linear = o.shape.layers + 1;
  const auto fan_in = [&](std::int64_t k) { return k == 0 ? o.shape.in : o.shape.hidden; };
  const auto fan_out = [&](std::int64_t k) {
    return k == n_linear - 1 ? o.shape.out : o.shape.hidden;
  };
  const double b = static_cast<double>(o.batch);

  ComputeProfile profile;
  // Forward: GEMM, then bias + activation (one kernel writing the output and, before an
  // activation, the pre-activation it keeps for backward); the loss reads output and target.
  for (std::int64_t k = 0; k < n_linear; ++k) {
    const double in = static_cast<double>(fan_in(k)), out = static_cast<double>(fan_out(k));
    const bool activation = k + 1 < n_linear;
    profile.forward_ms += r.gemm(b, out, in) + r.elementwise(b * out, 1, activation ? 2 : 1);
  }
  profile.forward_ms += r.elementwise(b * static_cast<double>(o.shape.out), 2, 0);

  // Backward, node by node from the loss: the k-th Linear from the end produces its bias and
  // weight gradients; what runs before it since the previous Linear (the loss's or an
  // activation's backward) counts towards it.
  double carried = r.elementwise(b * static_cast<double>(o.shape.out), 2, 1);  // MSE backward
  for (std::int64_t k = n_linear - 1; k >= 0; --k) {
    const double in = static_cast<double>(fan_in(k)), out = static_cast<double>(fan_out(k));
    double node = r.gemm(out, in, b) + r.elementwise(b * out, 1, 0) + carried;  // dW, db
    if (k > 0) node += r.gemm(b, in, out);                                      // dX
    carried = k > 0 ? r.elementwise(b * in, 2, 1) : 0.0;  // the activation before it
    const std::size_t i = static_cast<std::size_t>(2 * (n_linear - 1 - k));
    profile.grads.push_back({params[i].name, params[i].numel, node});         // bias
    profile.grads.push_back({params[i + 1].name, params[i + 1].numel, 0.0});  // weight, same node
  }
  profile.backward_tail_ms = 0;
  const double numel = static_cast<double>(profile.numel());
  profile.optimizer_ms = r.stream(numel * bytes_per_param);
  profile.other_ms = r.stream(numel * 4.0) + r.launch_ms;  // NaN check over the gradients
  profile.source = fmt::format(
      "FLOP model: {} on {}, batch {} per GPU, {} GEMMs at {:.0f} % of peak, optimizer {}",
      describe(o.shape), gpu.description, o.batch, precision_name(o.precision),
      o.efficiency * 100.0, o.optimizer);
  return profile;
}

}  // namespace nanoddp::sim
