// Elementwise kernels, including the aliasing the header allows.

#include <doctest/doctest.h>

#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace {
using namespace nanoddp::test;
namespace cpu = nanoddp::kernels::cpu;
const std::int64_t kSizes[] = {0, 1, 17, 1000, 4099};
}  // namespace

TEST_CASE("cpu fill / scale / scale_copy") {
  for (std::int64_t n : kSizes) {
    CAPTURE(n);
    Poisoned x(n);
    cpu::fill(x.data(), n, 2.5f);
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(x[i] == 2.5f);
    CHECK(x.guards_intact());

    const auto v = random_floats(n, 71);
    Poisoned s(v);
    cpu::scale(s.data(), n, -3.0f);
    std::vector<double> want(n);
    for (std::int64_t i = 0; i < n; ++i) want[i] = -3.0 * v[i];
    check_close(s, want, 1e-7, 0.0);
    CHECK(s.guards_intact());

    Poisoned out(n);
    cpu::scale_copy(v.data(), -3.0f, out.data(), n);
    check_close(out, want, 1e-7, 0.0);
    CHECK(out.guards_intact());
    Poisoned same(v);  // out aliases x
    cpu::scale_copy(same.data(), -3.0f, same.data(), n);
    check_close(same, want, 1e-7, 0.0);
  }
}

TEST_CASE("cpu axpy and add, with out aliasing a or b") {
  for (std::int64_t n : kSizes) {
    CAPTURE(n);
    const auto x = random_floats(n, 81), y = random_floats(n, 82);
    std::vector<double> want(n);
    for (std::int64_t i = 0; i < n; ++i) want[i] = double(y[i]) + 0.75 * x[i];

    Poisoned ya(y);
    cpu::axpy(n, 0.75f, x.data(), ya.data());
    check_close(ya, want, 1e-6, 1e-7);
    CHECK(ya.guards_intact());

    Poisoned out(n);
    cpu::add(y.data(), x.data(), 0.75f, out.data(), n);
    check_close(out, want, 1e-6, 1e-7);
    CHECK(out.guards_intact());

    Poisoned alias_a(y);
    cpu::add(alias_a.data(), x.data(), 0.75f, alias_a.data(), n);
    check_close(alias_a, want, 1e-6, 1e-7);

    Poisoned alias_b(x);
    cpu::add(y.data(), alias_b.data(), 0.75f, alias_b.data(), n);
    check_close(alias_b, want, 1e-6, 1e-7);
  }
}

TEST_CASE("cpu broadcast_scalar: beta 0 over NaN and beta 1") {
  for (std::int64_t n : kSizes) {
    CAPTURE(n);
    const float scalar = 4.0f;
    Poisoned out(n);
    cpu::broadcast_scalar(&scalar, 0.25f, 0.0f, out.data(), n);
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(out[i] == 1.0f);
    CHECK(out.guards_intact());
    const auto old = random_floats(n, 91);
    Poisoned acc(old);
    cpu::broadcast_scalar(&scalar, 0.25f, 1.0f, acc.data(), n);
    std::vector<double> want(n);
    for (std::int64_t i = 0; i < n; ++i) want[i] = old[i] + 1.0;
    check_close(acc, want, 1e-7, 1e-7);
  }
}
