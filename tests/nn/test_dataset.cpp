#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/nn/dataset.h"
#include "nanoddp/nn/npy.h"
#include "nn/data_test_util.h"

namespace {

using nanoddp::nn::NpyDataset;
using nanoddp::nn::SyntheticRegression;
using nanoddp::nn::SyntheticRegressionOptions;
using nanoddp::nn::write_npy;
using nanoddp::nn::testing::error_message;
using nanoddp::nn::testing::ScratchDir;

struct Batch {
  std::vector<float> x, y;
};

Batch fetch(nanoddp::nn::Dataset& data, const std::vector<std::int64_t>& indices) {
  Batch b{std::vector<float>(indices.size() * static_cast<std::size_t>(data.in_features())),
          std::vector<float>(indices.size() * static_cast<std::size_t>(data.out_features()))};
  data.fill_batch(indices, b.x.data(), b.y.data());
  return b;
}

std::vector<std::int64_t> iota(std::int64_t n, std::int64_t start = 0) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Least squares fit of y on [x, 1] (normal equations in double, Gaussian elimination with
// partial pivoting); returns the mean squared residual over all outputs.
double least_squares_mse(const Batch& b, std::size_t rows, std::size_t in, std::size_t out) {
  const std::size_t p = in + 1;
  std::vector<double> a(p * p, 0.0), rhs(p * out, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<double> f(p, 1.0);
    for (std::size_t i = 0; i < in; ++i) f[i] = b.x[r * in + i];
    for (std::size_t i = 0; i < p; ++i) {
      for (std::size_t j = 0; j < p; ++j) a[i * p + j] += f[i] * f[j];
      for (std::size_t o = 0; o < out; ++o) rhs[i * out + o] += f[i] * b.y[r * out + o];
    }
  }
  for (std::size_t c = 0; c < p; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < p; ++r) {
      if (std::abs(a[r * p + c]) > std::abs(a[pivot * p + c])) pivot = r;
    }
    for (std::size_t j = 0; j < p; ++j) std::swap(a[c * p + j], a[pivot * p + j]);
    for (std::size_t o = 0; o < out; ++o) std::swap(rhs[c * out + o], rhs[pivot * out + o]);
    for (std::size_t r = 0; r < p; ++r) {
      if (r == c) continue;
      const double factor = a[r * p + c] / a[c * p + c];
      for (std::size_t j = 0; j < p; ++j) a[r * p + j] -= factor * a[c * p + j];
      for (std::size_t o = 0; o < out; ++o) rhs[r * out + o] -= factor * rhs[c * out + o];
    }
  }
  double sse = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double pred = rhs[in * out + o] / a[in * p + in];
      for (std::size_t i = 0; i < in; ++i)
        pred += b.x[r * in + i] * rhs[i * out + o] / a[i * p + i];
      const double e = pred - b.y[r * out + o];
      sse += e * e;
    }
  }
  return sse / static_cast<double>(rows * out);
}

double mean_square(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s / static_cast<double>(v.size());
}

}  // namespace

TEST_CASE("synthetic: a sample is a pure function of (seed, index), whatever the batch") {
  SyntheticRegression a(
      {.in_features = 16, .out_features = 4, .size = 1000, .seed = 7, .teacher_hidden = 32});
  SyntheticRegression b(
      {.in_features = 16, .out_features = 4, .size = 1000, .seed = 7, .teacher_hidden = 32});
  const Batch alone = fetch(a, {123});
  const Batch mixed = fetch(b, {999, 0, 123, 5, 123});
  CHECK(std::memcmp(alone.x.data(), mixed.x.data() + 2 * 16, 16 * sizeof(float)) == 0);
  CHECK(std::memcmp(alone.y.data(), mixed.y.data() + 2 * 4, 4 * sizeof(float)) == 0);
  CHECK(std::memcmp(mixed.y.data() + 2 * 4, mixed.y.data() + 4 * 4, 4 * sizeof(float)) == 0);
  // Repeated calls with other batch sizes (scratch reuse) give the same bits.
  const Batch big = fetch(a, iota(200));
  const Batch again = fetch(a, iota(200));
  CHECK(big.x == again.x);
  CHECK(big.y == again.y);
  CHECK(std::memcmp(big.y.data() + 123 * 4, alone.y.data(), 4 * sizeof(float)) == 0);
  // x_i is the slice [i*in, (i+1)*in) of one long normal stream: consecutive rows continue it.
  const Batch two = fetch(a, {10, 11});
  std::vector<float> stream(32);
  nanoddp::kernels::cpu::fill_normal(stream.data(), 32, 7, SyntheticRegression::kInputStream,
                                     10 * 16, 0.0f, 1.0f);
  CHECK(two.x == stream);
  // Another seed gives other data.
  SyntheticRegression c({.in_features = 16, .out_features = 4, .size = 1000, .seed = 8});
  CHECK(fetch(c, {123}).x != alone.x);
}

TEST_CASE("synthetic: inputs are standard normal and the teacher output has about unit scale") {
  for (std::int64_t hidden : {0, 64}) {
    CAPTURE(hidden);
    SyntheticRegression data(
        {.in_features = 32, .out_features = 8, .size = 4096, .seed = 1, .teacher_hidden = hidden});
    const Batch b = fetch(data, iota(4096));
    double sum = 0.0;
    for (float v : b.x) sum += v;
    CHECK(std::abs(sum / static_cast<double>(b.x.size())) < 0.02);
    CHECK(mean_square(b.x) == doctest::Approx(1.0).epsilon(0.03));
    const double y2 = mean_square(b.y);
    CHECK(y2 > 0.3);
    CHECK(y2 < 3.0);
  }
}

