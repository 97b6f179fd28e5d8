// GEMM against a float64 reference for every layout, alpha/beta combination and awkward shape,
// for both implementations: nanoddp's own kernels (cpu::gemm) and Eigen's (cpu::gemm_eigen).

#include <doctest/doctest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "kernels/cpu_test_util.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace {

using nanoddp::kernels::Transpose;
using namespace nanoddp::test;
namespace cpu = nanoddp::kernels::cpu;

struct Shape {
  std::int64_t m, n, k;
};

using GemmFn = void (*)(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float,
                        const float*, const float*, float, float*);
struct Impl {
  const char* name;
  GemmFn gemm;
};
const Impl kImpls[] = {{"gemm", cpu::gemm}, {"gemm_eigen", cpu::gemm_eigen}};

// C = alpha op(A) op(B) + beta C0 in double, plus the sum of |terms| for an error bound.
void reference_gemm(Transpose ta, Transpose tb, const Shape& s, double alpha,
                    const std::vector<float>& a, const std::vector<float>& b, double beta,
                    const std::vector<float>& c0, std::vector<double>& out,
                    std::vector<double>& magnitude) {
  out.assign(s.m * s.n, 0.0);
  magnitude.assign(s.m * s.n, 0.0);
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < s.n; ++j) {
      double acc = 0.0, mag = 0.0;
      for (std::int64_t p = 0; p < s.k; ++p) {
        const double av = ta == Transpose::kNo ? a[i * s.k + p] : a[p * s.m + i];
        const double bv = tb == Transpose::kNo ? b[p * s.n + j] : b[j * s.k + p];
        acc += av * bv;
        mag += std::abs(av * bv);
      }
      const double old = beta == 0.0 ? 0.0 : beta * c0[i * s.n + j];
      out[i * s.n + j] = alpha * acc + old;
      magnitude[i * s.n + j] = std::abs(alpha) * mag + std::abs(old);
    }
  }
}

void run_case(const Impl& impl, Transpose ta, Transpose tb, const Shape& s, float alpha,
              float beta) {
  CAPTURE(impl.name);
  CAPTURE(s.m);
  CAPTURE(s.n);
  CAPTURE(s.k);
  CAPTURE(static_cast<int>(ta));
  CAPTURE(static_cast<int>(tb));
  CAPTURE(alpha);
  CAPTURE(beta);
  const auto a = random_floats(s.m * s.k, 1 + s.m * 7 + s.k);
  const auto b = random_floats(s.k * s.n, 2 + s.n * 5 + s.k);
  const auto c0 = random_floats(s.m * s.n, 3 + s.m + s.n);
  // beta == 0: C starts as NaN and must be overwritten without being read.
  Poisoned c = beta == 0.0f ? Poisoned(s.m * s.n) : Poisoned(c0);
  impl.gemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), b.data(), beta, c.data());
  std::vector<double> want, magnitude;
  reference_gemm(ta, tb, s, alpha, a, b, beta, c0, want, magnitude);
  CHECK(c.guards_intact());
  // Float rounding grows with the number of terms; bound it by the sum of their magnitudes.
  const double eps = 1.2e-7;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double bound = 2.0 * (static_cast<double>(s.k) + 2.0) * eps * magnitude[i] + 1e-30;
    if (!(std::abs(c[i] - want[i]) <= bound)) {
      INFO("element " << i << " got " << c[i] << " want " << want[i] << " bound " << bound);
      CHECK(false);
      return;
    }
  }
  CHECK(true);
}

const Shape kShapes[] = {{1, 1, 1},   {17, 33, 5},   {1000, 3, 7}, {3, 1000, 9},
                         {5, 7, 300}, {64, 96, 128}, {31, 1, 47},  {1, 65, 1}};
const Transpose kT[] = {Transpose::kNo, Transpose::kYes};

}  // namespace

// Every implementation, every layout, each shape, at one alpha/beta.
void run_all(const Shape& s, float alpha, float beta) {
  for (const Impl& impl : kImpls) {
    for (auto ta : kT) {
      for (auto tb : kT) run_case(impl, ta, tb, s, alpha, beta);
    }
  }
}

TEST_CASE("cpu gemm: all layouts and shapes, beta = 0 over NaN, against float64") {
  for (const auto& s : kShapes) run_all(s, 1.0f, 0.0f);
}

