#pragma once
// Helpers for the CPU kernel tests: reproducible random inputs, NaN-poisoned outputs (so an
// element a kernel forgets to write shows up as NaN), and guard zones that catch writes past
// the end of a buffer.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace nanoddp::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// A buffer of n elements followed by kGuard sentinel elements. data() is the n-element part;
// guards_intact() says whether anything wrote past the end.
class Poisoned {
 public:
  static constexpr std::size_t kGuard = 16;
  static constexpr float kSentinel = -12345.678f;

  explicit Poisoned(std::size_t n, float fill = kNaN) : n_(n), buf_(n + kGuard, kSentinel) {
    for (std::size_t i = 0; i < n; ++i) buf_[i] = fill;
  }
  explicit Poisoned(const std::vector<float>& values) : Poisoned(values.size()) {
    for (std::size_t i = 0; i < n_; ++i) buf_[i] = values[i];
  }
  float* data() { return buf_.data(); }
  float operator[](std::size_t i) const { return buf_[i]; }
  std::size_t size() const { return n_; }
  bool guards_intact() const {
    for (std::size_t i = n_; i < buf_.size(); ++i) {
      if (buf_[i] != kSentinel) return false;
    }
    return true;
  }

 private:
  std::size_t n_;
  std::vector<float> buf_;
};

// |got - want| <= atol + rtol * |want|, reported at the first failing index.
template <typename Got>
void check_close(const Got& got, const std::vector<double>& want, double rtol, double atol) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    const bool ok = std::abs(g - want[i]) <= atol + rtol * std::abs(want[i]);
    if (!ok) {
      // NaN lands here too (every comparison with NaN is false): an unwritten element.
      FAIL_CHECK("index " << i << " of " << want.size() << ": got " << g << ", want " << want[i]
                          << " (rtol " << rtol << ", atol " << atol << ")");
      return;
    }
  }
  CHECK(true);  // counts as one assertion per buffer compared
}

}  // namespace nanoddp::test
