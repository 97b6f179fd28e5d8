#pragma once
// The ops research models need beyond ops.h, with PyTorch's names and semantics (torch.* and
// torch.nn.functional.*). Every one is differentiable, runs on the CPU and on CUDA (kernels in
// kernels/{cpu,cuda}/{pointwise,shape,rowwise}), and its backward is written by hand next to
// its forward in functional.cpp.
//
// Broadcasting. Binary ops (add, sub, mul, div) broadcast as PyTorch does when each operand's
// non-broadcast dimensions are one contiguous run: same shapes, a scalar, a row vector [C] or
// [1, C] over a batch [N, C], a column [N, 1], and the like. Shapes such as [N, 1, C] against
// [1, M, 1] are refused with an Error naming both shapes.
//
// Dimensions may be negative (counted from the end), as in PyTorch.

#include <cstdint>
#include <limits>
#include <vector>

#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"

namespace nanoddp {

// ---- elementwise ----------------------------------------------------------------------------
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, float scalar);
Tensor add(const Tensor& a, float scalar);
Tensor sub(const Tensor& a, float scalar);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor pow(const Tensor& x, float exponent);
// min(max(x, min), max); the gradient passes where min <= x <= max (PyTorch's clamp).
Tensor clamp(const Tensor& x, float min, float max = std::numeric_limits<float>::infinity());

inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator/(const Tensor& a, float s) {
  return div(a, s);
}
inline Tensor operator+(const Tensor& a, float s) {
  return add(a, s);
}
inline Tensor operator-(const Tensor& a, float s) {
  return sub(a, s);
}
inline Tensor operator-(const Tensor& x) {
  return neg(x);
}

// ---- shape ----------------------------------------------------------------------------------
// Swaps the two dimensions of a 2-D tensor (a copy, since tensors have no strides).
Tensor transpose(const Tensor& x, std::int64_t dim0 = 0, std::int64_t dim1 = 1);
// Elements start .. start + length - 1 along dim (a copy; the gradient flows back into them).
// A negative start counts from the end (PyTorch): -1 is the last element.
Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length);
// Joins tensors that agree in every dimension but dim.
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim = 0);
// Pieces of split_size along dim (the last one shorter when split_size does not divide it).
std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim = 0);

// ---- reductions -----------------------------------------------------------------------------
Tensor sum(const Tensor& x, std::int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x, std::int64_t dim, bool keepdim = false);
// The maximum along dim and where it is (int64, the first on ties); the gradient goes to that
// element alone.
struct MaxResult {
  Tensor values;
  Tensor indices;
};
MaxResult max(const Tensor& x, std::int64_t dim, bool keepdim = false);

// ---- heads, losses, regularisation ----------------------------------------------------------
Tensor softmax(const Tensor& x, std::int64_t dim);
Tensor log_softmax(const Tensor& x, std::int64_t dim);

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  // rows with this target count neither loss nor batch
  float label_smoothing = 0.0f;      // in [0, 1]
};
// Mean over the batch of -log softmax(logits)[target] (PyTorch's F.cross_entropy with
// reduction='mean'): logits [N, C] float32, targets [N] int64 class indices on the same device.
// Computed from the log-sum-exp with the maximum subtracted, so large logits do not overflow; a
// -inf logit (a masked class) gives PyTorch's finite loss, and a -inf at the target +inf.
// A target outside [0, C) is an Error on the CPU and a NaN loss on CUDA (no host sync).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});

// Inverted dropout (PyTorch's F.dropout): in training each element is zeroed with probability p
// and the rest scaled by 1 / (1 - p); in evaluation x itself is returned. The mask is a pure
// function of rng (kernels/philox.h): the same rng gives the same mask on any device, and the
// backward regenerates it instead of storing it. Give each call and each rank its own rng
// (nn::Dropout does).
Tensor dropout(const Tensor& x, float p, bool training, RandomStream rng);

// Rows of `weight` [num_embeddings, dim] picked by int64 `indices` of any shape (PyTorch's
// F.embedding): the output is indices.shape + [dim]. The weight's gradient is the scatter-add of
// the output's gradient rows (a repeated index sums them). An index outside
// [0, num_embeddings) is an Error on the CPU, naming it, and a row of NaN on CUDA (no host
// sync; its gradient is dropped).
Tensor embedding(const Tensor& weight, const Tensor& indices);

// Layer norm over the last dimension (PyTorch's F.layer_norm with normalized_shape [C]):
// weight and bias are [C] or undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);

}  // namespace nanoddp
