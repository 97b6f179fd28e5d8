// --task classify's data sets: the arg-max of the synthetic teacher, or labels from a .npy.
#include "classification.h"

#include <cstring>

#include "nanoddp/kernels/error.h"

namespace nanoddp::train {

SyntheticClassification::SyntheticClassification(nn::SyntheticRegressionOptions teacher)
    : teacher_(teacher) {}

void SyntheticClassification::fill_batch(std::span<const std::int64_t> indices, float* x,
                                         float* y) {
  const std::int64_t classes = teacher_.out_features();
  outputs_.resize(indices.size() * static_cast<std::size_t>(classes));
  teacher_.fill_batch(indices, x, outputs_.data());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const float* row = outputs_.data() + k * static_cast<std::size_t>(classes);
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < classes; ++c) {
      if (row[c] > row[best]) best = c;
    }
    y[k] = static_cast<float>(best);
  }
}

NpyClassification::NpyClassification(const std::filesystem::path& x_path,
                                     const std::filesystem::path& y_path, std::int64_t classes)
    : x_path_(x_path) {
  // Both headers first: a mismatch they show is refused before gigabytes of data are read.
  const std::vector<std::int64_t> xs = nn::read_npy_header(x_path, nn::NpyContents::kMatrix).shape;
  const std::int64_t rows = nn::read_npy_header(y_path, nn::NpyContents::kLabels).shape[0];
  if (xs[0] != rows) {
    fail(
        "the targets '{}' hold {} class labels but the inputs '{}' have {} rows; give one label "
        "per row, in the same order",
        y_path.string(), rows, x_path.string(), xs[0]);
  }
  if (rows == 0)
    fail("the data set '{}' / '{}' is empty (no rows)", x_path.string(), y_path.string());
  if (xs[1] == 0) {
    fail("the inputs '{}' have {} rows of 0 features (shape ({}, 0)): nothing to learn from",
         x_path.string(), xs[0], xs[0]);
  }
  x_ = nn::read_npy_matrix(x_path);
  labels_ = nn::read_npy_labels(y_path);
  nn::check_finite(x_, x_path);
  std::int64_t bad = 0;
  std::int64_t first = -1;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t label = labels_[static_cast<std::size_t>(i)];
    if (label < 0 || label >= classes) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad > 0) {
    fail(
        "the targets '{}' hold {} label(s) outside [0, {}) (--classes {}); the first is row {}: "
        "{}",
        y_path.string(), bad, classes, classes, first, labels_[static_cast<std::size_t>(first)]);
  }
}

void NpyClassification::fill_batch(std::span<const std::int64_t> indices, float* x, float* y) {
  const std::int64_t in = in_features();
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::int64_t i = indices[k];
    if (i < 0 || i >= size()) {
      fail("sample index {} (batch row {}) is outside [0, {}) of '{}'", i, k, size(),
           x_path_.string());
    }
    std::memcpy(x + static_cast<std::int64_t>(k) * in, x_.data.data() + i * in,
                static_cast<std::size_t>(in) * sizeof(float));
    y[k] = static_cast<float>(labels_[static_cast<std::size_t>(i)]);
  }
}

}  // namespace nanoddp::train
