#pragma once
// Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11), also used
// by cuRAND and PyTorch. Counter-based means: the random numbers for element i are a pure
// function of (seed, i). Nothing is carried from one draw to the next, so any slice of a
// stream can be regenerated anywhere (on any rank, on CPU or GPU) and gives the same bits.
// That is what lets a data set be addressed by global sample index.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NANODDP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define NANODDP_HOST_DEVICE inline
#endif

namespace nanoddp::kernels {

struct Philox4 {
  std::uint32_t v[4];
};

NANODDP_HOST_DEVICE std::uint32_t philox_mulhilo(std::uint32_t a, std::uint32_t b,
                                                 std::uint32_t* hi) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
}

// Four 32-bit random words for the 128-bit counter (counter_lo, counter_hi) under a 64-bit key.
NANODDP_HOST_DEVICE Philox4 philox4x32_10(std::uint64_t counter_lo, std::uint64_t counter_hi,
                                          std::uint64_t key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::uint32_t c0 = static_cast<std::uint32_t>(counter_lo);
  std::uint32_t c1 = static_cast<std::uint32_t>(counter_lo >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(counter_hi);
  std::uint32_t c3 = static_cast<std::uint32_t>(counter_hi >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(key);
  std::uint32_t k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = philox_mulhilo(kMul0, c0, &hi0);
    const std::uint32_t lo1 = philox_mulhilo(kMul1, c2, &hi1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0;
    const std::uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from the top 24 bits of a word (exactly representable steps).
NANODDP_HOST_DEVICE float uniform_from_bits(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// ---- a standard normal from two words, with the same bits on the CPU and the GPU ------------
//
// Box-Muller needs a logarithm and a cosine. The C library's logf/cosf and CUDA's differ in the
// last bit here and there, so data drawn on a GPU would not be the data drawn on the CPU; the
// C library's are also scalar calls that keep a fill loop from vectorising. So both come from
// here: Cephes' single-precision polynomials (Moshier; about 1 ulp on the reduced ranges),
// written with an explicit fmaf at every multiply-add. Left to themselves, nvcc always fuses
// a * b + c and a CPU compiler may or may not; spelled out, every build computes the same
// roundings, and IEEE sqrtf, fmaf, + and * are the same on both sides.

NANODDP_HOST_DEVICE std::uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

NANODDP_HOST_DEVICE float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// ln(x) for a normal float x in (0, 1]: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
// ln(x) = e ln 2 + ln(1 + f) with f = m - 1 in [-0.29, 0.41] by a degree-9 polynomial; ln 2 in
// two parts (0.693359375 is exact in a few bits) keeps e ln 2 exact enough.
NANODDP_HOST_DEVICE float log_unit_interval(float x) {
  const std::uint32_t bits = float_to_bits(x);
  int e = static_cast<int>((bits >> 23) & 0xffu) - 126;  // x = m * 2^e, m in [0.5, 1)
  const float m = bits_to_float((bits & 0x007fffffu) | 0x3f000000u);
  const bool below = m < 0.707106781186547524f;  // sqrt(1/2)
  e = below ? e - 1 : e;
  const float f = below ? (m + m) - 1.0f : m - 1.0f;  // exact
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = fmaf(p, f, -1.1514610310e-1f);
  p = fmaf(p, f, 1.1676998740e-1f);
  p = fmaf(p, f, -1.2420140846e-1f);
  p = fmaf(p, f, 1.4249322787e-1f);
  p = fmaf(p, f, -1.6668057665e-1f);
  p = fmaf(p, f, 2.0000714765e-1f);
  p = fmaf(p, f, -2.4999993993e-1f);
  p = fmaf(p, f, 3.3333331174e-1f);
  const float ef = static_cast<float>(e);
  float y = (p * f) * z;
  y = fmaf(-2.12194440e-4f, ef, y);
  y = fmaf(-0.5f, z, y);
  const float r = f + y;
  return fmaf(0.693359375f, ef, r);
}

// cos(2 pi u) for u in [0, 1) on the 2^-24 grid. The reductions are exact on that grid (each
// subtraction is of two floats within a factor of two of each other): cos is even and
// 1-periodic in u, cos(2 pi a) = -cos(2 pi (1/2 - a)), and cos(2 pi b) = sin(2 pi (1/4 - b)),
// leaving x = 2 pi c in [0, pi/4] for the polynomials.
NANODDP_HOST_DEVICE float cos_two_pi(float u) {
  const float a = u > 0.5f ? 1.0f - u : u;  // [0, 1/2]
  const bool negate = a > 0.25f;
  const float b = negate ? 0.5f - a : a;  // [0, 1/4]
  const bool use_sin = b > 0.125f;
  const float c = use_sin ? 0.25f - b : b;  // [0, 1/8]
  const float x = c * 6.28318530717958648f;
  const float z = x * x;
  float pc = 2.443315711809948e-5f;
  pc = fmaf(pc, z, -1.388731625493765e-3f);
  pc = fmaf(pc, z, 4.166664568298827e-2f);
  float cos_x = (pc * z) * z;
  cos_x = fmaf(-0.5f, z, cos_x);
  cos_x = cos_x + 1.0f;
  float ps = -1.9515295891e-4f;
  ps = fmaf(ps, z, 8.3321608736e-3f);
  ps = fmaf(ps, z, -1.6666654611e-1f);
  const float sin_x = fmaf(ps * z, x, x);
  const float v = use_sin ? sin_x : cos_x;
  return negate ? -v : v;
}

// One standard normal from the first two Philox words (Box-Muller, cosine branch only, so that
// element i depends on counter i alone). u1 is in (0, 1], not [0, 1), so ln(u1) is finite: the
// largest |z| is sqrt(-2 ln 2^-24) ~ 5.8.
NANODDP_HOST_DEVICE float normal_from_bits(std::uint32_t word0, std::uint32_t word1) {
  const float u1 = static_cast<float>((word0 >> 8) + 1u) * (1.0f / 16777216.0f);
  const float u2 = uniform_from_bits(word1);
  return sqrtf(-2.0f * log_unit_interval(u1)) * cos_two_pi(u2);
}

}  // namespace nanoddp::kernels
