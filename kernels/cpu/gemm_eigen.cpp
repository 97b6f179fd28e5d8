// GEMM on the CPU through Eigen: the reference that nanoddp's own kernels (gemm.cpp) are tested
// and benchmarked against, and the path for builds without AVX-512. Eigen's product kernel is a
// packed, cache-blocked GEMM (the same GotoBLAS scheme as OpenBLAS), vectorised for whatever
// -march we are compiled with. We only describe the operands to it: our buffers are dense
// row-major, so each one is an Eigen::Map with no copy.
//
// Threads: not Eigen's own. Eigen sizes its blocks by its thread count (its depth block kc
// shrinks as threads are added), and the depth blocks are the order in which each element of C
// is summed: the same product on 1 and 3 threads differed in its last bits, so --threads
// changed a training run. Here C is cut into slices fixed by the shape alone, each is one
// single-threaded Eigen product, and threads only share out the slices, as the own kernels
// share out their tiles: the bits are the same for every thread count.

// GCC 12 reports a false -Wmaybe-uninitialized inside its own AVX-512 intrinsics
// (_mm512_undefined_ps is *meant* to be uninitialised) when Eigen's kernel inlines them. The
// warning fires after inlining, so it can only be silenced for the whole translation unit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <Eigen/Core>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include <bit>
#include <cstdint>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {
namespace {

// Why an accumulating GEMM (beta == 1) first reads its output once, front to back.
// Eigen's kernel updates C in small register tiles that hop across C's rows: a pattern the
// hardware prefetcher cannot follow, so when C is cold (a weight gradient of a few MiB, last
// touched a whole step ago) nearly every tile waits on memory. One sequential pass, a load per
// cache line, brings C into L2/L3 at streaming bandwidth instead. For a 1024 x 1024 gradient
// accumulated in training order (--grad-accum) that is 0.95 ms per dW GEMM instead of 1.3 on
// this machine's EPYC. beta == 0 needs no pass: Eigen's zero fill is already one, and smaller
// outputs (below 1 MiB) stay in cache between uses anyway.
constexpr std::int64_t kPullIntoCacheFloats = (std::int64_t{1} << 20) / sizeof(float);

void pull_into_cache(const float* p, std::int64_t n) {
  constexpr std::int64_t kFloatsPerLine = 64 / sizeof(float);
  std::uint32_t sink = 0;  // integer XOR: no floating-point latency chain, no NaN traps
  for (std::int64_t i = 0; i < n; i += kFloatsPerLine) sink ^= std::bit_cast<std::uint32_t>(p[i]);
  asm volatile("" : : "r"(sink));  // keeps the loads: the compiler must assume sink is used
}

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using SliceMap = Eigen::Map<RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

// Rows (or columns) of C per slice. Large enough that re-packing the other operand for each
// slice costs little against the slice's own work; small enough that a linear layer's GEMMs
// (1024 wide) give every thread of a small machine a slice.
constexpr std::int64_t kSlice = 256;

// C = alpha * op(A) op(B) + beta * C for already-transposed expressions. Three cases so that
// no temporary is ever made and, for beta == 0, C is never read (it may hold NaN garbage):
//  - `c.noalias() = alpha * a * b` makes Eigen zero C and run its GEMM with alpha folded in;
//  - `c.noalias() += ...` is the beta == 1 accumulation (the gradient-accumulation case);
//  - any other beta scales C first, then accumulates.
// .noalias() promises Eigen that C does not overlap A or B, so it writes C directly instead of
// evaluating into a temporary and copying.
template <typename OpA, typename OpB>
void gemm_into(const OpA& a, const OpB& b, float alpha, float beta, SliceMap c) {
  if (beta == 0.0f) {
    c.noalias() = (alpha * a) * b;
  } else {
    if (beta != 1.0f) c *= beta;  // a sequential pass over C, so it also leaves C in cache
    c.noalias() += (alpha * a) * b;
  }
}

// C (m x n, row-major) = alpha * a b + beta * C, slice by slice: along C's longer side, in
// slices of kSlice (the last takes what is left), each on one thread.
template <typename OpA, typename OpB>
void gemm_sliced(const OpA& a, const OpB& b, float alpha, float beta, float* c, std::int64_t m,
                 std::int64_t n, [[maybe_unused]] int threads) {  // (without OpenMP: unused)
  if (beta == 1.0f && m * n >= kPullIntoCacheFloats) pull_into_cache(c, m * n);
  const bool by_rows = m >= n;
  const std::int64_t extent = by_rows ? m : n;
  const std::int64_t slices = extent < 2 * kSlice ? 1 : (extent + kSlice - 1) / kSlice;
#pragma omp parallel num_threads(threads) if (threads > 1 && slices > 1)
  {
#if defined(_OPENMP)
    // Eigen threads a product by omp_get_max_threads(), which is this thread's own setting
    // inside this region: 1 keeps every slice one single-threaded product, with no write to
    // Eigen's process-wide thread count (Eigen::setNbThreads), which threads that run GEMMs
    // side by side would race on. A program that sets that count itself overrides this.
    omp_set_num_threads(1);
#endif
#pragma omp for schedule(static)
    for (std::int64_t s = 0; s < slices; ++s) {
      const std::int64_t first = s * kSlice;
      const std::int64_t size = s + 1 == slices ? extent - first : kSlice;
      if (by_rows) {
        gemm_into(a.middleRows(first, size), b, alpha, beta,
                  SliceMap(c + first * n, size, n, Eigen::OuterStride<>(n)));
      } else {
        gemm_into(a, b.middleCols(first, size), alpha, beta,
                  SliceMap(c + first, m, size, Eigen::OuterStride<>(n)));
      }
    }
  }
}

}  // namespace

void gemm_eigen(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n,
                std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  MatrixMap c_map(c, m, n);
  // BLAS semantics: with alpha == 0 (or an empty inner dimension) A and B are not read, so
  // 0 * Inf never turns C into NaN. C becomes beta * C, and beta == 0 still means "overwrite".
  if (alpha == 0.0f || k <= 0) {
    if (beta == 0.0f) {
      c_map.setZero();
    } else if (beta != 1.0f) {
      c_map *= beta;
    }
    return;
  }
  // A stored k x m row-major *is* op(A) = A^T; Eigen's transpose() is a free view, and the
  // GEMM kernel packs either orientation into its panels at the same cost.
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  const int threads = gemm_threads();
  const ConstMatrixMap a_map(a, ta ? k : m, ta ? m : k);
  const ConstMatrixMap b_map(b, tb ? n : k, tb ? k : n);
  if (!ta && !tb) {
    gemm_sliced(a_map, b_map, alpha, beta, c, m, n, threads);
  } else if (!ta && tb) {
    gemm_sliced(a_map, b_map.transpose(), alpha, beta, c, m, n, threads);
  } else if (ta && !tb) {
    gemm_sliced(a_map.transpose(), b_map, alpha, beta, c, m, n, threads);
  } else {
    gemm_sliced(a_map.transpose(), b_map.transpose(), alpha, beta, c, m, n, threads);
  }
}

}  // namespace nanoddp::kernels::cpu
