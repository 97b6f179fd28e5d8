#include "nanoddp/nn/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {
namespace {

namespace cpu = nanoddp::kernels::cpu;

constexpr float kBiasStd = 0.1f;
constexpr float kTanhGain = 5.0f / 3.0f;

void check_index(std::int64_t index, std::int64_t size, std::int64_t position,
                 std::string_view what) {
  if (index < 0 || index >= size) {
    fail(
        "{}: sample index {} (position {} in the batch) is outside [0, {}). The sampler's size "
        "must match the data set's.",
        what, index, position, size);
  }
}

// out[r, o] = bias[o] + sum_k in[r, k] * weight[o, k] for `rows` rows.
//
// Sample i's target must be the same bits whatever else is in its batch (and on whichever rank
// computes it), so every (row, output) dot product runs in one fixed order: kLanes float partial
// sums over k, combined by a fixed tree, then the tail. Every row runs the same instructions,
// so nothing depends on the number of rows or on which rank computes it. (Whether the compiler
// fuses a*b+c into an FMA — GCC does for C++ with -march=native — it does so for every row
// alike; a build for another CPU may round differently, so all ranks of a job should run one
// build.) Rows go kRowBlock at a time so that each weight row, loaded once, serves several
// samples: the loops vectorise over the lanes.
// One block of NR rows. The NR x kLanes partial sums are GCC/Clang vector values, so they stay
// in registers for the whole k loop (as a float array they were spilled to the stack on every
// step: 3x slower). Per lane the arithmetic is the same: acc += x * w in k order.
template <int NR>
void affine_block(const float* in, const float* weight, const float* bias, std::int64_t fan_in,
                  std::int64_t fan_out, float* out) {
  constexpr int kLanes = 16;
  using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
  const std::int64_t full = fan_in / kLanes * kLanes;
  for (std::int64_t o = 0; o < fan_out; ++o) {
    const float* w = weight + o * fan_in;
    Lanes acc[NR] = {};
    for (std::int64_t k = 0; k < full; k += kLanes) {
      Lanes wv;
      std::memcpy(&wv, w + k, sizeof(wv));
      for (int r = 0; r < NR; ++r) {
        Lanes xv;
        std::memcpy(&xv, in + r * fan_in + k, sizeof(xv));
        acc[r] += xv * wv;
      }
    }
    for (int r = 0; r < NR; ++r) {
      float lanes[kLanes];
      std::memcpy(lanes, &acc[r], sizeof(lanes));
      for (int width = kLanes / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
      }
      float sum = lanes[0];
      const float* x = in + r * fan_in;
      for (std::int64_t k = full; k < fan_in; ++k) sum += x[k] * w[k];
      out[r * fan_out + o] = sum + bias[o];
    }
  }
}

void affine_rows(const float* in, std::int64_t rows, const float* weight, const float* bias,
                 std::int64_t fan_in, std::int64_t fan_out, float* out) {
  constexpr int kRowBlock = 4;
  std::int64_t r0 = 0;
  for (; r0 + kRowBlock <= rows; r0 += kRowBlock) {
    affine_block<kRowBlock>(in + r0 * fan_in, weight, bias, fan_in, fan_out, out + r0 * fan_out);
  }
  switch (rows - r0) {
    case 3:
      affine_block<3>(in + r0 * fan_in, weight, bias, fan_in, fan_out, out + r0 * fan_out);
      break;
    case 2:
      affine_block<2>(in + r0 * fan_in, weight, bias, fan_in, fan_out, out + r0 * fan_out);
      break;
    case 1:
      affine_block<1>(in + r0 * fan_in, weight, bias, fan_in, fan_out, out + r0 * fan_out);
      break;
    default:
      break;
  }
}

}  // namespace

