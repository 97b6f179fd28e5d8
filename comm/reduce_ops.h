#pragma once
// The element-wise reductions of ReduceOp (internal to nanoddp/comm): Gloo's ring all-reduce
// and the shared-memory all-reduce combine buffers with these same functors, so both paths
// round alike.

#include <algorithm>

namespace nanoddp::comm::detail {

struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct Min {
  float operator()(float a, float b) const { return std::min(a, b); }
};

}  // namespace nanoddp::comm::detail
