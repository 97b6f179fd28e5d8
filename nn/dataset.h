#pragma once
// Data sets addressed by global sample index. A batch is any list of indices; sample i is the
// same bytes whichever batch, rank or process asks for it. That is what lets W ranks with batch
// B see exactly the samples one rank with batch W*B sees (see sampler.h).

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "nanoddp/nn/npy.h"

namespace nanoddp::nn {

// A regression data set: sample i is an input row x_i (in_features floats) and a target row
// y_i (out_features floats).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  virtual std::int64_t in_features() const = 0;
  virtual std::int64_t out_features() const = 0;
  // Row k of x (indices.size() x in_features, row-major) and of y (indices.size() x
  // out_features) receive sample indices[k]. Throws nanoddp::Error for an index outside
  // [0, size()). Not thread-safe: implementations may reuse internal scratch buffers.
  virtual void fill_batch(std::span<const std::int64_t> indices, float* x, float* y) = 0;
};

struct SyntheticRegressionOptions {
  std::int64_t in_features = 32;
  std::int64_t out_features = 8;
  std::int64_t size = 65536;  // number of samples
  std::uint64_t seed = 0;
  // Standard deviation of the Gaussian noise added to the teacher's output. The teacher's
  // outputs have about unit variance, so 1e-3 puts the noise floor of the MSE near 1e-6, far
  // below the initial MSE (about 1): the task is learnable to 100x and beyond.
  float noise_std = 1e-3f;
  // 0: a linear teacher y = x A^T + c. Otherwise y = tanh(x A1^T + c1) A2^T + c2 with this many
  // hidden units. The linear default can be fitted exactly by any MLP, so "loss falls 100x" is a
  // reliable smoke test; a tanh teacher is a harder, more realistic target.
  std::int64_t teacher_hidden = 0;
};

// Synthetic regression against a fixed random "teacher" network. Everything is a pure function
// of (seed, index) through the counter-based Philox generator (kernels/philox.h):
//   x_i = fill_normal(seed, stream kInputStream, offset i * in_features), standard normal
//   y_i = teacher(x_i) + noise_std * fill_normal(seed, stream kNoiseStream, offset i * out)
// The teacher's weights come from stream kTeacherStream under the same seed:
//   A, A1 ~ N(0, 1/in_features) (unit-variance pre-activations), c, c1 ~ N(0, 0.1^2),
//   A2 ~ N(0, (5/3)^2 / teacher_hidden) (5/3 undoes tanh's shrinking, PyTorch's tanh gain),
//   c2 ~ N(0, 0.1^2).
// The teacher is evaluated with vectorised loops whose summation order is fixed per sample, so
// a sample's bits never depend on the batch it is in (a GEMM's blocking could change them).
class SyntheticRegression final : public Dataset {
 public:
  // Philox stream numbers (counter_hi). Distinct from each other and from small integers that
  // other users of the same seed (weight initialisation) are likely to pick.
  static constexpr std::uint64_t kInputStream = 0xDA7A'0000'0000'0001ull;
  static constexpr std::uint64_t kNoiseStream = 0xDA7A'0000'0000'0002ull;
  static constexpr std::uint64_t kTeacherStream = 0xDA7A'0000'0000'0003ull;

  explicit SyntheticRegression(SyntheticRegressionOptions options);

  std::int64_t size() const override { return options_.size; }
  std::int64_t in_features() const override { return options_.in_features; }
  std::int64_t out_features() const override { return options_.out_features; }
  const SyntheticRegressionOptions& options() const { return options_; }
  void fill_batch(std::span<const std::int64_t> indices, float* x, float* y) override;

  // The teacher's parameters, row-major, PyTorch's Linear layout (out x in). For a linear
  // teacher weight1/bias1 hold A and c and weight2/bias2 are empty.
  const std::vector<float>& teacher_weight1() const { return weight1_; }
  const std::vector<float>& teacher_bias1() const { return bias1_; }
  const std::vector<float>& teacher_weight2() const { return weight2_; }
  const std::vector<float>& teacher_bias2() const { return bias2_; }

 private:
  SyntheticRegressionOptions options_;
  std::vector<float> weight1_, bias1_, weight2_, bias2_;
  // Scratch reused across calls: one hidden row and one noise row.
  std::vector<float> hidden_, noise_;
};

// A data set held in memory from two .npy files: X (N x in_features) and Y (N x out_features),
// float32 or float64 (converted), C order. Construction validates shapes, equal sample counts
// and that every value is finite, with errors naming the offending file.
class NpyDataset final : public Dataset {
 public:
  NpyDataset(const std::filesystem::path& x_path, const std::filesystem::path& y_path);

  std::int64_t size() const override { return x_.shape[0]; }
  std::int64_t in_features() const override { return x_.shape[1]; }
  std::int64_t out_features() const override { return y_.shape[1]; }
  void fill_batch(std::span<const std::int64_t> indices, float* x, float* y) override;

 private:
  NpyArray x_, y_;
  std::filesystem::path x_path_;
};

}  // namespace nanoddp::nn
