// float32 <-> bfloat16: exact round trips, round-to-nearest-even ties, NaN and overflow.

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace {
namespace cpu = nanoddp::kernels::cpu;

std::uint16_t to_bf16(std::uint32_t float_bits) {
  const float f = std::bit_cast<float>(float_bits);
  std::uint16_t out = 0xdead;
  cpu::f32_to_bf16(&f, &out, 1);
  return out;
}
}  // namespace

TEST_CASE("bf16: every bf16 value survives bf16 -> f32 -> bf16") {
  std::vector<std::uint16_t> all(65536), back(65536, 0xdead);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> wide(65536, nanoddp::test::kNaN);
  cpu::bf16_to_f32(all.data(), wide.data(), 65536);
  cpu::f32_to_bf16(wide.data(), back.data(), 65536);
  int mismatches = 0, nan_lost = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    // Widening is exact: the float's upper half is the bf16, the lower half zero.
    REQUIRE(std::bit_cast<std::uint32_t>(wide[i]) == i << 16);
    const bool is_nan = (i & 0x7fffu) > 0x7f80u;
    if (is_nan) {
      nan_lost += !std::isnan(std::bit_cast<float>(std::uint32_t{back[i]} << 16));
    } else {
      mismatches += back[i] != all[i];
    }
  }
  CHECK(mismatches == 0);
  CHECK(nan_lost == 0);
}

TEST_CASE("bf16: round to nearest, ties to even") {
  CHECK(to_bf16(0x3f808000u) == 0x3f80u);  // 1 + 2^-8: tie, kept value even -> down
  CHECK(to_bf16(0x3f818000u) == 0x3f82u);  // tie, kept value odd -> up to even
  CHECK(to_bf16(0x3f808001u) == 0x3f81u);  // just above half -> up
  CHECK(to_bf16(0x3f807fffu) == 0x3f80u);  // just below half -> down
  CHECK(to_bf16(0xbf818000u) == 0xbf82u);  // negative tie, odd -> away (to even)
  CHECK(to_bf16(0xbf808000u) == 0xbf80u);  // negative tie, even -> toward zero
  CHECK(to_bf16(0x3f7fffffu) == 0x3f80u);  // carry into the exponent: 0.99999994 -> 1.0
  CHECK(to_bf16(0x00008000u) == 0x0000u);  // subnormal tie, even
  CHECK(to_bf16(0x00018000u) == 0x0002u);  // subnormal tie, odd
}

TEST_CASE("bf16: infinities, overflow, zeros and NaN") {
  CHECK(to_bf16(0x7f800000u) == 0x7f80u);  // +inf
  CHECK(to_bf16(0xff800000u) == 0xff80u);  // -inf
  CHECK(to_bf16(0x7f7fffffu) == 0x7f80u);  // FLT_MAX rounds to +inf, as IEEE says
  CHECK(to_bf16(0x7f7f7fffu) == 0x7f7fu);  // just below the halfway point stays finite
  CHECK(to_bf16(0x80000000u) == 0x8000u);  // -0 keeps its sign
  // A NaN whose payload is only in the low 16 bits would round to Inf if treated as a number.
  const std::uint16_t low_payload = to_bf16(0x7f800001u);
  CHECK((low_payload & 0x7fffu) > 0x7f80u);
  const std::uint16_t neg_nan = to_bf16(0xffffffffu);
  CHECK((neg_nan & 0x7fffu) > 0x7f80u);
  CHECK((neg_nan & 0x8000u) != 0u);
  CHECK(to_bf16(0x7fc00000u) == 0x7fc0u);  // canonical quiet NaN unchanged
}

TEST_CASE("bf16: random floats round to the nearest bf16") {
  const auto x = nanoddp::test::random_floats(10000, 123, -1000.0f, 1000.0f);
  std::vector<std::uint16_t> h(x.size());
  cpu::f32_to_bf16(x.data(), h.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double got = std::bit_cast<float>(std::uint32_t{h[i]} << 16);
    // Neighbours one bf16 step either side must be no closer.
    const double up = std::bit_cast<float>(std::uint32_t(h[i] + 1) << 16);
    const double down = std::bit_cast<float>(std::uint32_t(h[i] - 1) << 16);
    const double err = std::abs(got - x[i]);
    REQUIRE(err <= std::abs(up - x[i]));
    REQUIRE(err <= std::abs(down - x[i]));
  }
}
