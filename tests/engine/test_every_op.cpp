// Every public op that returns a tensor computed from a tensor, from one table: the
// differentiable ones go through one finite-difference gradient check, the others are listed
// with the reason they carry no gradient, and the in-place writes must refuse a tensor that
// requires one. The table is compared with what the engine's headers (ops.h, tensor.h, ...)
// declare, so a new op is noticed here until it is given a gradient check (or a reason).
//
// The check. The engine computes in float32 only (there is no float64 dtype; adding one would
// mean double versions of every kernel), so each op is evaluated in float32 and everything else
// is done in double on the host:
//   - the scalar is f(x) = sum_j r_j y_j(x) with fixed weights r_j in [-1, 1]; its analytic
//     gradient J^T r comes from the engine's backward through y.reshape({1, n}) matmul r;
//   - the numeric gradient is the central difference (f(x+) - f(x-)) / (x+ - x-), with
//     x+- = float(x_i +- h), h = 1e-2, f summed in double, and the denominator the exact
//     difference of the two float32 inputs (not 2h, which float rounding would break).
// Error budget, inputs and outputs O(1): truncation h^2/6 |f'''| <= 2e-5 (zero for the linear
// and quadratic ops); float32 rounding of each changed output <= ~8 * 2^-24 * |terms|, which the
// quotient amplifies by 1/(2h) = 50 to a few 1e-5 per output. Tolerance 1e-3 + 1e-3 |grad| is
// 10x that budget and far below any real error (a missed path, a wrong scale or a transpose is
// off by O(0.1)). ReLU's kink is kept out of reach: its inputs (and linear's pre-activations)
// are at least 2h away from 0.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/functional.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/error.h"
#include "support/worst_error.h"

