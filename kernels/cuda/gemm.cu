// The hand-written GEMM: C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, row-major.
//
// A naive GEMM gives each thread one C element and reads a whole row of op(A) and a whole column
// of op(B) from global memory: 2k loads per 2k flops, so the kernel waits on memory all the time.
// The classic cure, used here, is tiling:
//
//  1. Block tiling. Each thread block owns a kBM x kBN (64 x 64) tile of C. It walks along k in
//     slices of kBK (16): the block cooperatively copies a 64 x 16 slice of op(A) and a 16 x 64
//     slice of op(B) into shared memory, then every thread reads those from shared memory (fast,
//     on-chip) many times. Each global element is now loaded once per block instead of once per
//     thread that needs it: 64x fewer global loads.
//
//  2. Register micro-tiles. Each of the 256 threads computes a 4 x 4 patch of the 64 x 64 tile.
//     For one k step it loads 4 values of op(A) and 4 of op(B) from shared memory into registers
//     and does 16 fused multiply-adds with them: 8 shared loads per 16 FMAs instead of 2 per 1.
//
// The 4 x 4 patch is strided: thread (ty, tx) owns rows ty + 16*r and columns tx + 16*c. Then
// the 16 threads of a half-warp that share ty read 16 *consecutive* shared-memory words of the B
// slice (no bank conflicts) and the same word of the A slice (a broadcast), and their stores to
// C are consecutive addresses (coalesced).
//
// Any m, n, k works: tile loads outside the matrix store zeros into shared memory (a zero adds
// nothing to the dot products), and stores outside C are skipped. The four transpose layouts
// are four instantiations of one template: only the tile loads differ, and each layout's load
// is arranged so that consecutive threads read consecutive global addresses (coalescing).

#include <algorithm>
#include <cstdint>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

constexpr int kBM = 64;                              // rows of C per block
constexpr int kBN = 64;                              // columns of C per block
constexpr int kBK = 16;                              // depth of one shared-memory slice
constexpr int kTM = 4;                               // rows of C per thread
constexpr int kTN = 4;                               // columns of C per thread
constexpr int kThreadsX = kBN / kTN;                 // 16
constexpr int kThreadsY = kBM / kTM;                 // 16
constexpr int kGemmThreads = kThreadsX * kThreadsY;  // 256
// Each slice holds kBM * kBK = 1024 elements of op(A) (and as many of op(B)): 4 per thread.
constexpr int kLoadsPerThread = kBM * kBK / kGemmThreads;
static_assert(kBM * kBK == kBN * kBK, "the A and B slices are loaded with the same loop");
static_assert(kLoadsPerThread * kGemmThreads == kBM * kBK, "slices must split evenly");

// Shared slices are stored k-major ([kk][row] and [kk][col]) so that the inner loop reads a row
// of each. The k-contiguous layouts (A not transposed, B transposed) store a warp's 32 values as
// 16 consecutive kk for each of two rows/columns: word kk * stride + i. With a row stride of 65
// (+1) kk steps one bank and i steps one bank, so the two halves overlap in 15 banks (a 2-way
// conflict). A stride of 66 (+2) puts the 16 kk on the even banks and the second half on the odd
// ones: all 32 distinct. The other layouts store 32 consecutive words of one row, conflict-free
// for any stride; the inner loop's reads are broadcasts either way. The static_asserts below
// check this arithmetic; the speed-up itself is unmeasured until a GPU run (docs/benchmarks.md).
constexpr int kPad = 2;

// The shared-memory word that the slice load stores element `idx` of a slice to (the index
// arithmetic of load_a_tile / load_b_tile below: `k_fastest` is the k-contiguous layout).
constexpr int tile_word(int idx, bool k_fastest) {
  const int kk = k_fastest ? idx % kBK : idx / kBM;
  const int i = k_fastest ? idx / kBK : idx % kBM;
  return kk * (kBM + kPad) + i;
}
// The most stores of one warp that land in one of the 32 banks (1 = conflict-free), over every
// warp of every load round.
constexpr int worst_store_conflict(bool k_fastest) {
  int worst = 1;
  for (int warp_start = 0; warp_start < kBM * kBK; warp_start += 32) {
    int per_bank[32] = {};
    for (int lane = 0; lane < 32; ++lane) {
      const int bank = tile_word(warp_start + lane, k_fastest) % 32;
      per_bank[bank] += 1;
      worst = per_bank[bank] > worst ? per_bank[bank] : worst;
    }
  }
  return worst;
}
static_assert(worst_store_conflict(true) == 1, "k-contiguous tile stores conflict on a bank");
static_assert(worst_store_conflict(false) == 1, "row-contiguous tile stores conflict on a bank");

// Copies the kBK x kBM slice of op(A) starting at (row0, k0) into a_tile[kk][i].
// op(A)[i][kk] is a[i * k + kk] (kNo, A stored m x k) or a[kk * m + i] (kYes, A stored k x m).
template <bool kTransA>
__device__ __forceinline__ void load_a_tile(const float* __restrict__ a, std::int64_t m,
                                            std::int64_t k, std::int64_t row0, std::int64_t k0,
                                            float (*a_tile)[kBM + kPad]) {
  const int t = threadIdx.y * kThreadsX + threadIdx.x;
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const int idx = t + l * kGemmThreads;
    // Pick the fastest-varying index along the contiguous direction of the stored matrix.
    const int kk = kTransA ? idx / kBM : idx % kBK;
    const int i = kTransA ? idx % kBM : idx / kBK;
    const std::int64_t row = row0 + i;
    const std::int64_t col = k0 + kk;
    float value = 0.0f;
    if (row < m && col < k) value = kTransA ? a[col * m + row] : a[row * k + col];
    a_tile[kk][i] = value;
  }
}

