#pragma once
// A module with two Linear layers of which forward uses only the first: the second never gets a
// gradient. For the tests of what happens to parameters a backward pass does not reach.

#include <cstdint>
#include <memory>
#include <string>

#include "nanoddp/nn/layers.h"

namespace nanoddp::nn::testing {

class HalfUsed : public Module {
 public:
  // first: Linear(in, out), used; second: Linear(out, out), never used.
  HalfUsed(Generator& gen, std::int64_t in, std::int64_t out)
      : first_(register_module("first", std::make_shared<Linear>(in, out, gen))),
        second_(register_module("second", std::make_shared<Linear>(out, out, gen))) {}
  Tensor forward(const Tensor& x) override { return first_->forward(x); }
  std::string describe() const override { return "HalfUsed"; }

 private:
  std::shared_ptr<Linear> first_;
  std::shared_ptr<Linear> second_;
};

}  // namespace nanoddp::nn::testing