namespace nanoddp {
namespace {

namespace fs = std::filesystem;

// Deterministic test data (splitmix64) in [lo, hi).
std::vector<float> values(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<float> out(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 7;
  for (float& v : out) {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v = static_cast<float>(lo + (hi - lo) * static_cast<double>(z >> 11) / 9007199254740992.0);
  }
  return out;
}

// |v| in [0.2, 1]: no ReLU kink within 2h.
std::vector<float> away_from_zero(std::size_t n, std::uint64_t seed) {
  std::vector<float> v = values(n, seed, 0.2, 1.0);
  const std::vector<float> sign = values(n, seed + 100);
  for (std::size_t i = 0; i < n; ++i) v[i] = sign[i] < 0.0f ? -v[i] : v[i];
  return v;
}

struct Input {
  Shape shape;
  std::vector<float> values;
};

Input input(const Shape& shape, std::uint64_t seed) {
  return {shape, values(static_cast<std::size_t>(shape_numel(shape)), seed)};
}

using Apply = std::function<Tensor(const std::vector<Tensor>&)>;

// One finite-difference case of a differentiable op.
struct GradCase {
  std::string name;  // as ops.h / tensor.h declare it
  std::string variant;
  std::vector<Input> inputs;
  Apply apply;
};

// Pre-activations x W^T + b of linear, to keep them away from ReLU's kink.
std::vector<float> pre_activations(const std::vector<Input>& in) {
  NoGrad no_grad;
  std::vector<Tensor> t;
  for (const Input& i : in) t.push_back(Tensor::from_vector(i.values, i.shape));
  return linear(t[0], t[1], t[2]).to_vector();
}

// The table of differentiable ops.
std::vector<GradCase> grad_cases() {
  const Input m23 = input({2, 3}, 1), m34 = input({3, 4}, 2), m23b = input({2, 3}, 3);
  const Input x = input({3, 4}, 4), w = input({2, 4}, 5), b = input({2}, 6);
  std::vector<GradCase> cases{
      {"matmul", "", {m23, m34}, [](auto& t) { return matmul(t[0], t[1]); }},
      {"linear", "no bias", {x, w}, [](auto& t) { return linear(t[0], t[1], Tensor()); }},
      {"linear",
       "[*, in] input, as PyTorch",
       {input({2, 3, 4}, 7), w, b},
       [](auto& t) { return linear(t[0], t[1], t[2], Activation::kRelu); }},
      {"linear",
       "[in] input",
       {input({4}, 8), w, b},
       [](auto& t) { return linear(t[0], t[1], t[2]); }},
      {"linear",
       "gelu",
       {x, w, b},
       [](auto& t) { return linear(t[0], t[1], t[2], Activation::kGelu); }},
      {"add", "", {m23, m23b}, [](auto& t) { return add(t[0], t[1]); }},
      {"sub", "", {m23, m23b}, [](auto& t) { return sub(t[0], t[1]); }},
      {"mul", "", {m23}, [](auto& t) { return mul(t[0], -1.75f); }},
      {"relu", "", {{{2, 3}, away_from_zero(6, 7)}}, [](auto& t) { return relu(t[0]); }},
      {"gelu", "", {{{2, 3}, values(6, 8, -3.0, 3.0)}}, [](auto& t) { return gelu(t[0]); }},
      {"sum", "", {m23}, [](auto& t) { return sum(t[0]); }},
      {"mean", "", {m23}, [](auto& t) { return mean(t[0]); }},
      {"mse_loss", "", {m23, m23b}, [](auto& t) { return mse_loss(t[0], t[1]); }},
      {"operator+", "", {m23, m23b}, [](auto& t) { return t[0] + t[1]; }},
      {"operator-", "", {m23, m23b}, [](auto& t) { return t[0] - t[1]; }},
      {"operator*", "tensor * s", {m23}, [](auto& t) { return t[0] * 3.0f; }},
      {"operator*", "s * tensor", {m23}, [](auto& t) { return 0.5f * t[0]; }},
      {"view",
       "inner elements",
       {m23},
       [](auto& t) {
         return t[0].view(1, {2, 2});
       }},
      {"view", "all", {m23}, [](auto& t) { return t[0].view(0, {6}); }},
      {"reshape",
       "",
       {m23},
       [](auto& t) {
         return t[0].reshape({3, 2});
       }},
      {"clone", "", {m23}, [](auto& t) { return t[0].clone(); }},
      {"to", "same device", {m23}, [](auto& t) { return t[0].to(Device::cpu()); }},
  };
  // functional.h. Inputs of log, sqrt and pow are kept in [0.5, 2], clamp's more than 2h from
  // its bounds, max's arguments more than 2h apart.
  const Input row3 = input({3}, 20), col2 = input({2, 1}, 21), one = input({1}, 22);
  const Input positive{{2, 3}, values(6, 23, 0.5, 2.0)};
  const Input m43 = input({4, 3}, 24), m32 = input({3, 2}, 25);
  const std::vector<GradCase> functional{
      {"mul", "same shape", {m23, m23b}, [](auto& t) { return mul(t[0], t[1]); }},
      {"mul", "row vector", {m23, row3}, [](auto& t) { return mul(t[0], t[1]); }},
      {"mul", "column", {m23, col2}, [](auto& t) { return mul(t[0], t[1]); }},
      {"mul", "scalar first", {one, m23}, [](auto& t) { return mul(t[0], t[1]); }},
      {"div", "", {m23, {{3}, values(3, 26, 0.5, 2.0)}}, [](auto& t) { return div(t[0], t[1]); }},
      {"div", "scalar", {m23}, [](auto& t) { return div(t[0], 0.75f); }},
      {"add", "row vector (bias)", {m23, row3}, [](auto& t) { return add(t[0], t[1]); }},
      {"add", "scalar", {m23}, [](auto& t) { return add(t[0], 0.5f); }},
      {"sub", "column", {m23, col2}, [](auto& t) { return sub(t[0], t[1]); }},
      {"sub", "scalar", {m23}, [](auto& t) { return sub(t[0], 0.5f); }},
      {"neg", "", {m23}, [](auto& t) { return neg(t[0]); }},
      {"exp", "", {m23}, [](auto& t) { return exp(t[0]); }},
      {"log", "", {positive}, [](auto& t) { return log(t[0]); }},
      {"sqrt", "", {positive}, [](auto& t) { return sqrt(t[0]); }},
      {"tanh", "", {m23}, [](auto& t) { return tanh(t[0]); }},
      {"sigmoid", "", {m23}, [](auto& t) { return sigmoid(t[0]); }},
      {"pow", "2.5", {positive}, [](auto& t) { return pow(t[0], 2.5f); }},
      {"pow", "-1", {positive}, [](auto& t) { return pow(t[0], -1.0f); }},
      {"clamp",
       "",
       {{{2, 3}, {-0.9f, -0.3f, 0.2f, 0.7f, 0.1f, -0.75f}}},
       [](auto& t) { return clamp(t[0], -0.5f, 0.5f); }},
      {"operator*", "tensor * tensor", {m23, row3}, [](auto& t) { return t[0] * t[1]; }},
      {"operator/", "tensor / tensor", {m23, positive}, [](auto& t) { return t[0] / t[1]; }},
      {"operator/", "tensor / s", {m23}, [](auto& t) { return t[0] / 4.0f; }},
      {"operator+", "tensor + s", {m23}, [](auto& t) { return t[0] + 1.0f; }},
      {"operator-", "tensor - s and -tensor", {m23}, [](auto& t) { return -(t[0] - 1.0f); }},
      {"transpose", "", {m23}, [](auto& t) { return transpose(t[0]); }},
      {"narrow", "columns", {m43}, [](auto& t) { return narrow(t[0], 1, 1, 2); }},
      {"narrow", "rows", {m43}, [](auto& t) { return narrow(t[0], 0, 1, 2); }},
      {"cat",
       "dim 1",
       {m23, col2},
       [](auto& t) {
         return cat({t[0], t[1]}, 1);
       }},
      {"cat",
       "dim 0",
       {m23, m23b},
       [](auto& t) {
         return cat({t[0], t[1]}, 0);
       }},
      {"sum", "dim 1", {m43}, [](auto& t) { return sum(t[0], 1); }},
      {"sum", "dim 0, keepdim", {m43}, [](auto& t) { return sum(t[0], 0, true); }},
      {"mean", "dim -1", {m43}, [](auto& t) { return mean(t[0], -1); }},
      {"softmax", "dim 1", {m43}, [](auto& t) { return softmax(t[0], 1); }},
      {"softmax", "dim 0", {m43}, [](auto& t) { return softmax(t[0], 0); }},
      {"log_softmax", "", {m43}, [](auto& t) { return log_softmax(t[0], -1); }},
      {"cross_entropy",
       "",
       {m43},
       [](auto& t) {
         const std::vector<std::int64_t> targets{2, 0, 1, 2};
         return cross_entropy(t[0], Tensor::from_int64(targets, {4}));
       }},
      {"cross_entropy",
       "ignore_index, label smoothing",
       {m43},
       [](auto& t) {
         const std::vector<std::int64_t> targets{2, -1, 1, 0};
         return cross_entropy(t[0], Tensor::from_int64(targets, {4}),
                              {.ignore_index = -1, .label_smoothing = 0.2f});
       }},
      {"embedding",
       "repeated indices, 2-D",
       {input({5, 3}, 31)},
       [](auto& t) {
         const std::vector<std::int64_t> index{4, 0, 4, 2, 4, 1};
         return embedding(t[0], Tensor::from_int64(index, {2, 3}));
       }},
      {"dropout",
       "",
       {m43},
       [](auto& t) { return dropout(t[0], 0.4f, true, RandomStream{.seed = 5, .stream = 1}); }},
      {"layer_norm",
       "weight, bias",
       {m43, row3, input({3}, 27)},
       [](auto& t) { return layer_norm(t[0], t[1], t[2]); }},
      {"layer_norm", "plain", {m43}, [](auto& t) { return layer_norm(t[0], Tensor(), Tensor()); }},
      {"matmul",
       "of a transpose",
       {m32, m34},
       [](auto& t) { return matmul(transpose(t[0]), narrow(t[1], 1, 0, 3)); }},
  };
  cases.insert(cases.end(), functional.begin(), functional.end());
  // linear with ReLU: inputs whose pre-activations are all at least 2h from the kink.
  for (std::uint64_t seed = 10;; ++seed) {
    const std::vector<Input> in{input({3, 4}, seed), input({2, 4}, seed + 1), input({2}, seed + 2)};
    const std::vector<float> z = pre_activations(in);
    if (std::all_of(z.begin(), z.end(), [](float v) { return std::abs(v) > 0.05f; })) {
      cases.push_back({"linear", "relu, bias", in,
                       [](auto& t) { return linear(t[0], t[1], t[2], Activation::kRelu); }});
      break;
    }
  }
  if (cuda_device_count() > 0) {
    cases.push_back({"to", "cuda and back", {m23}, [](auto& t) {
                       return (t[0].to(Device::cuda(0)) * 2.0f).to(Device::cpu());
                     }});
  }
  return cases;
}

// Public functions that return a tensor without autograd history, and why.
const std::vector<std::pair<std::string, std::string>> kNoHistory{
    {"detach", "stops the gradient by definition (torch.Tensor.detach)"},
    {"grad", "the gradient buffer of a leaf, not a function of its values"},
    {"empty", "factory: reads no tensor"},
    {"zeros", "factory: reads no tensor"},
    {"full", "factory: reads no tensor"},
    {"ones", "factory: reads no tensor"},
    {"uniform", "factory: reads no tensor"},
    {"normal", "factory: reads no tensor"},
    {"from_vector", "factory: reads host floats"},
    {"from_int64", "factory: reads host integers (indices carry no gradient)"},
    {"empty_like", "factory: reads only the other tensor's shape, device and dtype"},
    {"record", "autograd's recording itself: returns its output with the backward it is given"},
    {"unpack", "SavedTensor: the tensor a backward function saved, a detached handle"},
};

// In-place writes of values: not differentiable, so refused into (or, for copy_from, from) a
// tensor that requires a gradient while autograd records. Each gets a tensor that requires one.
struct InPlace {
  std::string name;
  std::function<void(Tensor& requires_grad)> write;
};
const std::vector<InPlace> kInPlace{
    {"copy_from", [](Tensor& t) { t.copy_from(Tensor::zeros(t.shape())); }},
    {"fill", [](Tensor& t) { t.fill(1.0f); }},
    {"zero", [](Tensor& t) { t.zero(); }},
};
// The other void members: autograd's own bookkeeping, not writes of values.
const std::set<std::string> kBookkeeping{
    "set_data",  // PyTorch's `p.data = ...`
    "set_grad_fn",      "set_grad", "zero_grad", "backward",
    "release_grad",        // PyTorch's `p.grad = None`
    "drop_grad_buffer",    // the gradient lives elsewhere (ZeRO-2's shard)
    "set_grad_source",     // where a leaf's gradient buffer comes from (ZeRO-2)
    "increment_version"};  // counts a write made through data(): writes nothing itself

// The engine's source folder.
fs::path engine_dir() {
  const char* source = std::getenv("NANODDP_SOURCE_DIR");
  REQUIRE_MESSAGE(source != nullptr, "NANODDP_SOURCE_DIR is not set (run the tests with ctest)");
  for (const char* dir : {"engine"}) {
    const fs::path path = fs::path(source) / dir;
    if (fs::exists(path / "tensor.h")) return path;
  }
  FAIL("cannot find the engine's headers under " << source);
  return {};
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The names of the functions declared by `regex` (first group) in `text`.
std::set<std::string> declared(const std::string& text, const std::string& regex) {
  std::set<std::string> names;
  const std::regex re(regex);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    names.insert((*it)[1].str());
  }
  return names;
}

// The body of `class Tensor { ... };` in tensor.h.
std::string tensor_class(const std::string& header) {
  const std::size_t begin = header.find("class Tensor {");
  REQUIRE(begin != std::string::npos);
  const std::size_t end = header.find("\n};", begin);
  REQUIRE(end != std::string::npos);
  return header.substr(begin, end - begin);
}

Tensor leaf(const Input& in) {
  Tensor t = Tensor::from_vector(in.values, in.shape);
  t.set_requires_grad(true);
  return t;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("every public op: differentiable ones match finite differences, the rest say why not") {
  const std::vector<GradCase> cases = grad_cases();

  // 1. The table covers every function or member that an engine header declares returning a
  //    tensor (ops.h, Tensor's members, ...), and every void member of Tensor is either an
  //    in-place write or bookkeeping.
  std::set<std::string> returns_tensor;
  for (const auto& entry : fs::directory_iterator(engine_dir())) {
    if (entry.path().extension() != ".h") continue;
    for (const std::string& name :
         declared(read_text(entry.path()),
                  R"(\n\s*(?:inline |static )*Tensor (\w+|operator[^\s(]+)\()")) {
      returns_tensor.insert(name);
    }
  }
  const std::string tensor_h = tensor_class(read_text(engine_dir() / "tensor.h"));
  REQUIRE(returns_tensor.count("matmul") == 1);  // the parse itself works
  REQUIRE(returns_tensor.count("reshape") == 1);
  REQUIRE(returns_tensor.count("operator+") == 1);
  std::set<std::string> in_table;
  for (const GradCase& c : cases) in_table.insert(c.name);
  for (const auto& [name, why] : kNoHistory) in_table.insert(name);
  CHECK_MESSAGE(returns_tensor == in_table, "the engine's headers declare ["
                                                << fmt::format("{}", fmt::join(returns_tensor, " "))
                                                << "] but the table holds ["
                                                << fmt::format("{}", fmt::join(in_table, " "))
                                                << "]: give a new op a gradient case");
  std::set<std::string> void_members = declared(tensor_h, R"(\n\s+void (\w+)\()");
  std::set<std::string> classified = kBookkeeping;
  for (const InPlace& w : kInPlace) classified.insert(w.name);
  CHECK_MESSAGE(void_members == classified, "Tensor's void members ["
                                                << fmt::format("{}", fmt::join(void_members, " "))
                                                << "] are not all classified");

  // 2. The finite-difference check of every differentiable op.
  constexpr double kStep = 1e-2;
  double worst = 0.0;
  for (const GradCase& c : cases) {
    CAPTURE(c.name);
    CAPTURE(c.variant);
    std::vector<Tensor> leaves;
    for (const Input& in : c.inputs) leaves.push_back(leaf(in));
    const Tensor y = c.apply(leaves);
    REQUIRE_MESSAGE(y.requires_grad(), c.name << " returned a tensor with no autograd history");
    const std::int64_t n = y.numel();
    const std::vector<float> r = values(static_cast<std::size_t>(n), 99);
    sum(matmul(y.reshape({1, n}), Tensor::from_vector(r, {n, 1}))).backward();

    const auto f = [&](const std::vector<Input>& inputs) {
      const NoGrad no_grad;
      std::vector<Tensor> t;
      for (const Input& in : inputs) t.push_back(Tensor::from_vector(in.values, in.shape));
      const std::vector<float> out = c.apply(t).to_vector();
      double acc = 0.0;
      for (std::size_t j = 0; j < out.size(); ++j) acc += static_cast<double>(r[j]) * out[j];
      return acc;
    };
    for (std::size_t k = 0; k < c.inputs.size(); ++k) {
      CAPTURE(k);
      REQUIRE_MESSAGE(leaves[k].grad().defined(), "input " << k << " got no gradient");
      const std::vector<float> analytic = leaves[k].grad().to_vector();
      std::vector<Input> inputs = c.inputs;
      for (std::size_t e = 0; e < analytic.size(); ++e) {
        const float saved = inputs[k].values[e];
        const float plus = static_cast<float>(saved + kStep);
        const float minus = static_cast<float>(saved - kStep);
        inputs[k].values[e] = plus;
        const double f_plus = f(inputs);
        inputs[k].values[e] = minus;
        const double f_minus = f(inputs);
        inputs[k].values[e] = saved;
        const double numeric = (f_plus - f_minus) / (static_cast<double>(plus) - minus);
        const double error = std::abs(numeric - analytic[e]);
        worst = nanoddp::test::worse(worst, error / (1.0 + std::abs(numeric)));
        CHECK_MESSAGE(error <= 1e-3 + 1e-3 * std::abs(numeric),
                      "element " << e << ": analytic " << analytic[e] << ", numeric " << numeric);
      }
    }
  }
  MESSAGE("worst relative error over " << cases.size() << " cases: " << worst);

  // 3. What returns a tensor without history does so even from a tensor that requires one.
  Tensor w = leaf(input({2, 3}, 50));
  CHECK_FALSE(w.detach().requires_grad());
  CHECK_FALSE(Tensor::empty_like(w).requires_grad());
}

TEST_CASE("views, copies and moves keep autograd history: relu(w) + f(2 w) gives w.grad 3") {
  // The issue's example: with f a view that dropped history, w.grad was relu's 1 alone.
  const std::vector<float> positive = values(6, 60, 0.5, 1.0);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> fs{
      {"reshape",
       [](const Tensor& t) {
         return t.reshape({2, 3});
       }},
      {"reshape twice",
       [](const Tensor& t) {
         return t.reshape({6}).reshape({2, 3});
       }},
      {"view",
       [](const Tensor& t) {
         return t.view(0, {2, 3});
       }},
      {"clone", [](const Tensor& t) { return t.clone(); }},
      {"to", [](const Tensor& t) { return t.to(Device::cpu()); }},
  };
  for (const auto& [name, fn] : fs) {
    CAPTURE(name);
    Tensor w = Tensor::from_vector(positive, {2, 3});
    w.set_requires_grad(true);
    sum(relu(w) + fn(2.0f * w)).backward();
    CHECK(w.grad().to_vector() == std::vector<float>(6, 3.0f));
  }
}

TEST_CASE("non-differentiable paths throw instead of cutting the gradient") {
  const Input in = input({2, 3}, 70);
  SUBCASE("every in-place write into a leaf that requires a gradient; fine under NoGrad") {
    for (const InPlace& write : kInPlace) {
      CAPTURE(write.name);
      Tensor w = leaf(in);
      const std::string message = error_of([&] { write.write(w); });
      CHECK_MESSAGE(message.find("not differentiable") != std::string::npos, message);
      CHECK(message.find(write.name) != std::string::npos);
      CHECK(w.to_vector() == in.values);  // nothing was written
      const NoGrad no_grad;
      write.write(w);
      CHECK(w.to_vector() != in.values);
    }
  }
  SUBCASE("in-place writes into a computed tensor and into a view of a leaf") {
    for (const InPlace& write : kInPlace) {
      CAPTURE(write.name);
      Tensor w = leaf(in);
      Tensor y = relu(w);
      CHECK_THROWS_WITH_AS(write.write(y), doctest::Contains("not differentiable"), Error);
      Tensor v = w.view(0, {2, 3});
      CHECK_THROWS_WITH_AS(write.write(v), doctest::Contains("not differentiable"), Error);
    }
  }
  SUBCASE("copy_from a tensor that requires a gradient into one that does not") {
    Tensor w = leaf(in);
    Tensor dst = Tensor::zeros({2, 3});
    CHECK_THROWS_WITH_AS(dst.copy_from(w), doctest::Contains("not recorded by autograd"), Error);
    CHECK_FALSE(dst.requires_grad());
    dst.copy_from(w.detach());
    CHECK(dst.to_vector() == in.values);
  }
  SUBCASE("a view past the tensor's own elements (into the rest of its flat buffer)") {
    Tensor buffer = Tensor::from_vector(values(8, 71), {8});
    Tensor p = buffer.view(0, {4});
    p.set_requires_grad(true);
    CHECK_THROWS_WITH_AS(p.view(2, {4}), doctest::Contains("not differentiable"), Error);
    const NoGrad no_grad;
    CHECK(p.view(2, {4}).to_vector() == buffer.view(2, {4}).to_vector());
  }
  SUBCASE("bf16 tensors cannot require a gradient (gradients are float32)") {
    Tensor h = Tensor::empty({4}, Device::cpu(), DType::kBF16);
    CHECK_THROWS_WITH_AS(h.set_requires_grad(true), doctest::Contains("float32"), Error);
    Tensor w = leaf(in);
    CHECK_THROWS_WITH_AS(w.set_data(Tensor::empty({2, 3}, Device::cpu(), DType::kBF16)),
                         doctest::Contains("float32"), Error);
  }
}

}  // namespace nanoddp
