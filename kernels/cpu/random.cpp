// Counter-based random fills. Element i is a pure function of (seed, stream, offset + i): no
// state runs from one element to the next, so fill(n, offset) equals the slice
// [offset, offset + n) of any longer fill, on any rank and on the GPU (the CUDA twin uses the
// same philox4x32_10 and the same float formulas).
//
// Speed. Philox is ten rounds of two 32x32->64-bit multiplies per counter: one counter at a
// time, that is a long serial chain per element. The fills below run it for a block of
// kBlock counters side by side, as plain loops over arrays, which the compiler vectorises (one
// AVX-512 vpmuludq does eight of the multiplies). The integer arithmetic is exact, so every
// element gets the same bits as philox4x32_10() gives it alone. fill_normal's logarithm and
// cosine are polynomials (philox.h), so its second loop vectorises too. The synthetic data set
// draws its inputs with fill_normal, so this is on the training loop's data path.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/philox.h"

namespace nanoddp::kernels::cpu {
namespace {

constexpr int kBlock = 64;

// The first two Philox words (all the fills use) of counters base + 0 .. base + count - 1,
// count <= kBlock. Same rounds, constants and word shuffle as philox4x32_10 in philox.h.
void philox_block(std::uint64_t base, int count, std::uint64_t stream, std::uint64_t key,
                  std::uint32_t* word0, std::uint32_t* word1) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  alignas(64) std::uint32_t c0[kBlock], c1[kBlock], c2[kBlock], c3[kBlock];
  for (int j = 0; j < kBlock; ++j) {
    const std::uint64_t counter = base + static_cast<std::uint64_t>(j);
    c0[j] = static_cast<std::uint32_t>(counter);
    c1[j] = static_cast<std::uint32_t>(counter >> 32);
    c2[j] = static_cast<std::uint32_t>(stream);
    c3[j] = static_cast<std::uint32_t>(stream >> 32);
  }
  std::uint32_t k0 = static_cast<std::uint32_t>(key);
  std::uint32_t k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int j = 0; j < kBlock; ++j) {
      const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0[j];
      const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2[j];
      const auto hi0 = static_cast<std::uint32_t>(p0 >> 32);
      const auto hi1 = static_cast<std::uint32_t>(p1 >> 32);
      const std::uint32_t n0 = hi1 ^ c1[j] ^ k0;
      const std::uint32_t n2 = hi0 ^ c3[j] ^ k1;
      c0[j] = n0;
      c1[j] = static_cast<std::uint32_t>(p1);
      c2[j] = n2;
      c3[j] = static_cast<std::uint32_t>(p0);
    }
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  std::copy(c0, c0 + count, word0);
  std::copy(c1, c1 + count, word1);
}

}  // namespace

void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                  std::uint64_t offset, float lo, float hi) {
  const float range = hi - lo;
  alignas(64) std::uint32_t w0[kBlock], w1[kBlock];
  for (std::int64_t start = 0; start < n; start += kBlock) {
    const int count = static_cast<int>(std::min<std::int64_t>(kBlock, n - start));
    philox_block(offset + static_cast<std::uint64_t>(start), count, stream, seed, w0, w1);
    for (int j = 0; j < count; ++j) {
      // An explicit fused multiply-add: left to itself the compiler contracts `lo + range * u`
      // into an FMA or not depending on -march and -ffp-contract, and nvcc always does, so
      // only std::fma gives the same bits on every build and on the GPU (the CUDA twin uses
      // fmaf).
      out[start + j] = std::fma(range, uniform_from_bits(w0[j]), lo);
    }
  }
}

void fill_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t offset, float mean, float stddev) {
  alignas(64) std::uint32_t w0[kBlock], w1[kBlock];
  for (std::int64_t start = 0; start < n; start += kBlock) {
    const int count = static_cast<int>(std::min<std::int64_t>(kBlock, n - start));
    philox_block(offset + static_cast<std::uint64_t>(start), count, stream, seed, w0, w1);
    // Box-Muller with the polynomial log and cosine of philox.h (the GPU's too): branch-free,
    // so this loop vectorises as well.
    for (int j = 0; j < count; ++j) {
      out[start + j] = std::fma(stddev, normal_from_bits(w0[j], w1[j]), mean);
    }
  }
}

}  // namespace nanoddp::kernels::cpu
