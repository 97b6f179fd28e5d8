// nanoddp's own CPU GEMM for the layouts a linear layer needs (AVX-512), with Eigen
// (gemm_eigen.cpp) as the reference and the fallback.
//
// Why not just Eigen? A linear layer's GEMMs are short and wide: batch x 1024 x 1024 with a batch
// of 64. Eigen (like every GotoBLAS-style GEMM) first *packs* each operand into cache-sized
// panels, then runs its register kernel over the panels. Packing the 4 MiB weight matrix is a pass
// over memory with no arithmetic in it, and in training the weights are cold (a whole step of
// other layers went through the cache since), so that pass waits on DRAM. Here the big operand is
// never repacked where it can be avoided: the small one (the batch, 256 KiB) is laid out once so
// the register kernel can stream the big one straight from memory while it computes, and the
// hardware prefetcher hides the DRAM latency behind the FMAs. On this project's EPYC (Zen 5) the
// MLP's GEMMs run at 1.3-1.7x Eigen's speed warm, and a training step's 11 GEMMs in order (cold)
// at 1.5x (docs/benchmarks.md).
//
// Two register kernels, each a 6 x 64 tile of C in 24 AVX-512 accumulators (of 32 registers),
// updated once per step p of the inner dimension by 24 FMAs:
//  - "broadcast B" (forward, Y = X W^T): 64 rows of X, transposed once into xt[p][0..64), are
//    four vector loads; six weight rows are six scalar broadcasts, each row read front to back.
//    A small batch (16 or 32 rows) takes one or two vector loads and 12 weight rows instead.
//  - "broadcast A" (dX = dY W and dW = dY^T X): 64 columns of B, copied into a contiguous panel
//    bp[p][0..64), are four vector loads; six rows of A are six broadcasts.
// Each element of C is one FMA chain over p, in order: the result does not depend on the number
// of threads (they split tiles, never a sum), so --threads changes the speed and not the bits.

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports a false -Wmaybe-uninitialized inside its own AVX-512 intrinsics
// (_mm512_undefined_ps is *meant* to be uninitialised); see gemm_eigen.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "nanoddp/kernels/cpu/kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace nanoddp::kernels::cpu {
namespace {

std::atomic<int> gemm_thread_count{1};

void scale_output(float* c, std::int64_t count, float beta) {
  if (beta == 0.0f) {
    std::fill(c, c + count, 0.0f);  // "overwrite": the old contents may be NaN garbage
  } else if (beta != 1.0f) {
    for (std::int64_t i = 0; i < count; ++i) c[i] *= beta;
  }
}

#if defined(__AVX512F__)

constexpr int kLanes = 16;           // floats in one AVX-512 register
constexpr int kPanel = 4 * kLanes;   // 64: the vectorised side of a tile
constexpr int kTileRows = 6;         // the broadcast side of a tile
constexpr std::int64_t kAlign = 64;  // bytes: one cache line, one register
// "broadcast A" packs all of B up front when it is this small (it then stays in L2, and C is
// written row after row); a larger B is packed one 64-column panel at a time.
constexpr std::int64_t kPackAllFloats = (std::int64_t{1} << 20) / sizeof(float);

// A growable, 64-byte aligned buffer for packed operands, one per calling thread: it reaches its
// largest size in the first step and is reused after that, so training allocates nothing new.
class Scratch {
 public:
  float* get(std::int64_t floats) {
    if (floats > capacity_) {
      const auto bytes = static_cast<std::size_t>((floats * 4 + kAlign - 1) / kAlign * kAlign);
      data_.reset(static_cast<float*>(std::aligned_alloc(kAlign, bytes)));
      if (!data_) throw std::bad_alloc();
      capacity_ = floats;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  std::int64_t capacity_ = 0;
};

thread_local Scratch scratch_a;
thread_local Scratch scratch_b;

// out = alpha * acc + beta * out for the lanes in `mask`; with beta == 0 the old value is not
// read (it may be NaN garbage).
inline void store_lanes(float* out, __m512 acc, __mmask16 mask, float alpha, float beta) {
  __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), acc);
  if (beta != 0.0f) {
    r = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, out), r);
  }
  _mm512_mask_storeu_ps(out, mask, r);
}