TEST_CASE("cpu gemm: the own kernels' tile edges (6-row tiles, 64-wide panels)") {
  // Sizes on both sides of the tiles' 6 and 64, so every partial tile and masked panel is
  // written, and nothing past the matrix (the guards); a NN/TN product whose B is just below
  // and just above the 1 MiB at which "broadcast A" stops packing all of B at once.
  const Shape shapes[] = {{6, 64, 1},     {7, 65, 3},    {63, 7, 64},  {65, 129, 17},
                          {130, 6, 5},    {1, 64, 300},  {64, 1, 257}, {13, 200, 70},
                          {5, 1000, 262}, {5, 1025, 256}};
  for (const auto& s : shapes) {
    run_all(s, 1.0f, 0.0f);
    run_all(s, -0.5f, 1.0f);
  }
}

TEST_CASE("cpu gemm: alpha/beta combinations") {
  const float combos[][2] = {{1.0f, 1.0f},  {0.5f, 0.0f}, {-2.0f, 0.5f},
                             {1.5f, -1.0f}, {0.0f, 1.0f}, {0.0f, 0.25f}};
  for (const auto& ab : combos) {
    for (const auto& s : {Shape{17, 33, 5}, Shape{1000, 3, 7}, Shape{1, 1, 1}}) {
      run_all(s, ab[0], ab[1]);
    }
  }
}

TEST_CASE("cpu gemm: accumulating into an output of 1 MiB or more (pre-read into cache)") {
  // gemm() reads a large C once before an accumulating (beta == 1) product: the weight
  // gradient case of --grad-accum. The result must still be C0 + op(A) op(B), in every layout,
  // including the edges of a C that is not a multiple of a cache line or of Eigen's tiles.
  for (const auto& s : {Shape{520, 513, 3}, Shape{1024, 257, 1}}) run_all(s, 1.0f, 1.0f);
}

TEST_CASE("cpu gemm: alpha = 0 does not read A and B, beta = 0 zero-fills") {
  const Shape s{4, 6, 3};
  std::vector<float> a(s.m * s.k, kNaN), b(s.k * s.n, INFINITY);
  for (const Impl& impl : kImpls) {
    CAPTURE(impl.name);
    Poisoned c(s.m * s.n);
    impl.gemm(Transpose::kNo, Transpose::kNo, s.m, s.n, s.k, 0.0f, a.data(), b.data(), 0.0f,
              c.data());
    for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == 0.0f);
    CHECK(c.guards_intact());
  }
}

