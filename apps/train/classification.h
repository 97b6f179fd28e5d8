#pragma once
// --task classify's data: a sample is an input row and one class index in [0, classes). The
// index travels through nn::Dataset's float target row (one column, exact below 2^24, which
// bounds --classes) and becomes the int64 target that cross_entropy takes when the batch is
// staged (trainer_batches.cpp).

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "nanoddp/nn/dataset.h"

namespace nanoddp::train {

// The synthetic teacher of nn::SyntheticRegression with `classes` outputs; a sample's class is
// the arg-max of its (noisy) teacher outputs, the first on ties as torch.argmax.
class SyntheticClassification final : public nn::Dataset {
 public:
  explicit SyntheticClassification(nn::SyntheticRegressionOptions teacher);

  std::int64_t size() const override { return teacher_.size(); }
  std::int64_t in_features() const override { return teacher_.in_features(); }
  std::int64_t out_features() const override { return 1; }
  void fill_batch(std::span<const std::int64_t> indices, float* x, float* y) override;

 private:
  nn::SyntheticRegression teacher_;
  std::vector<float> outputs_;  // scratch: the teacher's outputs of one batch
};

// Inputs from a 2-D float .npy (as --data), classes from a 1-D int64/int32 .npy: one per row,
// each in [0, classes). Construction checks both and names the file and the first bad row.
class NpyClassification final : public nn::Dataset {
 public:
  NpyClassification(const std::filesystem::path& x_path, const std::filesystem::path& y_path,
                    std::int64_t classes);

  std::int64_t size() const override { return x_.shape[0]; }
  std::int64_t in_features() const override { return x_.shape[1]; }
  std::int64_t out_features() const override { return 1; }
  void fill_batch(std::span<const std::int64_t> indices, float* x, float* y) override;

 private:
  nn::NpyArray x_;
  std::vector<std::int64_t> labels_;
  std::filesystem::path x_path_;
};

}  // namespace nanoddp::train
