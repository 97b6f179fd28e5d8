// Saved tensors and in-place writes (engine/autograd.h, SavedTensor; Tensor::version): a tensor
// a backward function needs that was written in place between the forward and the backward
// must stop the backward, naming the op, not give a wrong gradient. And what an op does not
// save may be written freely. An outside tester found backward reading whatever the tensor
// held by then: d(sum(x * w))/dw came out as the new x.

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/functional.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/module.h"
#include "nanoddp/nn/optimizer.h"

namespace nanoddp {
namespace {

Tensor leaf(std::vector<float> values) {
  const Shape shape{static_cast<std::int64_t>(values.size())};
  return Tensor::from_vector(values, shape).set_requires_grad(true);
}

// The backward's error, or "" when it ran.
std::string backward_error(const Tensor& loss) {
  try {
    loss.backward();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

bool refused(const std::string& error, const std::string& op) {
  return error.find("backward through '" + op + "': a tensor it saved for backward") !=
             std::string::npos &&
         error.find("was written in place after the forward used it") != std::string::npos;
}

}  // namespace

TEST_CASE("saved tensors: an input written after the forward stops the backward, naming the op") {
  SUBCASE("a refilled input buffer") {
    Tensor x = Tensor::from_vector(std::vector<float>{1, 1, 1}, {3});
    Tensor w = leaf({2, 2, 2});
    const Tensor loss = sum(mul(x, w));
    x.copy_from(Tensor::from_vector(std::vector<float>{10, 10, 10}, {3}));  // the next batch
    const std::string error = backward_error(loss);
    INFO(error);
    CHECK(refused(error, "mul"));
    CHECK(error.find("its version is 1, it was 0 when saved") != std::string::npos);
  }
  SUBCASE("a parameter changed under NoGrad (weight clipping)") {
    Tensor v = leaf({1, 2});
    const Tensor loss = sum(mul(v, v));
    {
      NoGrad no_grad;
      v.fill(5);
    }
    CHECK(refused(backward_error(loss), "mul"));
  }
  SUBCASE("an op's saved output changed, through a view of it") {
    Tensor u = leaf({0, 0, 0, 0});
    const Tensor y = exp(u);
    const Tensor loss = sum(y);
    {
      NoGrad no_grad;
      y.view(2, {2}).fill(7);
    }
    CHECK(refused(backward_error(loss), "exp"));
  }
  SUBCASE("through a detach()ed handle, or a write the library does not see") {
    Tensor x = Tensor::from_vector(std::vector<float>{1, 2}, {2});
    Tensor w = leaf({3, 4});
    const Tensor loss = sum(mul(x, w));
    x.detach().zero();
    CHECK(refused(backward_error(loss), "mul"));

    const Tensor again = sum(mul(x, w));
    x.data()[0] = 9.0f;  // raw: counted by hand
    x.increment_version();
    CHECK(refused(backward_error(again), "mul"));
  }
  SUBCASE("class indices refilled before backward") {
    Tensor table = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
    table.set_requires_grad(true);
    Tensor index = Tensor::from_int64(std::vector<std::int64_t>{0, 2}, {2});
    const Tensor emb = sum(embedding(table, index));
    Tensor labels = Tensor::from_int64(std::vector<std::int64_t>{1, 0}, {2});
    const Tensor ce = cross_entropy(narrow(table, 0, 0, 2), labels);
    index.copy_from(Tensor::from_int64(std::vector<std::int64_t>{1, 1}, {2}));
    labels.copy_from(Tensor::from_int64(std::vector<std::int64_t>{0, 0}, {2}));
    CHECK(refused(backward_error(emb), "embedding"));
    CHECK(refused(backward_error(ce), "cross_entropy"));
  }
}

TEST_CASE("saved tensors: what an op does not save may be written, and the gradient is right") {
  // add and exp need no input values for their gradients (exp keeps its output): PyTorch lets
  // these inputs be written, and so does nanoddp.
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  Tensor w = leaf({0.5f, -1.0f});
  const Tensor loss = add(sum(add(a, w)), sum(exp(w)));
  {
    NoGrad no_grad;
    a.fill(100);
  }
  REQUIRE(backward_error(loss).empty());
  const std::vector<float> g = w.grad().to_vector();
  CHECK(g[0] == doctest::Approx(1.0 + std::exp(0.5)));
  CHECK(g[1] == doctest::Approx(1.0 + std::exp(-1.0)));
}

// A second outside tester's: a write through the flat buffer (FlatParameters::values(), or a
// view of it) reached the parameters' values but not their counters; backward's own writes into
// a gradient buffer were not counted either; and operands no gradient reads were refused.
TEST_CASE("saved tensors: writes through the flat buffer and into gradients count, names given") {
  struct One : nn::Module {
    Generator generator{2};
    std::shared_ptr<nn::Linear> layer =
        register_module("layer", std::make_shared<nn::Linear>(3, 2, generator));
    std::string describe() const override { return "One"; }
  } model;
  nn::FlatParameters params(model, Device::cpu());
  const Tensor x = Tensor::ones({4, 3}).set_requires_grad(true);
  for (const int how : {0, 1, 2}) {
    CAPTURE(how);
    const Tensor loss = sum(model.layer->forward(x));
    {
      NoGrad no_grad;
      Tensor values = params.values();
      if (how == 0) values.fill(3.0f);
      if (how == 1) values.view(0, {2}).zero();  // the bias's slice (first in layout)
      if (how == 2) {
        values.data()[7] = 1.0f;
        values.increment_version();
      }
    }
    const std::string error = backward_error(loss);
    INFO(error);
    CHECK(refused(error, "linear"));
    CHECK(error.find("('layer.weight', shape [2, 3])") != std::string::npos);
  }

  // w.grad() read by the next forward, then accumulated into by its backward (no zero_grad).
  Tensor w = leaf({1, 2, 3});
  sum(mul(w, 2.0f)).backward();
  const Tensor v = leaf({5, 6, 7});
  const Tensor reads_grad = sum(mul(v, w.grad()));
  const Tensor adds_to_grad = sum(mul(w, 2.0f));  // newer: its backward runs first
  CHECK(refused(backward_error(add(reads_grad, adds_to_grad)), "mul"));
}

TEST_CASE("saved tensors: an operand whose partner gets no gradient is not saved, as in PyTorch") {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  Tensor b = leaf({3, 4});
  const Tensor loss = sum(mul(b, a));  // b's gradient reads a, a's would read b: only a saved
  Tensor m = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor k = leaf({1, 0, 0, 1});
  const Tensor product = sum(matmul(m, k.reshape({2, 2})));
  Tensor x = Tensor::ones({2, 2});
  Tensor weight = leaf({1, 2, 3, 4});
  const Tensor layer = sum(linear(x, weight.reshape({2, 2}), Tensor()));
  {
    NoGrad no_grad;
    b.fill(9);       // read by no gradient: a gets none
    k.fill(9);       // the same for matmul's right operand
    weight.fill(9);  // and a first layer's weight (its input gets no gradient)
  }
  CHECK(backward_error(loss).empty());
  CHECK(b.grad().to_vector() == std::vector<float>{1, 2});
  CHECK(backward_error(product).empty());
  CHECK(k.grad().to_vector() == std::vector<float>{4, 4, 6, 6});
  CHECK(backward_error(layer).empty());
  CHECK(weight.grad().to_vector() == std::vector<float>{2, 2, 2, 2});
}

TEST_CASE("saved tensors: parameters in one flat buffer keep their own versions") {
  // Writing one parameter (the optimizer in backward updates a layer while earlier layers'
  // nodes still hold their weights) must not invalidate another's saved value.
  struct Two : nn::Module {
    Generator generator{1};
    std::shared_ptr<nn::Linear> first =
        register_module("first", std::make_shared<nn::Linear>(3, 4, generator));
    std::shared_ptr<nn::Linear> second =
        register_module("second", std::make_shared<nn::Linear>(4, 2, generator));
    std::string describe() const override { return "Two"; }
  } model;
  nn::FlatParameters params(model, Device::cpu());
  nn::Linear& first = *model.first;
  nn::Linear& second = *model.second;
  const Tensor x = Tensor::ones({5, 3});
  const Tensor loss = sum(first.forward(x));
  {
    NoGrad no_grad;
    second.weight().detach().fill(0.25f);
  }
  CHECK(backward_error(loss).empty());

  SUBCASE("an optimizer step between the forward and the backward is refused") {
    nn::SGD sgd(params, {.lr = 0.1f});
    // The second layer saves its weight (its input gets a gradient); the first does not.
    const Tensor next = sum(second.forward(first.forward(x)));
    next.backward();
    const Tensor stale = sum(second.forward(first.forward(x)));
    sgd.step();  // updates every parameter that has a gradient
    CHECK(refused(backward_error(stale), "linear"));
  }
}

}  // namespace nanoddp
