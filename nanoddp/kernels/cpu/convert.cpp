// float32 <-> bfloat16. bf16 is the upper half of an IEEE float (same 8-bit exponent, 7-bit
// mantissa), so widening is a shift and narrowing is rounding away the low 16 bits.

#include <bit>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {
namespace {

inline std::uint16_t to_bf16(float value) {
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

}  // namespace

void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
  }
}

}  // namespace nanoddp::kernels::cpu
