// Row-wise kernels of the research ops: softmax, cross-entropy and layer norm. Each works on one
// row (a run of d elements, `inner` apart) at a time, with the statistics in double.

#include <cmath>
#include <limits>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/kernels/pointwise_math.h"

namespace nanoddp::kernels::cpu {

void softmax(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, bool log,
             float* out) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      const float* row = x + o * d * inner + i;
      float* dst = out + o * d * inner + i;
      // Subtracting the maximum keeps exp() <= 1: no overflow, whatever the logits.
      float max = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < d; ++j) max = std::fmax(max, row[j * inner]);
      double total = 0.0;
      for (std::int64_t j = 0; j < d; ++j)
        total += std::exp(static_cast<double>(row[j * inner]) - max);
      const double log_total = std::log(total);
      for (std::int64_t j = 0; j < d; ++j) {
        const double shifted = static_cast<double>(row[j * inner]) - max;
        dst[j * inner] = static_cast<float>(log ? shifted - log_total : std::exp(shifted) / total);
      }
    }
  }
}

void softmax_backward(const float* y, const float* g, std::int64_t outer, std::int64_t d,
                      std::int64_t inner, bool log, float beta, float* dx) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      const std::int64_t base = o * d * inner + i;
      double dot = 0.0;  // sum_j g y (softmax) or sum_j g (log-softmax)
      for (std::int64_t j = 0; j < d; ++j) {
        const std::int64_t k = base + j * inner;
        dot += log ? static_cast<double>(g[k]) : static_cast<double>(g[k]) * y[k];
      }
      for (std::int64_t j = 0; j < d; ++j) {
        const std::int64_t k = base + j * inner;
        const double v = log ? g[k] - std::exp(static_cast<double>(y[k])) * dot
                             : y[k] * (static_cast<double>(g[k]) - dot);
        dx[k] = beta == 0.0f ? static_cast<float>(v) : beta * dx[k] + static_cast<float>(v);
      }
    }
  }
}

void cross_entropy_rows(const float* logits, const std::int64_t* targets, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, float eps, float* row_loss,
                        float* row_weight, float* lse) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * classes;
    float max = -std::numeric_limits<float>::infinity();
    double mean = 0.0;
    for (std::int64_t c = 0; c < classes; ++c) {
      max = std::fmax(max, x[c]);
      mean += x[c];
    }
    mean /= static_cast<double>(classes);
    double total = 0.0;
    for (std::int64_t c = 0; c < classes; ++c) total += std::exp(static_cast<double>(x[c]) - max);
    const double log_sum = max + std::log(total);
    lse[r] = static_cast<float>(log_sum);
    const std::int64_t t = targets[r];
    if (t == ignore_index) {
      row_loss[r] = 0.0f;
      row_weight[r] = 0.0f;
      continue;
    }
    if (t < 0 || t >= classes) {
      fail("cross_entropy: target {} of row {} is not a class index in [0, {})", t, r, classes);
    }
    const double nll = log_sum - x[t];
    const double smooth = log_sum - mean;  // -mean_c log p_c
    row_loss[r] = static_cast<float>(smoothed_nll(nll, smooth, eps));
    row_weight[r] = 1.0f;
  }
}

void cross_entropy_backward(const float* logits, const std::int64_t* targets, const float* lse,
                            std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                            float eps, const float* grad_out, const float* count, float beta,
                            float* dlogits) {
  const double scale = static_cast<double>(grad_out[0]) / count[0];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = targets[r];
    const bool ignored = t == ignore_index;
    for (std::int64_t c = 0; c < classes; ++c) {
      const std::int64_t k = r * classes + c;
      double v = 0.0;
      if (!ignored) {
        const double p = std::exp(static_cast<double>(logits[k]) - lse[r]);
        v = scale * (p - (c == t ? 1.0 - eps : 0.0) - eps / static_cast<double>(classes));
      }
      dlogits[k] = beta == 0.0f ? static_cast<float>(v) : beta * dlogits[k] + static_cast<float>(v);
    }
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, std::int64_t rows,
                std::int64_t cols, float eps, float* y, float* mean, float* rstd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    double m = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) m += row[c];
    m /= static_cast<double>(cols);
    double var = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) var += (row[c] - m) * (row[c] - m);
    var /= static_cast<double>(cols);
    const double s = 1.0 / std::sqrt(var + eps);
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(s);
    for (std::int64_t c = 0; c < cols; ++c) {
      double v = (row[c] - m) * s;
      if (weight != nullptr) v *= weight[c];
      if (bias != nullptr) v += bias[c];
      y[r * cols + c] = static_cast<float>(v);
    }
  }
}

void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* g, std::int64_t rows, std::int64_t cols, float beta,
                         float* dx) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    const float* gr = g + r * cols;
    double mean_gw = 0.0, mean_gw_xhat = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double gw = weight != nullptr ? static_cast<double>(gr[c]) * weight[c] : gr[c];
      const double xhat = (row[c] - static_cast<double>(mean[r])) * rstd[r];
      mean_gw += gw;
      mean_gw_xhat += gw * xhat;
    }
    mean_gw /= static_cast<double>(cols);
    mean_gw_xhat /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      const double gw = weight != nullptr ? static_cast<double>(gr[c]) * weight[c] : gr[c];
      const double xhat = (row[c] - static_cast<double>(mean[r])) * rstd[r];
      const auto v = static_cast<float>(rstd[r] * (gw - mean_gw - xhat * mean_gw_xhat));
      float& dst = dx[r * cols + c];
      dst = beta == 0.0f ? v : beta * dst + v;
    }
  }
}

void layer_norm_param_backward(const float* x, const float* mean, const float* rstd, const float* g,
                               std::int64_t rows, std::int64_t cols, float beta, float* dweight,
                               float* dbias) {
  for (std::int64_t c = 0; c < cols; ++c) {
    double gw = 0.0, gb = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double xhat = (x[r * cols + c] - static_cast<double>(mean[r])) * rstd[r];
      gw += g[r * cols + c] * xhat;
      gb += g[r * cols + c];
    }
    if (dweight != nullptr) {
      dweight[c] =
          beta == 0.0f ? static_cast<float>(gw) : beta * dweight[c] + static_cast<float>(gw);
    }
    if (dbias != nullptr) {
      dbias[c] = beta == 0.0f ? static_cast<float>(gb) : beta * dbias[c] + static_cast<float>(gb);
    }
  }
}

}  // namespace nanoddp::kernels::cpu
