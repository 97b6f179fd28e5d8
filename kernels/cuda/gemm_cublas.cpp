// GEMM through cuBLAS: the reference (and the fast path) for the hand-written kernel.
//
// cuBLAS is column-major; nanoddp is row-major. A row-major r x c matrix occupies memory exactly
// like a column-major c x r matrix, i.e. cuBLAS sees every row-major matrix transposed. So
// instead of C = op(A) op(B) we ask cuBLAS for the transposed product, which needs no copies:
//     C^T = op(B)^T op(A)^T
// cuBLAS gets B where it expects its first operand and A as its second, with the same
// transpose flags, and "column-major C^T (n x m, leading dimension n)" is our row-major C.

#include <climits>
#include <cstdint>
#include <string>

#include "nanoddp/kernels/cuda/check.h"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {

void gemm_cublas(cublasHandle_t handle, Transpose trans_a, Transpose trans_b, std::int64_t m,
                 std::int64_t n, std::int64_t k, float alpha, const float* a, const float* b,
                 float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    throw CudaError("gemm_cublas: sizes " + std::to_string(m) + " x " + std::to_string(n) + " x " +
                    std::to_string(k) + " exceed cuBLAS's 32-bit limit");
  }
  // alpha and beta are host values; make sure an earlier user of the handle did not switch it
  // to device pointers.
  NANODDP_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  if (alpha == 0.0f || k <= 0) {
    // C = beta * C without reading A and B (BLAS semantics; also, cuBLAS rejects the leading
    // dimension 0 of an empty inner dimension): cuBLAS's scal, or a memset when beta == 0,
    // which must not read C.
    cudaStream_t stream = nullptr;
    NANODDP_CUBLAS_CHECK(cublasGetStream(handle, &stream));
    const std::int64_t count = m * n;
    if (beta == 0.0f) {
      NANODDP_CUDA_CHECK(
          cudaMemsetAsync(c, 0, static_cast<std::size_t>(count) * sizeof(float), stream));
    } else if (beta != 1.0f) {
      NANODDP_CUBLAS_CHECK(cublasSscal_64(handle, count, &beta, c, 1));
    }
    return;
  }
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const cublasOperation_t op_a = trans_a == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Leading dimension = row length of the stored row-major matrix.
  const int lda = trans_a == Transpose::kYes ? mi : ki;  // A stored k x m, or m x k
  const int ldb = trans_b == Transpose::kYes ? ki : ni;  // B stored n x k, or k x n
  NANODDP_CUBLAS_CHECK(
      cublasSgemm(handle, op_b, op_a, ni, mi, ki, &alpha, b, ldb, a, lda, &beta, c, ni));
}

}  // namespace nanoddp::kernels::cuda