// Which of the parallel region's threads this is (0 outside one, or without OpenMP).
inline std::int64_t worker_index() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline __mmask16 lanes_below(std::int64_t count) {  // the first min(count, 16) lanes
  if (count >= kLanes) return static_cast<__mmask16>(0xFFFF);
  return static_cast<__mmask16>((1u << count) - 1u);
}

// ---- "broadcast A": C[m, n] = alpha * sum_p A[m, p] B[p, n] + beta * C -------------------------
// `a` is row-major with row stride lda (op(A) already untransposed), `bp` a k x 64 panel of B.
// Computes rows [0, rows) (rows <= 6) and columns [0, cols) (cols <= 64) of a tile of C. Rows past
// `rows` repeat the last row's address: they compute a copy that is never stored, so the tail of
// the matrix needs no second kernel.
void tile_broadcast_a(const float* a, std::int64_t lda, const float* bp, std::int64_t k,
                      std::int64_t rows, std::int64_t cols, float alpha, float beta, float* c,
                      std::int64_t ldc) {
  const float* row[kTileRows];
  for (int r = 0; r < kTileRows; ++r) row[r] = a + std::min<std::int64_t>(r, rows - 1) * lda;
  __m512 acc[kTileRows][4];
  for (auto& r : acc) {
    for (auto& v : r) v = _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < k; ++p, bp += kPanel) {
    const __m512 b0 = _mm512_load_ps(bp);
    const __m512 b1 = _mm512_load_ps(bp + 16);
    const __m512 b2 = _mm512_load_ps(bp + 32);
    const __m512 b3 = _mm512_load_ps(bp + 48);
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 ar = _mm512_set1_ps(row[r][p]);
      acc[r][0] = _mm512_fmadd_ps(b0, ar, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b1, ar, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(b2, ar, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(b3, ar, acc[r][3]);
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int v = 0; v < 4; ++v) {
      const std::int64_t left = cols - v * kLanes;
      if (left <= 0) break;
      store_lanes(c + r * ldc + v * kLanes, acc[r][v], lanes_below(left), alpha, beta);
    }
  }
}

// Copies columns [col, col + 64) of the k x n row-major B into a k x 64 panel, zero past n.
void pack_panel(const float* b, std::int64_t k, std::int64_t n, std::int64_t col, float* bp) {
  const std::int64_t width = std::min<std::int64_t>(kPanel, n - col);
  for (std::int64_t p = 0; p < k; ++p) {
    const float* src = b + p * n + col;
    float* dst = bp + p * kPanel;
    for (int v = 0; v < 4; ++v) {
      const __mmask16 mask = lanes_below(std::max<std::int64_t>(0, width - v * kLanes));
      _mm512_store_ps(dst + v * kLanes, _mm512_maskz_loadu_ps(mask, src + v * kLanes));
    }
  }
}

// C = alpha * A B + beta * C with A m x k (row stride lda) and B k x n, both row-major.
void gemm_broadcast_a(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                      std::int64_t lda, const float* b, float beta, float* c, int threads) {
  const std::int64_t panels = (n + kPanel - 1) / kPanel;
  const std::int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  auto tile = [&](std::int64_t t, std::int64_t panel, const float* bp) {
    const std::int64_t r0 = t * kTileRows;
    const std::int64_t c0 = panel * kPanel;
    tile_broadcast_a(a + r0 * lda, lda, bp, k, std::min<std::int64_t>(kTileRows, m - r0),
                     std::min<std::int64_t>(kPanel, n - c0), alpha, beta, c + r0 * n + c0, n);
  };
  if (k * panels * kPanel <= kPackAllFloats) {
    // dW = dY^T X: B (the batch) is small. Pack all of it, then walk C row tile by row tile.
    float* bp = scratch_b.get(k * panels * kPanel);
    for (std::int64_t panel = 0; panel < panels; ++panel) {
      pack_panel(b, k, n, panel * kPanel, bp + panel * k * kPanel);
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (std::int64_t t = 0; t < row_tiles; ++t) {
      for (std::int64_t panel = 0; panel < panels; ++panel) tile(t, panel, bp + panel * k * kPanel);
    }
    return;
  }
  // dX = dY W: B (the weight) is large and read once, a 64-column panel at a time; the panel
  // (k x 256 B) stays in L2 while every row tile of the small A goes over it. Threads take whole
  // panels, each packing into its own slice of the scratch (allocated here, not inside the
  // parallel region, where an exception could not be caught).
  float* slices = scratch_b.get(threads * k * kPanel);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (std::int64_t panel = 0; panel < panels; ++panel) {
    float* bp = slices + worker_index() * k * kPanel;
    pack_panel(b, k, n, panel * kPanel, bp);
    for (std::int64_t t = 0; t < row_tiles; ++t) tile(t, panel, bp);
  }
}

// ---- transposes ---------------------------------------------------------------------------
// dst[c * ldd + r] = src[r * lds + c] for a rows x cols block, in 16 x 16 tiles: each tile's 16
// source and 16 destination lines stay in L1 while it is turned, where a plain double loop would
// miss on every write once a column of the destination outgrows the cache.
void transpose(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
               std::int64_t ldd) {
  constexpr std::int64_t kT = 16;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kT) {
    const std::int64_t r1 = std::min(rows, r0 + kT);
    for (std::int64_t c0 = 0; c0 < cols; c0 += kT) {
      const std::int64_t c1 = std::min(cols, c0 + kT);
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) dst[c * ldd + r] = src[r * lds + c];
      }
    }
  }
}