SyntheticRegression::SyntheticRegression(SyntheticRegressionOptions options) : options_(options) {
  const auto& o = options_;
  if (o.in_features <= 0 || o.out_features <= 0 || o.size <= 0 || o.teacher_hidden < 0) {
    fail(
        "SyntheticRegression: in_features ({}), out_features ({}) and size ({}) must be "
        "positive and teacher_hidden ({}) non-negative",
        o.in_features, o.out_features, o.size, o.teacher_hidden);
  }
  if (!(o.noise_std >= 0.0f) || !std::isfinite(o.noise_std)) {
    fail("SyntheticRegression: noise_std must be finite and >= 0, got {}", o.noise_std);
  }
  // Index * features must fit the 64-bit Philox offset without wrapping into another sample.
  const std::int64_t widest = std::max(o.in_features, o.out_features);
  if (o.size > INT64_MAX / widest) {
    fail("SyntheticRegression: size {} x {} features overflows the 64-bit stream offset", o.size,
         widest);
  }
  // The teacher's parameters, drawn back to back from one stream.
  std::uint64_t offset = 0;
  const auto draw = [&](std::vector<float>& out, std::int64_t n, float stddev) {
    out.resize(static_cast<std::size_t>(n));
    cpu::fill_normal(out.data(), n, o.seed, kTeacherStream, offset, 0.0f, stddev);
    offset += static_cast<std::uint64_t>(n);
  };
  const float in_std = 1.0f / std::sqrt(static_cast<float>(o.in_features));
  if (o.teacher_hidden == 0) {
    draw(weight1_, o.out_features * o.in_features, in_std);
    draw(bias1_, o.out_features, kBiasStd);
  } else {
    draw(weight1_, o.teacher_hidden * o.in_features, in_std);
    draw(bias1_, o.teacher_hidden, kBiasStd);
    draw(weight2_, o.out_features * o.teacher_hidden,
         kTanhGain / std::sqrt(static_cast<float>(o.teacher_hidden)));
    draw(bias2_, o.out_features, kBiasStd);
  }
  hidden_.resize(static_cast<std::size_t>(o.teacher_hidden));
  noise_.resize(static_cast<std::size_t>(o.out_features));
}

void SyntheticRegression::fill_batch(std::span<const std::int64_t> indices, float* x, float* y) {
  const auto& o = options_;
  const std::int64_t in = o.in_features, out = o.out_features, hidden = o.teacher_hidden;
  const auto rows = static_cast<std::int64_t>(indices.size());
  for (std::int64_t k = 0; k < rows; ++k) {
    const std::int64_t i = indices[static_cast<std::size_t>(k)];
    check_index(i, o.size, k, "SyntheticRegression");
    cpu::fill_normal(x + k * in, in, o.seed, kInputStream, static_cast<std::uint64_t>(i * in), 0.0f,
                     1.0f);
  }
  if (hidden == 0) {
    affine_rows(x, rows, weight1_.data(), bias1_.data(), in, out, y);
  } else {
    hidden_.resize(static_cast<std::size_t>(rows * hidden));
    affine_rows(x, rows, weight1_.data(), bias1_.data(), in, hidden, hidden_.data());
    for (float& h : hidden_) h = std::tanh(h);
    affine_rows(hidden_.data(), rows, weight2_.data(), bias2_.data(), hidden, out, y);
  }
  if (o.noise_std > 0.0f) {
    for (std::int64_t k = 0; k < rows; ++k) {
      const std::int64_t i = indices[static_cast<std::size_t>(k)];
      cpu::fill_normal(noise_.data(), out, o.seed, kNoiseStream,
                       static_cast<std::uint64_t>(i * out), 0.0f, o.noise_std);
      float* y_row = y + k * out;
      for (std::int64_t j = 0; j < out; ++j) y_row[j] += noise_[static_cast<std::size_t>(j)];
    }
  }
}

NpyDataset::NpyDataset(const std::filesystem::path& x_path, const std::filesystem::path& y_path)
    : x_path_(x_path) {
  // Both headers first: a mismatch they show is refused before gigabytes of data are read.
  const std::vector<std::int64_t> xs = read_npy_header(x_path, NpyContents::kMatrix).shape;
  const std::vector<std::int64_t> ys = read_npy_header(y_path, NpyContents::kMatrix).shape;
  if (xs[0] != ys[0]) {
    fail(
        "the inputs '{}' have {} samples (rows) but the targets '{}' have {}; both files must "
        "hold one row per sample, in the same order",
        x_path.string(), xs[0], y_path.string(), ys[0]);
  }
  if (xs[0] == 0 || xs[1] == 0 || ys[1] == 0) {
    fail("the data set '{}' / '{}' is empty (shapes ({}, {}) and ({}, {}): {})", x_path.string(),
         y_path.string(), xs[0], xs[1], ys[0], ys[1],
         xs[0] == 0 ? "no rows" : "a file with 0 columns");
  }
  x_ = read_npy_matrix(x_path);
  y_ = read_npy_matrix(y_path);
  check_finite(x_, x_path);
  check_finite(y_, y_path);
}

void NpyDataset::fill_batch(std::span<const std::int64_t> indices, float* x, float* y) {
  const std::int64_t in = in_features(), out = out_features();
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::int64_t i = indices[k];
    if (i < 0 || i >= size())
      check_index(i, size(), static_cast<std::int64_t>(k), x_path_.string());
    std::memcpy(x + static_cast<std::int64_t>(k) * in, x_.data.data() + i * in,
                static_cast<std::size_t>(in) * sizeof(float));
    std::memcpy(y + static_cast<std::int64_t>(k) * out, y_.data.data() + i * out,
                static_cast<std::size_t>(out) * sizeof(float));
  }
}

}  // namespace nanoddp::nn
