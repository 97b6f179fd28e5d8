// Reductions. The bias gradient (column_sum) walks the matrix row by row, adding each row into
// a row of accumulators, so memory is read contiguously and the inner loop vectorises across
// columns. Accumulators are double: a sum over a large batch then loses no more than one float
// rounding at the end, which keeps the CPU a trustworthy reference for the CUDA twins.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {

void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out) {
  std::vector<double> acc(static_cast<std::size_t>(cols), 0.0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * cols;
    for (std::int64_t j = 0; j < cols; ++j) acc[j] += row[j];
  }
  // beta == 0 must not read out (it may be uninitialised): 0 * NaN would be NaN.
  for (std::int64_t j = 0; j < cols; ++j) {
    out[j] = beta == 0.0f ? static_cast<float>(acc[j])
                          : static_cast<float>(beta * static_cast<double>(out[j]) + acc[j]);
  }
}

void sum(const float* x, std::int64_t n, float* out) {
  // Four independent accumulators let the compiler keep several adds in flight (a single
  // double accumulator is a serial dependency chain, one add per ~4 cycles).
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    acc[0] += x[i];
    acc[1] += x[i + 1];
    acc[2] += x[i + 2];
    acc[3] += x[i + 3];
  }
  for (; i < n; ++i) acc[0] += x[i];
  out[0] = static_cast<float>((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

void count_nonfinite(const float* x, std::int64_t n, float* out) {
  // A float is NaN or +-Inf exactly when its 8 exponent bits are all ones. Testing the bits
  // (instead of std::isfinite on a bool) is an integer compare and add that the compiler turns
  // into one AVX-512 mask-compare per 16 floats; the check of a model's whole gradient buffer
  // then runs at memory speed. 32-bit lane counters, so the work goes in chunks that cannot
  // overflow them.
  constexpr std::uint32_t kExponent = 0x7f800000u;
  constexpr std::int64_t kChunk = std::int64_t{1} << 30;
  std::int64_t total = 0;
  for (std::int64_t start = 0; start < n; start += kChunk) {
    const std::int64_t end = std::min(n, start + kChunk);
    std::uint32_t count = 0;
    for (std::int64_t i = start; i < end; ++i) {
      count += (std::bit_cast<std::uint32_t>(x[i]) & kExponent) == kExponent ? 1u : 0u;
    }
    total += count;
  }
  out[0] = static_cast<float>(total);
}

}  // namespace nanoddp::kernels::cpu
