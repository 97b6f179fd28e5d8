// Tensor handles: factories, views into shared storage, copies, and Device parsing.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nanoddp/engine/device.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/tensor.h"

namespace nanoddp {
namespace {

std::string error_message(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("zeros, ones and full fill every element and keep the shape") {
  const Tensor z = Tensor::zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.dim() == 2);
  CHECK(z.size(0) == 2);
  CHECK(z.size(-1) == 3);
  CHECK(z.dtype() == DType::kF32);
  CHECK(z.device() == Device::cpu());
  CHECK(z.to_vector() == std::vector<float>(6, 0.0f));

  CHECK(Tensor::ones({4}).to_vector() == std::vector<float>(4, 1.0f));
  CHECK(Tensor::full({3, 1}, -2.5f).to_vector() == std::vector<float>(3, -2.5f));

  // A scalar tensor has shape [] and one element.
  const Tensor s = Tensor::full({}, 7.0f);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item() == 7.0f);

  CHECK_THROWS_AS(Tensor::zeros({2, -1}), Error);
  CHECK_THROWS_AS(z.size(2), Error);
}

TEST_CASE("from_vector keeps values in row-major order and checks the element count") {
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  const Tensor t = Tensor::from_vector(values, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.to_vector() == values);
  CHECK(t.data()[4] == 5.0f);  // row 1, column 1

  // The tensor owns a copy: changing the source afterwards does not reach it.
  std::vector<float> source{1, 2};
  const Tensor u = Tensor::from_vector(source, {2});
  source[0] = 100.0f;
  CHECK(u.to_vector() == std::vector<float>{1, 2});

  CHECK_THROWS_AS(Tensor::from_vector(values, {4, 2}), Error);
  CHECK_THROWS_AS(Tensor::from_vector(values, {5}), Error);
}

TEST_CASE("uniform and normal are deterministic functions of the RandomStream") {
  const RandomStream a{.seed = 42, .stream = 3, .offset = 0};
  const Tensor u1 = Tensor::uniform({1000}, -0.5f, 2.0f, a);
  const Tensor u2 = Tensor::uniform({1000}, -0.5f, 2.0f, a);
  CHECK(u1.to_vector() == u2.to_vector());

  const std::vector<float> uv = u1.to_vector();
  // Each value in range (min_element and max_element pass over a NaN that does not come first).
  CHECK(std::all_of(uv.begin(), uv.end(), [](float v) { return v >= -0.5f && v <= 2.0f; }));
  // Not constant, and spread over the range.
  CHECK(*std::min_element(uv.begin(), uv.end()) < 0.0f);
  CHECK(*std::max_element(uv.begin(), uv.end()) > 1.5f);

  // Another stream, or another seed, gives other numbers.
  const Tensor other_stream = Tensor::uniform({1000}, -0.5f, 2.0f, {.seed = 42, .stream = 4});
  const Tensor other_seed = Tensor::uniform({1000}, -0.5f, 2.0f, {.seed = 43, .stream = 3});
  CHECK(other_stream.to_vector() != uv);
  CHECK(other_seed.to_vector() != uv);

  // The offset skips elements: a fill at offset 10 is the tail of a fill at offset 0.
  const Tensor shifted =
      Tensor::uniform({990}, -0.5f, 2.0f, {.seed = 42, .stream = 3, .offset = 10});
  CHECK(shifted.to_vector() == std::vector<float>(uv.begin() + 10, uv.end()));

  // A Generator hands out consecutive streams of its seed.
  Generator gen(42);
  CHECK(gen.next().stream == 0);
  const RandomStream s1 = gen.next();
  CHECK(s1.seed == 42);
  CHECK(s1.stream == 1);

  // Normal: same stream twice is identical, and the moments are right for many samples.
  const RandomStream b{.seed = 7, .stream = 1};
  const Tensor n1 = Tensor::normal({20000}, 1.5f, 2.0f, b);
  CHECK(n1.to_vector() == Tensor::normal({20000}, 1.5f, 2.0f, b).to_vector());
  double sum = 0.0, sum_sq = 0.0;
  for (float v : n1.to_vector()) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double mean = sum / 20000.0;
  const double stddev = std::sqrt(sum_sq / 20000.0 - mean * mean);
  CHECK(mean == doctest::Approx(1.5).epsilon(0.05));
  CHECK(stddev == doctest::Approx(2.0).epsilon(0.05));
}

TEST_CASE("views share storage at an offset and writes are seen through both") {
  const Tensor base = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  const Tensor v = base.view(2, {2, 2});
  CHECK(v.shape() == Shape{2, 2});
  CHECK(v.storage() == base.storage());
  CHECK(v.storage_offset() == 2);
  CHECK(v.to_vector() == std::vector<float>{2, 3, 4, 5});
  CHECK_FALSE(v.is_same(base));

  v.data()[0] = 20.0f;
  CHECK(base.to_vector()[2] == 20.0f);
  base.data()[5] = 50.0f;
  CHECK(v.to_vector()[3] == 50.0f);

  // A view of a view: offsets add up.
  const Tensor vv = v.view(1, {2});
  CHECK(vv.storage_offset() == 3);
  CHECK(vv.to_vector() == std::vector<float>{3, 4});

  // fill through a view touches only the view's elements.
  base.view(6, {2}).fill(-1.0f);
  CHECK(base.to_vector() == std::vector<float>{0, 1, 20, 3, 4, 50, -1, -1});

  // reshape is a view at the same offset.
  const Tensor r = base.reshape({2, 4});
  CHECK(r.storage() == base.storage());
  CHECK(r.storage_offset() == 0);
  CHECK(r.shape() == Shape{2, 4});
  CHECK(r.to_vector() == base.to_vector());
  r.data()[0] = 9.0f;
  CHECK(base.to_vector()[0] == 9.0f);
}

TEST_CASE("a view that does not fit in the storage is an Error") {
  const Tensor base = Tensor::zeros({8});
  CHECK_NOTHROW(base.view(0, {8}));
  CHECK_NOTHROW(base.view(6, {2}));
  CHECK_THROWS_AS(base.view(7, {2}), Error);
  CHECK_THROWS_AS(base.view(0, {9}), Error);
  CHECK_THROWS_AS(base.view(-1, {2}), Error);
  CHECK_THROWS_AS(base.reshape({3, 3}), Error);
  // Negative sizes are out of range too, even when their product would fit.
  CHECK_THROWS_AS(base.view(0, {-1}), Error);
  CHECK_THROWS_AS(base.view(0, {-2, -3}), Error);
  CHECK_THROWS_AS(base.reshape({-8}), Error);
  // Relative to a view: the view starts at 4, so 3 more elements from its offset 2 overrun.
  const Tensor v = base.view(4, {4});
  CHECK_NOTHROW(v.view(2, {2}));
  CHECK_THROWS_AS(v.view(2, {3}), Error);
  CHECK(error_message([&] { base.view(7, {2}); }).find("does not fit") != std::string::npos);
}

TEST_CASE("reshape keeps the element count: a view into a flat buffer cannot reach its neighbour") {
  // Parameters are views into one flat buffer; reshape must not widen one into the next.
  const Tensor flat = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
  const Tensor a = flat.view(0, {2});
  CHECK_THROWS_AS(a.reshape({4}), Error);  // would read 3 and 4, the next parameter's
  CHECK_THROWS_AS(a.reshape({1}), Error);  // would silently drop an element
  CHECK(error_message([&] { a.reshape({4}); }).find("2 elements") != std::string::npos);
  const Tensor b = flat.view(2, {4}).reshape({2, 2});
  CHECK(b.shape() == Shape{2, 2});
  CHECK(b.to_vector() == std::vector<float>{3, 4, 5, 6});
}

TEST_CASE("copy_from between overlapping views of one storage is an Error, onto itself a no-op") {
  Tensor flat = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
  Tensor a = flat.view(0, {4}), b = flat.view(2, {4}), c = flat.view(4, {2});
  CHECK_THROWS_AS(b.copy_from(a), Error);
  CHECK(error_message([&] { b.copy_from(a); }).find("overlap") != std::string::npos);
  CHECK(flat.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});  // untouched
  a.copy_from(a);
  c.copy_from(flat.view(0, {2}));  // disjoint views of one storage are fine
  CHECK(flat.to_vector() == std::vector<float>{1, 2, 3, 4, 1, 2});
}