// Copies the kBK x kBN slice of op(B) starting at (k0, col0) into b_tile[kk][j].
// op(B)[kk][j] is b[kk * n + j] (kNo, B stored k x n) or b[j * k + kk] (kYes, B stored n x k).
template <bool kTransB>
__device__ __forceinline__ void load_b_tile(const float* __restrict__ b, std::int64_t n,
                                            std::int64_t k, std::int64_t k0, std::int64_t col0,
                                            float (*b_tile)[kBN + kPad]) {
  const int t = threadIdx.y * kThreadsX + threadIdx.x;
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const int idx = t + l * kGemmThreads;
    const int kk = kTransB ? idx % kBK : idx / kBN;
    const int j = kTransB ? idx / kBK : idx % kBN;
    const std::int64_t row = k0 + kk;
    const std::int64_t col = col0 + j;
    float value = 0.0f;
    if (row < k && col < n) value = kTransB ? b[col * k + row] : b[row * n + col];
    b_tile[kk][j] = value;
  }
}

template <bool kTransA, bool kTransB>
__global__ void __launch_bounds__(kGemmThreads)
    gemm_kernel(std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* __restrict__ a, const float* __restrict__ b, float beta,
                float* __restrict__ c) {
  __shared__ float a_tile[kBK][kBM + kPad];
  __shared__ float b_tile[kBK][kBN + kPad];

  const int tx = threadIdx.x;  // 0..15: column within the micro-tile pattern
  const int ty = threadIdx.y;  // 0..15: row within the micro-tile pattern
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.x) * kBN;
  const std::int64_t tiles_m = (m + kBM - 1) / kBM;

  // gridDim.y is limited to 65535, so blocks stride over row tiles when m is huge.
  for (std::int64_t tile_m = blockIdx.y; tile_m < tiles_m; tile_m += gridDim.y) {
    const std::int64_t row0 = tile_m * kBM;
    float acc[kTM][kTN] = {};

    for (std::int64_t k0 = 0; k0 < k; k0 += kBK) {
      load_a_tile<kTransA>(a, m, k, row0, k0, a_tile);
      load_b_tile<kTransB>(b, n, k, k0, col0, b_tile);
      // Every thread must see the complete slices before using them.
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        // Stage this k step's operands in registers, then do kTM * kTN FMAs from registers.
        float a_reg[kTM];
        float b_reg[kTN];
#pragma unroll
        for (int r = 0; r < kTM; ++r) a_reg[r] = a_tile[kk][ty + r * kThreadsY];
#pragma unroll
        for (int cc = 0; cc < kTN; ++cc) b_reg[cc] = b_tile[kk][tx + cc * kThreadsX];
#pragma unroll
        for (int r = 0; r < kTM; ++r) {
#pragma unroll
          for (int cc = 0; cc < kTN; ++cc) acc[r][cc] = fmaf(a_reg[r], b_reg[cc], acc[r][cc]);
        }
      }
      // Nobody may overwrite the slices (next iteration) while others still read them.
      __syncthreads();
    }

    // Epilogue: scale and store. With beta == 0, C is never read, so it may hold garbage/NaN.
#pragma unroll
    for (int r = 0; r < kTM; ++r) {
      const std::int64_t row = row0 + ty + r * kThreadsY;
      if (row >= m) continue;
#pragma unroll
      for (int cc = 0; cc < kTN; ++cc) {
        const std::int64_t col = col0 + tx + cc * kThreadsX;
        if (col >= n) continue;
        float* out = c + row * n + col;
        const float result = alpha * acc[r][cc];
        *out = beta == 0.0f ? result : result + beta * *out;
      }
    }
  }
}

template <bool kTransA, bool kTransB>
void launch_gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                 const float* b, float beta, float* c, cudaStream_t stream) {
  const std::int64_t tiles_n = (n + kBN - 1) / kBN;
  const std::int64_t tiles_m = (m + kBM - 1) / kBM;
  // gridDim.x may reach 2^31 - 1 blocks: n up to 1.3e11 columns, far beyond any real matrix.
  if (tiles_n > 0x7fffffff) throw CudaError("gemm: n is too large for one grid");
  const dim3 grid(static_cast<unsigned>(tiles_n),
                  static_cast<unsigned>(std::min<std::int64_t>(tiles_m, 65535)));
  const dim3 block(kThreadsX, kThreadsY);
  gemm_kernel<kTransA, kTransB><<<grid, block, 0, stream>>>(m, n, k, alpha, a, b, beta, c);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  if (alpha == 0.0f || k <= 0) {
    // BLAS semantics: A and B are not read (so 0 * Inf in them cannot turn C into NaN) and
    // C = beta * C, where beta == 0 still means "overwrite without reading".
    if (beta == 0.0f) {
      fill(c, m * n, 0.0f, stream);
    } else if (beta != 1.0f) {
      scale(c, m * n, beta, stream);
    }
    return;
  }
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  if (!ta && !tb) launch_gemm<false, false>(m, n, k, alpha, a, b, beta, c, stream);
  if (!ta && tb) launch_gemm<false, true>(m, n, k, alpha, a, b, beta, c, stream);
  if (ta && !tb) launch_gemm<true, false>(m, n, k, alpha, a, b, beta, c, stream);
  if (ta && tb) launch_gemm<true, true>(m, n, k, alpha, a, b, beta, c, stream);
}

}  // namespace nanoddp::kernels::cuda
