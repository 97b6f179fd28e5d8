// Reductions: the bias gradient (column sums), sum, the count of non-finite values, and the
// MSE loss with its backward.
//
// All of them are deterministic: the same input gives the same bits on every run. Reductions
// with atomicAdd are not, because the order in which blocks add into the result changes from
// run to run, and float addition is not associative. Here every partial sum is combined in a
// fixed order: threads -> warp (shuffles) -> block (shared memory) -> one final block over the
// per-block partials. Partial sums are kept in double, which is cheap next to the memory
// traffic and keeps the result close to the CPU twin (that accumulates in double too).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "nanoddp/kernels/cuda/common.cuh"
#include "nanoddp/kernels/cuda/kernels.h"

namespace nanoddp::kernels::cuda {
namespace {

// ---- sum-like reductions -------------------------------------------------------------------

// What is summed: x[i] for sum(), (pred[i] - target[i])^2 for the MSE loss.
struct SumTerm {
  const float* x;
  __device__ __forceinline__ double operator()(std::int64_t i) const { return x[i]; }
};
struct SquaredErrorTerm {
  const float* pred;
  const float* target;
  __device__ __forceinline__ double operator()(std::int64_t i) const {
    const double d = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
    return d * d;
  }
};
// 1 for NaN and +-Inf (all exponent bits set), else 0: the sum is their count.
struct NonfiniteTerm {
  const float* x;
  __device__ __forceinline__ double operator()(std::int64_t i) const {
    return (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0;
  }
};

// Up to this size one block does the whole reduction (64 elements per thread), which needs no
// scratch memory and only one launch; above it, a grid of blocks works in parallel.
constexpr std::int64_t kSingleBlockLimit = 1 << 16;
constexpr int kReduceThreads = 1024;
constexpr int kMaxPartials = 1024;

// Pass 1: every block reduces a grid-strided share of the terms to one double. With a single
// block the result is final: it is scaled and written to out[0] as float.
template <typename Term>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_pass1_kernel(Term term, std::int64_t n, double scale, double* partials, float* out) {
  double acc = 0.0;
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    acc += term(i);
  }
  acc = detail::block_reduce_sum(acc);
  if (threadIdx.x == 0) {
    if (out != nullptr) {
      out[0] = static_cast<float>(acc * scale);
    } else {
      partials[blockIdx.x] = acc;
    }
  }
}

// Pass 2: one block adds the per-block partials in a fixed order.
__global__ void __launch_bounds__(kReduceThreads)
    reduce_pass2_kernel(const double* partials, int count, double scale, float* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = detail::block_reduce_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc * scale);
}

// The partials' scratch comes from the device's default memory pool (cudaMallocAsync), whose
// release threshold is 0 by default: at every synchronization the pool hands its free memory
// back to the driver, so the next step's reductions would map it again. Raised once per device
// (the first multi-block reduction on it) to "keep everything": the pool then holds the few KiB
// of partials for good and cudaMallocAsync is a pool hit. Nothing else here allocates from the
// default pool, so this keeps only our own scratch.
void keep_default_pool_memory() {
  static std::mutex mutex;
  static std::vector<int> done;  // device indices already raised
  int device = 0;
  NANODDP_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  if (std::find(done.begin(), done.end(), device) != done.end()) return;
  cudaMemPool_t pool = nullptr;
  NANODDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  NANODDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  done.push_back(device);
}

template <typename Term>
void reduce_to_scalar(Term term, std::int64_t n, double scale, float* out, cudaStream_t stream) {
  if (n <= kSingleBlockLimit) {
    // n == 0 also lands here: the single block writes 0 (the empty sum).
    reduce_pass1_kernel<<<1, kReduceThreads, 0, stream>>>(term, n, scale, nullptr, out);
    NANODDP_CUDA_CHECK_LAUNCH();
    return;
  }
  const int blocks = static_cast<int>(
      std::min<std::int64_t>(kMaxPartials, (n + kReduceThreads - 1) / kReduceThreads));
  // Scratch for the partial sums from the stream-ordered allocator: it is ordered with the
  // kernels on `stream` (so concurrent reductions on other streams get their own), and the
  // driver's memory pool, which keeps it (keep_default_pool_memory), makes it cheap after the
  // first call.
  keep_default_pool_memory();
  void* scratch = nullptr;
  NANODDP_CUDA_CHECK(cudaMallocAsync(&scratch, blocks * sizeof(double), stream));
  auto* partials = static_cast<double*>(scratch);
  reduce_pass1_kernel<<<blocks, kReduceThreads, 0, stream>>>(term, n, scale, partials, nullptr);
  NANODDP_CUDA_CHECK_LAUNCH();
  reduce_pass2_kernel<<<1, kReduceThreads, 0, stream>>>(partials, blocks, scale, out);
  NANODDP_CUDA_CHECK_LAUNCH();
  NANODDP_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

// ---- column sums ---------------------------------------------------------------------------

// A block of 32 x 32 threads owns 32 adjacent columns. threadIdx.x picks the column, so the 32
// lanes of a warp read 32 consecutive floats of one row (one coalesced 128-byte transaction);
// threadIdx.y picks every 32nd row. Then the 32 row-partials of each column are combined
// through shared memory (the +1 padding puts column j of every row in a different bank).
constexpr int kColTile = 32;

__global__ void __launch_bounds__(kColTile* kColTile)
    column_sum_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t cols, float beta,
                      float* __restrict__ out) {
  __shared__ double partial[kColTile][kColTile + 1];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  double acc = 0.0;
  if (col < cols) {
    for (std::int64_t row = threadIdx.y; row < rows; row += kColTile) acc += x[row * cols + col];
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  // Warp y now reduces column y of the tile: lane l holds the partial of row-group l.
  const int lane = threadIdx.x;
  const int tile_col = threadIdx.y;
  double v = detail::warp_reduce_sum(partial[lane][tile_col]);
  const std::int64_t out_col = static_cast<std::int64_t>(blockIdx.x) * kColTile + tile_col;
  if (lane == 0 && out_col < cols) {
    // beta == 0 overwrites without reading (out may hold garbage). Otherwise the old value is
    // combined in double too, then rounded once (as the CPU twin does).
    out[out_col] = beta == 0.0f ? static_cast<float>(v)
                                : static_cast<float>(beta * static_cast<double>(out[out_col]) + v);
  }
}

// ---- MSE backward --------------------------------------------------------------------------

__global__ void mse_backward_kernel(const float* __restrict__ pred,
                                    const float* __restrict__ target, std::int64_t n,
                                    const float* __restrict__ grad_out, float beta,
                                    float* __restrict__ grad_pred) {
  // d/dpred mean((pred - target)^2) = 2 (pred - target) / n, times the upstream gradient.
  const float scale = grad_out[0] * 2.0f / static_cast<float>(n);
  NANODDP_GRID_STRIDE_LOOP(i, n) {
    const float g = scale * (pred[i] - target[i]);
    grad_pred[i] = beta == 0.0f ? g : beta * grad_pred[i] + g;
  }
}

}  // namespace

void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out,
                cudaStream_t stream) {
  if (cols <= 0) return;
  const std::int64_t blocks = (cols + kColTile - 1) / kColTile;
  if (blocks > 0x7fffffff) throw CudaError("column_sum: too many columns for one grid");
  // rows == 0 still runs: out = beta * out + 0.
  column_sum_kernel<<<static_cast<unsigned>(blocks), dim3(kColTile, kColTile), 0, stream>>>(
      x, rows < 0 ? 0 : rows, cols, beta, out);
  NANODDP_CUDA_CHECK_LAUNCH();
}

void sum(const float* x, std::int64_t n, float* out, cudaStream_t stream) {
  reduce_to_scalar(SumTerm{x}, n < 0 ? 0 : n, 1.0, out, stream);
}

void count_nonfinite(const float* x, std::int64_t n, float* out, cudaStream_t stream) {
  reduce_to_scalar(NonfiniteTerm{x}, n < 0 ? 0 : n, 1.0, out, stream);
}

void mse_forward(const float* pred, const float* target, std::int64_t n, float* out,
                 cudaStream_t stream) {
  // The mean of zero elements is 0/0; write NaN like PyTorch does.
  const double scale =
      n > 0 ? 1.0 / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
  reduce_to_scalar(SquaredErrorTerm{pred, target}, n < 0 ? 0 : n, scale, out, stream);
}

void mse_backward(const float* pred, const float* target, std::int64_t n, const float* grad_out,
                  float beta, float* grad_pred, cudaStream_t stream) {
  if (n <= 0) return;
  mse_backward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      pred, target, n, grad_out, beta, grad_pred);
  NANODDP_CUDA_CHECK_LAUNCH();
}

}  // namespace nanoddp::kernels::cuda
