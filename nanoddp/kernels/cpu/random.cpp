// Counter-based random fills. Element i is a pure function of (seed, stream, offset + i): no
// state runs from one element to the next, so fill(n, offset) equals the slice
// [offset, offset + n) of any longer fill, on any rank and on the GPU (the CUDA twin uses the
// same philox4x32_10 and the same float formulas).

#include <cmath>
#include <numbers>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/philox.h"

namespace nanoddp::kernels::cpu {

void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                  std::uint64_t offset, float lo, float hi) {
  const float range = hi - lo;
  for (std::int64_t i = 0; i < n; ++i) {
    const Philox4 r = philox4x32_10(offset + static_cast<std::uint64_t>(i), stream, seed);
    // An explicit fused multiply-add: left to itself the compiler contracts `lo + range * u`
    // into an FMA or not depending on -march and -ffp-contract, and nvcc always does, so only
    // std::fma gives the same bits on every build and on the GPU (the CUDA twin uses fmaf).
    out[i] = std::fma(range, uniform_from_bits(r.v[0]), lo);
  }
}

void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t offset, float mean, float stddev) {
  constexpr float kTwoPi = 2.0f * std::numbers::pi_v<float>;
  for (std::int64_t i = 0; i < n; ++i) {
    const Philox4 r = philox4x32_10(offset + static_cast<std::uint64_t>(i), stream, seed);
    // Box-Muller. u1 is taken in (0, 1], not [0, 1), so log(u1) is finite: the largest |z|
    // is sqrt(-2 ln 2^-24) ~ 5.8. Only the cosine branch is used (one normal per counter),
    // which keeps element i independent of its neighbours.
    const float u1 = static_cast<float>((r.v[0] >> 8) + 1u) * (1.0f / 16777216.0f);
    const float u2 = uniform_from_bits(r.v[1]);
    const float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(kTwoPi * u2);
    out[i] = std::fma(stddev, z, mean);
  }
}

}  // namespace nanoddp::kernels::cpu
