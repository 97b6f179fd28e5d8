// Shape and reduction kernels of the research ops, over tensors seen as [outer, d, inner]
// around one dimension (see kernels.h). Sums accumulate in double, like sum().

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nanoddp/kernels/cpu/kernels.h"

namespace nanoddp::kernels::cpu {

void sum_to(const float* x, std::int64_t outer, std::int64_t mid, std::int64_t inner, float beta,
            float* out) {
  for (std::int64_t j = 0; j < mid; ++j) {
    double acc = 0.0;
    for (std::int64_t o = 0; o < outer; ++o) {
      const float* row = x + (o * mid + j) * inner;
      for (std::int64_t i = 0; i < inner; ++i) acc += row[i];
    }
    out[j] = beta == 0.0f ? static_cast<float>(acc) : beta * out[j] + static_cast<float>(acc);
  }
}

void sum_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
             float* out) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      double acc = 0.0;
      for (std::int64_t j = 0; j < d; ++j) acc += x[(o * d + j) * inner + i];
      out[o * inner + i] = static_cast<float>(alpha * acc);
    }
  }
}

void expand_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float alpha,
                float beta, float* out) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < d; ++j) {
      float* row = out + (o * d + j) * inner;
      const float* src = x + o * inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        row[i] = beta == 0.0f ? alpha * src[i] : beta * row[i] + alpha * src[i];
      }
    }
  }
}

void max_dim(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, float* values,
             std::int64_t* indices) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      float best = x[o * d * inner + i];
      std::int64_t arg = 0;
      for (std::int64_t j = 1; j < d && !std::isnan(best); ++j) {
        const float v = x[(o * d + j) * inner + i];
        if (v > best || std::isnan(v)) {
          best = v;
          arg = j;
        }
      }
      values[o * inner + i] = best;
      indices[o * inner + i] = arg;
    }
  }
}

void index_backward(const float* g, const std::int64_t* indices, std::int64_t outer, std::int64_t d,
                    std::int64_t inner, float beta, float* out) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < d; ++j) {
      for (std::int64_t i = 0; i < inner; ++i) {
        const float v = indices[o * inner + i] == j ? g[o * inner + i] : 0.0f;
        float& dst = out[(o * d + j) * inner + i];
        dst = beta == 0.0f ? v : beta * dst + v;
      }
    }
  }
}

void embedding_forward(const float* weight, const std::int64_t* indices, std::int64_t n,
                       std::int64_t dim, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy_n(weight + indices[i] * dim, dim, out + i * dim);
  }
}

void embedding_backward(const float* g, const std::int64_t* indices, std::int64_t n,
                        std::int64_t rows, std::int64_t dim, float beta, float* grad_weight) {
  if (beta == 0.0f) {
    std::fill_n(grad_weight, rows * dim, 0.0f);
  } else if (beta != 1.0f) {
    for (std::int64_t k = 0; k < rows * dim; ++k) grad_weight[k] *= beta;
  }
  // In index order: the sum of a repeated index's rows is the same bits on every run.
  for (std::int64_t i = 0; i < n; ++i) {
    float* row = grad_weight + indices[i] * dim;
    const float* src = g + i * dim;
    for (std::int64_t j = 0; j < dim; ++j) row[j] += src[j];
  }
}

void copy_block(const float* src, std::int64_t src_d, std::int64_t src_start, float* dst,
                std::int64_t dst_d, std::int64_t dst_start, std::int64_t outer, std::int64_t len,
                std::int64_t inner, float beta) {
  const std::int64_t run = len * inner;  // contiguous in both for one o
  for (std::int64_t o = 0; o < outer; ++o) {
    const float* s = src + (o * src_d + src_start) * inner;
    float* t = dst + (o * dst_d + dst_start) * inner;
    if (beta == 0.0f) {
      if (run > 0) std::memcpy(t, s, static_cast<std::size_t>(run) * sizeof(float));
    } else {
      for (std::int64_t k = 0; k < run; ++k) t[k] = beta * t[k] + s[k];
    }
  }
}

void transpose(const float* x, std::int64_t rows, std::int64_t cols, float beta, float* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      float& dst = out[c * rows + r];
      dst = beta == 0.0f ? x[r * cols + c] : beta * dst + x[r * cols + c];
    }
  }
}

}  // namespace nanoddp::kernels::cpu
