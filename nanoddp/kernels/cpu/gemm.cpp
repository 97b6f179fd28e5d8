// GEMM on the CPU through Eigen. Eigen's product kernel is a packed, cache-blocked GEMM (the
// same GotoBLAS scheme as OpenBLAS), vectorised for whatever -march we are compiled with, and
// parallelised with OpenMP when more than one thread is allowed. We only describe the operands
// to it: our buffers are dense row-major, so each one is an Eigen::Map with no copy.

// GCC 12 reports a false -Wmaybe-uninitialized inside its own AVX-512 intrinsics
// (_mm512_undefined_ps is *meant* to be uninitialised) when Eigen's kernel inlines them. The
// warning fires after inlining, so it can only be silenced for the whole translation unit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <Eigen/Core>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;

// C = alpha * op(A) op(B) + beta * C for already-transposed expressions. Three cases so that
// no temporary is ever made and, for beta == 0, C is never read (it may hold NaN garbage):
//  - `c.noalias() = alpha * a * b` makes Eigen zero C and run its GEMM with alpha folded in;
//  - `c.noalias() += ...` is the beta == 1 accumulation (the gradient-accumulation case);
//  - any other beta scales C first, then accumulates.
// .noalias() promises Eigen that C does not overlap A or B, so it writes C directly instead of
// evaluating into a temporary and copying.
template <typename OpA, typename OpB>
void gemm_into(const OpA& a, const OpB& b, float alpha, float beta, MatrixMap& c) {
  if (beta == 0.0f) {
    c.noalias() = (alpha * a) * b;
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += (alpha * a) * b;
  }
}

}  // namespace

void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c) {
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
  const ConstMatrixMap a_map(a, ta ? k : m, ta ? m : k);
  const ConstMatrixMap b_map(b, tb ? n : k, tb ? k : n);
  if (!ta && !tb) {
    gemm_into(a_map, b_map, alpha, beta, c_map);
  } else if (!ta && tb) {
    gemm_into(a_map, b_map.transpose(), alpha, beta, c_map);
  } else if (ta && !tb) {
    gemm_into(a_map.transpose(), b_map, alpha, beta, c_map);
  } else {
    gemm_into(a_map.transpose(), b_map.transpose(), alpha, beta, c_map);
  }
}

// Eigen keeps its own thread count (it parallelises its GEMM with OpenMP when the library is
// built with it; otherwise it always uses one thread and this is a no-op).
void set_gemm_threads(int threads) {
  Eigen::setNbThreads(threads < 1 ? 1 : threads);
}

int gemm_threads() {
  return Eigen::nbThreads();
}

}  // namespace nanoddp::kernels::cpu