TEST_CASE("cpu gemm: k = 0 gives beta * C") {
  for (const Impl& impl : kImpls) {
    CAPTURE(impl.name);
    Poisoned c(std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
    impl.gemm(Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0f, nullptr, nullptr, 0.5f, c.data());
    CHECK(c[0] == 0.5f);
    CHECK(c[3] == 2.0f);
    Poisoned z(4);
    impl.gemm(Transpose::kYes, Transpose::kYes, 2, 2, 0, 1.0f, nullptr, nullptr, 0.0f, z.data());
    CHECK(z[0] == 0.0f);
    CHECK(z[3] == 0.0f);
  }
}

TEST_CASE("cpu gemm: the three linear-layer layouts agree with each other") {
  // Y = X W^T, dX = dY W, dW = dY^T X for batch 9, in 13, out 6: compare with direct loops
  // written in the layer's own terms (guards against a swapped m/n/k in the callers' docs).
  const std::int64_t batch = 9, in = 13, out = 6;
  const auto x = random_floats(batch * in, 11), w = random_floats(out * in, 12);
  const auto dy = random_floats(batch * out, 13);
  Poisoned y(batch * out), dx(batch * in), dw(out * in);
  cpu::gemm(Transpose::kNo, Transpose::kYes, batch, out, in, 1.0f, x.data(), w.data(), 0.0f,
            y.data());
  cpu::gemm(Transpose::kNo, Transpose::kNo, batch, in, out, 1.0f, dy.data(), w.data(), 0.0f,
            dx.data());
  cpu::gemm(Transpose::kYes, Transpose::kNo, out, in, batch, 1.0f, dy.data(), x.data(), 0.0f,
            dw.data());
  std::vector<double> wy(batch * out, 0.0), wdx(batch * in, 0.0), wdw(out * in, 0.0);
  for (std::int64_t bi = 0; bi < batch; ++bi) {
    for (std::int64_t o = 0; o < out; ++o) {
      for (std::int64_t i = 0; i < in; ++i) {
        wy[bi * out + o] += double(x[bi * in + i]) * w[o * in + i];
        wdx[bi * in + i] += double(dy[bi * out + o]) * w[o * in + i];
        wdw[o * in + i] += double(dy[bi * out + o]) * x[bi * in + i];
      }
    }
  }
  check_close(y, wy, 1e-5, 1e-5);
  check_close(dx, wdx, 1e-5, 1e-5);
  check_close(dw, wdw, 1e-5, 1e-5);
}

TEST_CASE("cpu gemm: threads setting round-trips and multi-threaded results match") {
  const int before = cpu::gemm_threads();
  cpu::set_gemm_threads(2);
  const int two = cpu::gemm_threads();
  CHECK(two >= 1);
  run_all({300, 200, 100}, 1.0f, 0.0f);
  cpu::set_gemm_threads(1);
  CHECK(cpu::gemm_threads() == 1);
  run_all({300, 200, 100}, 1.0f, 0.0f);
  cpu::set_gemm_threads(before);
}

TEST_CASE("cpu gemm: the own kernels and Eigen give the same bits on 1, 2 and 3 threads") {
  // Threads split C, never a sum, so --threads must not change a single bit of a training run.
  // Each linear-layer layout, at a batch of 64 and with partial tiles, and shapes of several
  // Eigen slices (the path of a build without AVX-512: Eigen's own threads changed its bits).
  const int before = cpu::gemm_threads();
  struct Case {
    Transpose ta, tb;
    Shape s;
  };
  const Case cases[] = {{Transpose::kNo, Transpose::kYes, {64, 130, 300}},
                        {Transpose::kNo, Transpose::kNo, {64, 300, 130}},
                        {Transpose::kYes, Transpose::kNo, {130, 300, 64}},
                        {Transpose::kNo, Transpose::kNo, {100, 1100, 250}},
                        {Transpose::kYes, Transpose::kYes, {900, 530, 700}},
                        {Transpose::kNo, Transpose::kYes, {64, 1024, 1024}},
                        {Transpose::kYes, Transpose::kNo, {1024, 1024, 64}}};
  for (const Case& c : cases) {
    CAPTURE(c.s.m);
    CAPTURE(c.s.n);
    CAPTURE(c.s.k);
    const auto a = random_floats(c.s.m * c.s.k, 21);
    const auto b = random_floats(c.s.k * c.s.n, 22);
    for (const auto product : {cpu::gemm, cpu::gemm_eigen}) {
      std::vector<float> one(c.s.m * c.s.n, 0.5f);
      cpu::set_gemm_threads(1);
      product(c.ta, c.tb, c.s.m, c.s.n, c.s.k, 1.0f, a.data(), b.data(), 1.0f, one.data());
      for (const int threads : {2, 3}) {
        CAPTURE(threads);
        std::vector<float> more(c.s.m * c.s.n, 0.5f);
        cpu::set_gemm_threads(threads);
        product(c.ta, c.tb, c.s.m, c.s.n, c.s.k, 1.0f, a.data(), b.data(), 1.0f, more.data());
        CHECK(one == more);
      }
    }
  }
  cpu::set_gemm_threads(before);
}

TEST_CASE("cpu gemm: GEMMs run from several threads at once give the bits each gives alone") {
  // A model may run its towers on threads of its own (an outside tester's did). Eigen's GEMM
  // once set Eigen's process-wide thread count on every call: a data race (ThreadSanitizer's
  // report in CI). One product of one slice and one of several, both GEMMs, 2 GEMM threads.
  const int before = cpu::gemm_threads();
  cpu::set_gemm_threads(2);
  const Shape shapes[] = {{64, 130, 300}, {600, 70, 90}, {6, 16, 8}};
  for (const auto product : {cpu::gemm, cpu::gemm_eigen}) {
    std::vector<std::vector<float>> alone, together(3 * std::size(shapes));
    std::vector<std::vector<float>> as, bs;
    for (std::size_t i = 0; i < together.size(); ++i) {
      const Shape& s = shapes[i % std::size(shapes)];
      as.push_back(random_floats(s.m * s.k, 40 + static_cast<std::uint32_t>(i)));
      bs.push_back(random_floats(s.k * s.n, 80 + static_cast<std::uint32_t>(i)));
      alone.emplace_back(s.m * s.n, 0.0f);
      product(Transpose::kNo, Transpose::kNo, s.m, s.n, s.k, 1.0f, as[i].data(), bs[i].data(), 0.0f,
              alone[i].data());
    }
    {
      std::vector<std::jthread> threads;
      for (std::size_t i = 0; i < together.size(); ++i) {
        threads.emplace_back([&, i] {
          const Shape& s = shapes[i % std::size(shapes)];
          together[i].assign(s.m * s.n, 0.0f);
          for (int repeat = 0; repeat < 20; ++repeat) {
            product(Transpose::kNo, Transpose::kNo, s.m, s.n, s.k, 1.0f, as[i].data(), bs[i].data(),
                    0.0f, together[i].data());
          }
        });
      }
    }
    CHECK(alone == together);
  }
  cpu::set_gemm_threads(before);
}
