#pragma once
// A compute profile from first principles: the MLP's GEMMs and elementwise kernels on a named
// GPU, each timed by the roofline
//   t = max(FLOPs / (peak * efficiency), bytes / (HBM bandwidth * efficiency)) + launch
// with the GPU's peak dense rate for the chosen precision. Peaks are NVIDIA's datasheet figures
// (dense, i.e. half the "with sparsity" ones); sources in docs/simulator.md.
//
// Per Linear(in -> out) and batch B: forward 2 B in out FLOPs (+ bias and activation, memory
// bound); backward dW = 2 B in out, dX = 2 B in out (not for the first layer: the input needs no
// gradient), db a column sum, the activation's backward elementwise. The gradients of a Linear
// are ready when its backward node ends, as in nanoddp's autograd. Optimizer: AdamW reads
// parameter, gradient and two moments and writes three (28 bytes per parameter in fp32); SGD
// 12 (20 with momentum). "Other": nanoddp-train's NaN check reads every gradient once.

#include <string>
#include <vector>

#include "benchmarks/sim/profile.h"

namespace nanoddp::sim {

struct GpuSpec {
  std::string name;
  std::string description;
  double fp32_tflops = 0;  // CUDA cores (no tensor cores)
  double tf32_tflops = 0;  // tensor cores, dense
  double bf16_tflops = 0;  // tensor cores, dense
  double hbm_gbs = 0;
  double launch_us = 0;  // per kernel
  double memory_gb = 0;  // HBM, 1e9 bytes
  // The fabrics of the systems it shipped in (DGX/HGX): another one gets a warning.
  std::vector<std::string> fabrics;
};

const std::vector<GpuSpec>& named_gpus();
const GpuSpec& find_gpu(const std::string& name);  // throws SimError listing names

enum class Precision { kFp32, kTf32, kBf16 };
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

struct FlopModelOptions {
  MlpShape shape;
  std::int64_t batch = 64;  // per GPU
  Precision precision = Precision::kFp32;
  double efficiency = 0.7;          // share of the peak FLOP/s and HBM bandwidth reached
  std::string optimizer = "adamw";  // adamw | sgd | sgd-momentum
};

// Throws SimError for a bad shape, batch, efficiency or optimizer.
ComputeProfile profile_from_flops(const GpuSpec& gpu, const FlopModelOptions& options);

}  // namespace nanoddp::sim