TEST_CASE("a shape whose element count overflows is an Error, not a small tensor") {
  constexpr std::int64_t kHuge = std::int64_t{1} << 62;
  CHECK_THROWS_AS(Tensor::empty({4, kHuge}), Error);
  CHECK_THROWS_AS(Tensor::empty({std::int64_t{1} << 32, std::int64_t{1} << 32}), Error);
  CHECK_THROWS_AS(Tensor::empty({kHuge}), Error);  // fits in int64, not in bytes
  CHECK(error_message([&] { Tensor::empty({4, kHuge}); }).find("2^63") != std::string::npos);
  const Tensor base = Tensor::zeros({8});
  CHECK_THROWS_AS(base.view(1, {kHuge, 4}), Error);
  CHECK_THROWS_AS(base.view(std::numeric_limits<std::int64_t>::max() - 2, {4}), Error);
}

TEST_CASE("clone is an independent copy and copy_from checks shapes") {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  const Tensor c = a.clone();
  CHECK(c.to_vector() == a.to_vector());
  CHECK(c.storage() != a.storage());
  c.data()[0] = 10.0f;
  CHECK(a.to_vector()[0] == 1.0f);
  a.data()[1] = 20.0f;
  CHECK(c.to_vector()[1] == 2.0f);

  // A clone of a view copies only the view's elements.
  const Tensor big = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
  const Tensor cv = big.view(3, {3}).clone();
  CHECK(cv.to_vector() == std::vector<float>{4, 5, 6});
  CHECK(cv.storage_offset() == 0);

  Tensor dst = Tensor::zeros({3});
  dst.copy_from(a);
  CHECK(dst.to_vector() == std::vector<float>{1, 20, 3});

  Tensor wrong = Tensor::zeros({1, 3});  // same numel, different shape
  CHECK_THROWS_AS(wrong.copy_from(a), Error);
  Tensor shorter = Tensor::zeros({2});
  CHECK_THROWS_AS(shorter.copy_from(a), Error);
  CHECK(shorter.to_vector() == std::vector<float>{0, 0});
}

