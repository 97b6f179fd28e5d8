// Philox4x32-10 known answers (Random123's published test vectors) and the random fills.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/philox.h"
#include "support/worst_error.h"

namespace {
using nanoddp::kernels::Philox4;
using nanoddp::kernels::philox4x32_10;
using namespace nanoddp::test;
namespace cpu = nanoddp::kernels::cpu;

// Our packing: counter_lo = c0 | c1 << 32, counter_hi = c2 | c3 << 32, key = k0 | k1 << 32.
Philox4 philox_words(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3,
                     std::uint32_t k0, std::uint32_t k1) {
  return philox4x32_10(c0 | std::uint64_t{c1} << 32, c2 | std::uint64_t{c3} << 32,
                       k0 | std::uint64_t{k1} << 32);
}

void check_words(const Philox4& r, std::uint32_t w0, std::uint32_t w1, std::uint32_t w2,
                 std::uint32_t w3) {
  CHECK(r.v[0] == w0);
  CHECK(r.v[1] == w1);
  CHECK(r.v[2] == w2);
  CHECK(r.v[3] == w3);
}
}  // namespace

TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
  check_words(philox_words(0, 0, 0, 0, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  const std::uint32_t f = 0xffffffffu;
  check_words(philox_words(f, f, f, f, f, f), 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  check_words(
      philox_words(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u),
      0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

TEST_CASE("fill_uniform: element i is word 0 of philox(offset + i, stream, seed)") {
  const std::int64_t n = 37;
  Poisoned out(n);
  cpu::fill_uniform(out.data(), n, 1234, 7, 1000, -2.0f, 3.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto r = philox4x32_10(1000 + i, 7, 1234);
    // std::fma: the kernel's exact formula, whatever this file's compile flags contract.
    REQUIRE(out[i] == std::fma(5.0f, nanoddp::kernels::uniform_from_bits(r.v[0]), -2.0f));
  }
  CHECK(out.guards_intact());
}

TEST_CASE("fill_normal and fill_uniform: the blocked Philox gives each element its own bits") {
  // The fills run Philox for blocks of counters side by side; every element must still be the
  // scalar philox4x32_10 of its own counter. 150 = two full blocks and a tail, and the counters
  // cross 2^32, where the counter's high word (Philox's second input word) changes mid-block.
  const std::int64_t n = 150;
  for (const std::uint64_t offset : {std::uint64_t{0}, (std::uint64_t{1} << 32) - 70}) {
    CAPTURE(offset);
    Poisoned normal(n), uniform(n);
    cpu::fill_normal(normal.data(), n, 77, (std::uint64_t{3} << 32) | 9, offset, 0.5f, 2.0f);
    cpu::fill_uniform(uniform.data(), n, 77, 9, offset, -1.0f, 1.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const auto r =
          philox4x32_10(offset + static_cast<std::uint64_t>(i), (std::uint64_t{3} << 32) | 9, 77);
      const float z = nanoddp::kernels::normal_from_bits(r.v[0], r.v[1]);
      REQUIRE(normal[i] == std::fma(2.0f, z, 0.5f));
      const auto q = philox4x32_10(offset + static_cast<std::uint64_t>(i), 9, 77);
      REQUIRE(uniform[i] == std::fma(2.0f, nanoddp::kernels::uniform_from_bits(q.v[0]), -1.0f));
    }
    CHECK(normal.guards_intact());
    CHECK(uniform.guards_intact());
  }
}

TEST_CASE("Box-Muller's polynomial log and cosine, on every input they get: within 1 ulp") {
  using nanoddp::kernels::cos_two_pi;
  using nanoddp::kernels::log_unit_interval;
  // u1 takes the 2^24 values k / 2^24, k = 1 .. 2^24: all of them, against float64.
  double worst_log_ulp = 0;
  for (std::int64_t k = 1; k <= (std::int64_t{1} << 24); ++k) {
    const float x = static_cast<float>(k) * (1.0f / 16777216.0f);
    const float got = log_unit_interval(x);
    const double want = std::log(static_cast<double>(x));
    if (k == (std::int64_t{1} << 24)) {
      CHECK(got == 0.0f);  // ln 1, exactly
      continue;
    }
    const float rounded = static_cast<float>(want);
    const double ulp = static_cast<double>(std::nextafter(std::fabs(rounded), INFINITY)) -
                       static_cast<double>(std::fabs(rounded));
    worst_log_ulp =
        nanoddp::test::worse(worst_log_ulp, std::fabs(static_cast<double>(got) - want) / ulp);
  }
  MESSAGE("log: worst error ", worst_log_ulp, " ulp");
  CHECK(worst_log_ulp < 1.0);
  // u2 takes the 2^24 values k / 2^24, k = 0 .. 2^24 - 1. cos crosses zero, where relative
  // error means nothing: compare absolutely, against the ulp of 1 (2^-23).
  double worst_cos = 0;
  for (std::int64_t k = 0; k < (std::int64_t{1} << 24); ++k) {
    const float u = static_cast<float>(k) * (1.0f / 16777216.0f);
    const double want = std::cos(2.0 * std::numbers::pi * static_cast<double>(u));
    worst_cos =
        nanoddp::test::worse(worst_cos, std::fabs(static_cast<double>(cos_two_pi(u)) - want));
  }
  MESSAGE("cos: worst absolute error ", worst_cos);
  CHECK(worst_cos < std::ldexp(1.0, -23));
  // The exact values the reductions must reproduce.
  CHECK(cos_two_pi(0.0f) == 1.0f);
  CHECK(cos_two_pi(0.5f) == -1.0f);
}

TEST_CASE("fill_uniform: range and moments over 1e5 samples") {
  const std::int64_t n = 100000;
  Poisoned out(n);
  cpu::fill_uniform(out.data(), n, 42, 0, 0, -1.0f, 3.0f);
  double sum = 0.0, sum_sq = 0.0;
  float lo = INFINITY, hi = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) {
    sum += out[i];
    sum_sq += double(out[i]) * out[i];
    lo = std::min(lo, out[i]);
    hi = std::max(hi, out[i]);
  }
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  CHECK(lo >= -1.0f);
  CHECK(hi < 3.0f);
  CHECK(lo < -0.99f);  // the range is actually covered
  CHECK(hi > 2.99f);
  CHECK(mean == doctest::Approx(1.0).epsilon(0.01));         // 4-sigma ~ 0.015 / 1.0
  CHECK(var == doctest::Approx(16.0 / 12.0).epsilon(0.02));  // uniform variance (b-a)^2/12
  CHECK(out.guards_intact());
}

TEST_CASE("fill_normal: mean, std and finite tails over 1e5 samples") {
  const std::int64_t n = 100000;
  Poisoned out(n);
  cpu::fill_normal(out.data(), n, 7, 3, 0, 0.5f, 2.0f);
  double sum = 0.0, sum_sq = 0.0;
  int beyond_2sigma = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(std::isfinite(out[i]));
    const double z = (out[i] - 0.5) / 2.0;
    REQUIRE(std::abs(z) < 5.8);  // u1 in (0, 1]: |z| <= sqrt(-2 ln 2^-24) = 5.77
    sum += z;
    sum_sq += z * z;
    beyond_2sigma += std::abs(z) > 2.0;
  }
  const double mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
  CHECK(std::abs(mean) < 0.015);  // standard error 0.0032
  CHECK(std == doctest::Approx(1.0).epsilon(0.015));
  CHECK(beyond_2sigma / double(n) == doctest::Approx(0.0455).epsilon(0.1));
  CHECK(out.guards_intact());
}

TEST_CASE("random fills: any slice equals the same slice of a longer fill") {
  const std::int64_t n = 5000;
  std::vector<float> full_u(n), full_n(n);
  cpu::fill_uniform(full_u.data(), n, 99, 5, 100, 0.0f, 1.0f);
  cpu::fill_normal(full_n.data(), n, 99, 5, 100, 0.0f, 1.0f);
  for (std::int64_t start : {0, 1, 17, 2500, 4999}) {
    for (std::int64_t len : {1, 3, 500}) {
      if (start + len > n) continue;
      CAPTURE(start);
      CAPTURE(len);
      Poisoned u(len), z(len);
      cpu::fill_uniform(u.data(), len, 99, 5, 100 + start, 0.0f, 1.0f);
      cpu::fill_normal(z.data(), len, 99, 5, 100 + start, 0.0f, 1.0f);
      for (std::int64_t i = 0; i < len; ++i) {
        REQUIRE(u[i] == full_u[start + i]);
        REQUIRE(z[i] == full_n[start + i]);
      }
    }
  }
}

TEST_CASE("random fills: seed and stream change the numbers") {
  const std::int64_t n = 64;
  std::vector<float> a(n), b(n), c(n);
  cpu::fill_uniform(a.data(), n, 1, 0, 0, 0.0f, 1.0f);
  cpu::fill_uniform(b.data(), n, 2, 0, 0, 0.0f, 1.0f);
  cpu::fill_uniform(c.data(), n, 1, 1, 0, 0.0f, 1.0f);
  int same_seed = 0, same_stream = 0, outside = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    same_seed += a[i] == b[i];
    same_stream += a[i] == c[i];
    // NaN compares unequal to everything: a NaN fill would pass the counts above.
    for (const float v : {a[i], b[i], c[i]}) outside += !(v >= 0.0f && v < 1.0f);
  }
  CHECK(same_seed < 2);
  CHECK(same_stream < 2);
  CHECK(outside == 0);
}