TEST_CASE("synthetic: the noise has the requested standard deviation") {
  SyntheticRegressionOptions options{.in_features = 8,
                                     .out_features = 4,
                                     .size = 5000,
                                     .seed = 3,
                                     .noise_std = 0.5f,
                                     .teacher_hidden = 16};
  SyntheticRegression noisy(options);
  options.noise_std = 0.0f;
  SyntheticRegression clean(options);
  const Batch n = fetch(noisy, iota(5000));
  const Batch c = fetch(clean, iota(5000));
  CHECK(n.x == c.x);
  std::vector<float> diff(n.y.size());
  for (std::size_t i = 0; i < diff.size(); ++i) diff[i] = n.y[i] - c.y[i];
  CHECK(std::sqrt(mean_square(diff)) == doctest::Approx(0.5).epsilon(0.03));
}

TEST_CASE("synthetic: the default task is learnable (least squares drives MSE down >100x)") {
  // The default (linear teacher) can be fitted exactly by a linear layer, and so by any MLP.
  SyntheticRegression data(SyntheticRegressionOptions{});
  const auto in = static_cast<std::size_t>(data.in_features());
  const auto out = static_cast<std::size_t>(data.out_features());
  const Batch b = fetch(data, iota(2048));
  const double initial = mean_square(b.y);  // MSE of predicting 0, like a fresh small-init net
  const double fitted = least_squares_mse(b, 2048, in, out);
  MESSAGE("default task: MSE of predicting 0 = " << initial << ", least squares = " << fitted);
  CHECK(initial > 0.5);
  CHECK(fitted < initial / 1e4);  // noise floor ~ noise_std^2 = 1e-6
  // A tanh teacher is not linear: a linear fit leaves a residual far above the noise.
  SyntheticRegression hard({.teacher_hidden = 64});
  const Batch h = fetch(hard, iota(2048));
  const double linear_fit = least_squares_mse(h, 2048, in, out);
  MESSAGE("tanh teacher: MSE of predicting 0 = " << mean_square(h.y)
                                                 << ", linear least squares = " << linear_fit);
  CHECK(linear_fit > 1e-3);
  CHECK(linear_fit < mean_square(h.y));
}

TEST_CASE("synthetic: bad options and indices are refused") {
  error_message([] { SyntheticRegression({.in_features = 0}); }, {"in_features", "positive"});
  error_message([] { SyntheticRegression({.noise_std = -1.0f}); }, {"noise_std"});
  SyntheticRegression data({.in_features = 2, .out_features = 1, .size = 10});
  std::vector<float> x(4), y(2);
  const std::vector<std::int64_t> bad = {3, 10};
  error_message([&] { data.fill_batch(bad, x.data(), y.data()); },
                {"index 10", "position 1", "[0, 10)"});
}

TEST_CASE("npy dataset: serves rows of X and Y by index") {
  ScratchDir dir;
  std::vector<float> x(5 * 3), y(5 * 2);
  std::iota(x.begin(), x.end(), 0.0f);
  std::iota(y.begin(), y.end(), 100.0f);
  const std::int64_t xs[] = {5, 3}, ys[] = {5, 2};
  write_npy(dir / "x.npy", xs, x.data());
  write_npy(dir / "y.npy", ys, y.data());
  NpyDataset data(dir / "x.npy", dir / "y.npy");
  CHECK(data.size() == 5);
  CHECK(data.in_features() == 3);
  CHECK(data.out_features() == 2);
  const Batch b = fetch(data, {4, 0, 4});
  CHECK(b.x == std::vector<float>{12, 13, 14, 0, 1, 2, 12, 13, 14});
  CHECK(b.y == std::vector<float>{108, 109, 100, 101, 108, 109});
  std::vector<float> bx(3), by(2);
  const std::vector<std::int64_t> bad = {-1};
  error_message([&] { data.fill_batch(bad, bx.data(), by.data()); }, {"x.npy", "index -1"});
}

TEST_CASE("npy dataset: mismatched counts, NaN and wrong dims name the file") {
  ScratchDir dir;
  std::vector<float> v(40, 1.0f);
  const std::int64_t x_shape[] = {10, 4}, y_shape[] = {9, 1}, cube[] = {2, 5, 4}, line[] = {10};
  write_npy(dir / "x.npy", x_shape, v.data());
  write_npy(dir / "y9.npy", y_shape, v.data());
  error_message([&] { NpyDataset(dir / "x.npy", dir / "y9.npy"); },
                {"x.npy", "10 samples", "y9.npy", "9"});
  write_npy(dir / "cube.npy", cube, v.data());
  error_message([&] { NpyDataset(dir / "cube.npy", dir / "y9.npy"); }, {"cube.npy", "3-D"});
  write_npy(dir / "line.npy", line, v.data());
  error_message([&] { NpyDataset(dir / "x.npy", dir / "line.npy"); }, {"line.npy", "1-D"});
  std::vector<float> with_nan = v;
  with_nan[2 * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
  write_npy(dir / "xnan.npy", x_shape, with_nan.data());
  const std::int64_t y10[] = {10, 1};
  write_npy(dir / "y.npy", y10, v.data());
  error_message([&] { NpyDataset(dir / "xnan.npy", dir / "y.npy"); },
                {"xnan.npy", "row 2, column 3"});
}