TEST_CASE("item() works only for one-element tensors") {
  CHECK(Tensor::full({1, 1}, 3.0f).item() == 3.0f);
  const std::string msg = error_message([] { (void)Tensor::zeros({2}).item(); });
  CHECK(msg.find("item()") != std::string::npos);
  CHECK(msg.find("2 elements") != std::string::npos);
  CHECK_THROWS_AS((void)Tensor::zeros({0}).item(), Error);
}

TEST_CASE("set_data rebinds every handle to the new storage") {
  Tensor p = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  p.set_requires_grad(true);
  const Tensor other_handle = p;  // copies the handle, not the data
  CHECK(other_handle.is_same(p));

  Tensor flat = Tensor::zeros({10});
  Tensor slot = flat.view(4, {3});
  slot.copy_from(p.detach());  // a copy of a parameter's values is not a differentiable step
  p.set_data(slot);

  CHECK(other_handle.storage() == flat.storage());
  CHECK(other_handle.storage_offset() == 4);
  CHECK(other_handle.to_vector() == std::vector<float>{1, 2, 3});
  CHECK(other_handle.requires_grad());  // autograd state is kept

  // Writes into the flat buffer are visible through both handles, and vice versa.
  flat.data()[5] = 42.0f;
  CHECK(p.to_vector()[1] == 42.0f);
  CHECK(other_handle.to_vector()[1] == 42.0f);
  other_handle.data()[2] = -7.0f;
  CHECK(flat.to_vector()[6] == -7.0f);

  CHECK_THROWS_AS(p.set_data(Tensor::zeros({4})), Error);
}

TEST_CASE("Device::parse accepts cpu, cuda and cuda:N and rejects anything else") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:3").index == 3);
  CHECK(Device::parse("cuda:3").is_cuda());
  CHECK(Device::cuda(3).str() == "cuda:3");
  CHECK(Device::cpu().str() == "cpu");

  for (const std::string bad :
       {"", "CPU", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", " cpu", "cpu:0", "cuda3"}) {
    CAPTURE(bad);
    const std::string msg = error_message([&] { (void)Device::parse(bad); });
    CHECK(msg.find(fmt::format("'{}'", bad)) != std::string::npos);
    CHECK(msg.find("'cpu'") != std::string::npos);
    CHECK(msg.find("'cuda'") != std::string::npos);
    CHECK(msg.find("'cuda:N'") != std::string::npos);
  }
}

}  // namespace nanoddp
