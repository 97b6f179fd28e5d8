#pragma once
// float32 <-> bfloat16, one value at a time, on the host. The one definition of the rounding
// used by the CPU kernels (kernels/cpu/convert.cpp), the Gloo group's bf16 reductions and the
// shared-memory all-reduce (comm/), so that a bf16 all-reduce rounds exactly as the bf16 comm
// hook's compression does. The CUDA twin is f32_to_bf16_bits in kernels/cuda/elementwise.cu.
//
// bf16 is the upper half of an IEEE float (same 8-bit exponent, 7-bit mantissa), so widening
// is a shift and narrowing is rounding away the low 16 bits.

#include <bit>
#include <cstdint>

namespace nanoddp::kernels {

inline float bf16_to_float(std::uint16_t value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value) << 16);
}

inline std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  // NaN: rounding could carry a NaN's payload into the exponent and make it Inf. Keep the
  // sign and the top of the payload, and force a quiet bit so the result is still a NaN.
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. Above halfway
  // carries into the kept bits; exactly halfway carries only when the kept value is odd.
  // A carry out of the mantissa correctly bumps the exponent (up to Inf for huge values).
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

}  // namespace nanoddp::kernels