// ---- "broadcast B": C[m, n] = alpha * sum_p A[m, p] B[n, p] + beta * C -------------------------
// `xt` is a k x 64 panel of A transposed (row p holds A[0..64, p]); `b` points at B's row n0.
// Computes C[0..rows, n0..n0 + cols) with rows <= 16 * kVecs, cols <= kCols. kVecs registers
// cover the rows, so a block of 16 or 32 rows (a small batch) wastes no lanes. They hold C
// transposed (register j, lane i is C[i, n0 + j]), so they go out through a small buffer. Columns
// past `cols` repeat the last column's weights: computed, never stored.
template <int kVecs, int kCols>
void tile_broadcast_b(const float* xt, const float* b, std::int64_t ldb, std::int64_t k,
                      std::int64_t rows, std::int64_t cols, float alpha, float beta, float* c,
                      std::int64_t ldc) {
  const float* brow[kCols];
  for (int j = 0; j < kCols; ++j) brow[j] = b + std::min<std::int64_t>(j, cols - 1) * ldb;
  __m512 acc[kCols][kVecs];
  for (auto& col : acc) {
    for (auto& v : col) v = _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < k; ++p, xt += kPanel) {
    __m512 x[kVecs];
    for (int v = 0; v < kVecs; ++v) x[v] = _mm512_load_ps(xt + v * kLanes);
    for (int j = 0; j < kCols; ++j) {
      const __m512 bj = _mm512_set1_ps(brow[j][p]);
      for (int v = 0; v < kVecs; ++v) acc[j][v] = _mm512_fmadd_ps(x[v], bj, acc[j][v]);
    }
  }
  alignas(kAlign) float out[kCols][kVecs * kLanes];
  for (int j = 0; j < kCols; ++j) {
    for (int v = 0; v < kVecs; ++v) _mm512_store_ps(&out[j][v * kLanes], acc[j][v]);
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float prod = alpha * out[j][i];
      ci[j] = beta == 0.0f ? prod : std::fma(beta, ci[j], prod);
    }
  }
}

