// float32 <-> bfloat16 over buffers; the per-value rounding is kernels/bf16.h.

#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {

void f32_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void bf16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace nanoddp::kernels::cpu
