#pragma once
// Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11), also used
// by cuRAND and PyTorch. Counter-based means: the random numbers for element i are a pure
// function of (seed, i). Nothing is carried from one draw to the next, so any slice of a
// stream can be regenerated anywhere (on any rank, on CPU or GPU) and gives the same bits.
// That is what lets a data set be addressed by global sample index.

#include <cstdint>

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

}  // namespace nanoddp::kernels