// One block of up to 64 rows of C: column tiles of kCols, split between the threads.
template <int kVecs>
void block_broadcast_b(const float* xt, std::int64_t rows, std::int64_t n, std::int64_t k,
                       float alpha, const float* b, float beta, float* c,
                       [[maybe_unused]] int threads) {  // used by the pragma (without OpenMP: not)
  // 24 accumulators where they fit (6 x 4, 8 x 3, 12 x 2), but never more than 12 weight rows:
  // rows 4 KiB apart (1024 floats) fall into one set of the 12-way L1 cache, so a 13th
  // stream would evict the first at every step of p.
  constexpr int kCols = std::min(12, 24 / kVecs);
  const std::int64_t col_tiles = (n + kCols - 1) / kCols;
  // Each column tile streams kCols weight rows front to back: sequential streams that the
  // prefetcher follows, so W comes from DRAM at full speed while the FMAs run.
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (std::int64_t t = 0; t < col_tiles; ++t) {
    const std::int64_t n0 = t * kCols;
    tile_broadcast_b<kVecs, kCols>(xt, b + n0 * k, k, k, rows,
                                   std::min<std::int64_t>(kCols, n - n0), alpha, beta, c + n0, n);
  }
}

// C = alpha * A B^T + beta * C with A m x k and B n x k, both row-major (the forward pass).
void gemm_broadcast_b(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                      const float* b, float beta, float* c, int threads) {
  float* xt = scratch_a.get(k * kPanel);
  for (std::int64_t row = 0; row < m; row += kPanel) {
    const std::int64_t rows = std::min<std::int64_t>(kPanel, m - row);
    // Rows of A past the block's end are zero in the panel: they feed lanes never stored.
    const std::int64_t vecs = (rows + kLanes - 1) / kLanes;
    if (rows % kLanes != 0) {
      for (std::int64_t p = 0; p < k; ++p)
        std::fill_n(xt + p * kPanel + rows, vecs * kLanes - rows, 0.0f);
    }
    transpose(a + row * k, k, rows, k, xt, kPanel);
    float* c_block = c + row * n;
    switch (vecs) {
      case 1:
        block_broadcast_b<1>(xt, rows, n, k, alpha, b, beta, c_block, threads);
        break;
      case 2:
        block_broadcast_b<2>(xt, rows, n, k, alpha, b, beta, c_block, threads);
        break;
      case 3:
        block_broadcast_b<3>(xt, rows, n, k, alpha, b, beta, c_block, threads);
        break;
      default:
        block_broadcast_b<4>(xt, rows, n, k, alpha, b, beta, c_block, threads);
        break;
    }
  }
}

// A^T for the dW layout (A stored k x m): m x k row-major, so "broadcast A" reads it in rows.
const float* transposed_copy(const float* a, std::int64_t k, std::int64_t m) {
  float* at = scratch_a.get(m * k);
  transpose(a, m, k, m, at, k);
  return at;
}

#endif  // __AVX512F__

}  // namespace

bool gemm_has_own_kernels() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  // BLAS semantics: with alpha == 0 (or an empty inner dimension) A and B are not read, so
  // 0 * Inf never turns C into NaN. C becomes beta * C, and beta == 0 still means "overwrite".
  if (alpha == 0.0f || k <= 0) {
    scale_output(c, m * n, beta);
    return;
  }
#if defined(__AVX512F__)
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  const int threads = gemm_threads();
  if (!ta && tb) {  // forward: Y = X W^T
    gemm_broadcast_b(m, n, k, alpha, a, b, beta, c, threads);
    return;
  }
  if (!ta && !tb) {  // dX = dY W (and matmul)
    gemm_broadcast_a(m, n, k, alpha, a, k, b, beta, c, threads);
    return;
  }
  if (ta && !tb) {  // dW = dY^T X: transpose the small dY once, then as above
    gemm_broadcast_a(m, n, k, alpha, transposed_copy(a, k, m), k, b, beta, c, threads);
    return;
  }
#endif
  // Both operands transposed (no layer needs it), or no AVX-512: Eigen.
  gemm_eigen(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

// nanoddp defaults to ONE thread: a data-parallel job runs one process per core group, and
// several ranks each using all cores would oversubscribe the machine. gemm_eigen() shares its
// slices among this many threads and keeps Eigen's own count at one on every call (setting an
// int), so Eigen's default (every OpenMP thread) never applies.
void set_gemm_threads(int threads) {
  gemm_thread_count.store(threads < 1 ? 1 : threads, std::memory_order_relaxed);
}

int gemm_threads() {
  return gemm_thread_count.load(std::memory_order_relaxed);
}

}  // namespace nanoddp::kernels::cpu
