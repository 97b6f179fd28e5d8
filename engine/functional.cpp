// The research ops of functional.h. Each op: check its operands, run the forward kernel on the
// device's Backend, and record a backward lambda that captures what it needs (detached, so no
// reference cycles through the graph).

#include "nanoddp/engine/functional.h"

#include <algorithm>
#include <cmath>

#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/op_checks.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {

namespace {

using op_checks::backend_of;
using op_checks::check_f32;
using op_checks::check_same_device;

using kernels::BinaryOp;
using kernels::Broadcast;
using kernels::UnaryOp;

// A dimension in [-rank, rank) as an index in [0, rank).
std::int64_t wrap_dim(const char* op, std::int64_t dim, std::int64_t rank) {
  if (rank == 0 || dim < -rank || dim >= rank) {
    fail("{}: dimension {} is out of range for a tensor of {} dimensions", op, dim, rank);
  }
  return dim < 0 ? dim + rank : dim;
}

// A tensor seen as [outer, d, inner] around dimension `dim`.
struct Around {
  std::int64_t outer = 1, d = 1, inner = 1;
};
Around around(const Shape& shape, std::int64_t dim) {
  Around a;
  for (std::int64_t k = 0; k < dim; ++k) a.outer *= shape[static_cast<std::size_t>(k)];
  a.d = shape[static_cast<std::size_t>(dim)];
  for (std::size_t k = static_cast<std::size_t>(dim) + 1; k < shape.size(); ++k)
    a.inner *= shape[k];
  return a;
}

// ---- broadcasting -----------------------------------------------------------------------------

// Where an operand of shape `x` is read from an output of shape `out` (kernels::Broadcast): its
// dimensions that are not 1 must match the output's and lie next to each other.
Broadcast pattern(const char* op, const Shape& x, const Shape& out, const Shape& a,
                  const Shape& b) {
  const std::size_t pad = out.size() - x.size();
  std::int64_t div = 1, mod = 1;
  int state = 0;  // 0: before the kept run, 1: in it, 2: after it
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::int64_t o = out[k], s = k < pad ? 1 : x[k - pad];
    if (o == 1) continue;  // a size-1 output dimension is neither kept nor broadcast
    const bool kept = s == o;
    if (kept && state == 2) {
      fail(
          "{}: shapes {} and {} broadcast in a pattern nanoddp does not support (each operand's "
          "non-broadcast dimensions must be adjacent); reshape first",
          op, shape_str(a), shape_str(b));
    }
    if (kept) {
      state = 1;
      mod *= o;
    } else {
      if (state == 1) state = 2;
      if (state == 2) div *= o;
    }
  }
  return Broadcast{.div = div, .mod = mod};
}

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::int64_t x = k + a.size() < out.size() ? 1 : a[k + a.size() - out.size()];
    const std::int64_t y = k + b.size() < out.size() ? 1 : b[k + b.size() - out.size()];
    if (x != y && x != 1 && y != 1) {
      fail("{}: shapes {} and {} do not broadcast (dimension {}: {} vs {})", op, shape_str(a),
           shape_str(b), k, x, y);
    }
    out[k] = x == 1 ? y : x;
  }
  return out;
}

// Hands input i the gradient `full` (the output's shape) summed down to the input's `shape`.
void give_reduced(GradSink& sink, std::size_t i, const Tensor& full, Broadcast p,
                  const Shape& shape) {
  const std::int64_t n = full.numel();
  if (p.mod == n) {
    sink.emit(i, full.detach().reshape(shape));
    return;
  }
  sink.accumulate(i, [&](Tensor& dst, float beta) {
    backend_of(full).sum_to(full.data(), n / (p.mod * p.div), p.mod, p.div, beta, dst.data());
  });
}

Tensor binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_f32(name, a, "the first operand");
  check_f32(name, b, "the second operand");
  check_same_device(name, a, b);
  const Shape shape = broadcast_shape(name, a.shape(), b.shape());
  const Broadcast pa = pattern(name, a.shape(), shape, a.shape(), b.shape());
  const Broadcast pb = pattern(name, b.shape(), shape, a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.device());
  const std::int64_t n = out.numel();
  backend_of(a).binary(op, a.data(), pa, b.data(), pb, out.data(), n);
  // Only what a gradient that will be computed reads is saved: a for mul's db, b for mul's da
  // and div's, the output for div's db. add and sub save nothing, so their operands may be
  // written before backward.
  const bool mul = op == BinaryOp::kMul, div = op == BinaryOp::kDiv;
  return record(
      name, out, {a, b},
      [op, pa, pb, n, shape_a = a.shape(), shape_b = b.shape(),
       sa = mul ? save_for_grad_of(b, a) : SavedTensor(),
       sb = mul   ? save_for_grad_of(a, b)
            : div ? SavedTensor(b)
                  : SavedTensor(),
       sy = div ? save_for_grad_of(b, out) : SavedTensor()](const Tensor& g, GradSink& sink) {
        Backend& be = backend_of(g);
        const Tensor lhs = sa.unpack(), rhs = sb.unpack(), y = sy.unpack();
        const Broadcast same{.div = 1, .mod = n};
        // d/da and d/db of a op b, as full-size tensors, then summed over broadcast
        // dimensions.
        if (sink.needs_grad(0)) {
          Tensor da = g;
          if (op == BinaryOp::kMul || op == BinaryOp::kDiv) {
            da = Tensor::empty_like(g);
            be.binary(op, g.data(), same, rhs.data(), pb, da.data(), n);  // g * b or g / b
          }
          give_reduced(sink, 0, da, pa, shape_a);
        }
        if (sink.needs_grad(1)) {
          Tensor db = g;
          if (op == BinaryOp::kSub) {
            db = Tensor::empty_like(g);
            be.unary(UnaryOp::kAffine, g.data(), -1.0f, 0.0f, db.data(), n);
          } else if (op == BinaryOp::kMul) {
            db = Tensor::empty_like(g);
            be.binary(BinaryOp::kMul, g.data(), same, lhs.data(), pa, db.data(), n);
          } else if (op == BinaryOp::kDiv) {
            // d(a / b)/db = -(a / b) / b = -y / b
            db = Tensor::empty_like(g);
            be.binary(BinaryOp::kMul, g.data(), same, y.data(), same, db.data(), n);
            be.binary(BinaryOp::kDiv, db.data(), same, rhs.data(), pb, db.data(), n);
            be.unary(UnaryOp::kAffine, db.data(), -1.0f, 0.0f, db.data(), n);
          }
          give_reduced(sink, 1, db, pb, shape_b);
        }
      });
}

Tensor unary(const char* name, UnaryOp op, const Tensor& x, float a, float b) {
  check_f32(name, x, "the input");
  Tensor out = Tensor::empty_like(x);
  backend_of(x).unary(op, x.data(), a, b, out.data(), x.numel());
  // Only what the gradient reads is saved: the input (log, pow, clamp), the output (exp, sqrt,
  // tanh, sigmoid), or nothing (affine, division by a number).
  const bool reads_x = op == UnaryOp::kLog || op == UnaryOp::kPow || op == UnaryOp::kClamp;
  const bool reads_y = op == UnaryOp::kExp || op == UnaryOp::kSqrt || op == UnaryOp::kTanh ||
                       op == UnaryOp::kSigmoid;
  return record(name, out, {x},
                [op, a, b, sx = reads_x ? SavedTensor(x) : SavedTensor(),
                 sy = reads_y ? SavedTensor(out) : SavedTensor()](const Tensor& g, GradSink& sink) {
                  const Tensor input = sx.unpack(), y = sy.unpack();
                  Tensor dx = Tensor::empty_like(g);
                  backend_of(g).unary_backward(op, input.defined() ? input.data() : nullptr,
                                               y.defined() ? y.data() : nullptr, a, b, g.data(),
                                               dx.data(), g.numel());
                  sink.emit(0, dx);
                });
}

}  // namespace

// ---- elementwise --------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", BinaryOp::kAdd, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary("sub", BinaryOp::kSub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary("mul", BinaryOp::kMul, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary("div", BinaryOp::kDiv, a, b);
}

Tensor div(const Tensor& a, float s) {
  return unary("div", UnaryOp::kDivScalar, a, s, 0.0f);
}
Tensor add(const Tensor& a, float s) {
  return unary("add", UnaryOp::kAffine, a, 1.0f, s);
}
Tensor sub(const Tensor& a, float s) {
  return unary("sub", UnaryOp::kAffine, a, 1.0f, -s);
}
Tensor neg(const Tensor& x) {
  return unary("neg", UnaryOp::kAffine, x, -1.0f, 0.0f);
}
Tensor exp(const Tensor& x) {
  return unary("exp", UnaryOp::kExp, x, 0.0f, 0.0f);
}
Tensor log(const Tensor& x) {
  return unary("log", UnaryOp::kLog, x, 0.0f, 0.0f);
}
Tensor sqrt(const Tensor& x) {
  return unary("sqrt", UnaryOp::kSqrt, x, 0.0f, 0.0f);
}
Tensor tanh(const Tensor& x) {
  return unary("tanh", UnaryOp::kTanh, x, 0.0f, 0.0f);
}
Tensor sigmoid(const Tensor& x) {
  return unary("sigmoid", UnaryOp::kSigmoid, x, 0.0f, 0.0f);
}
Tensor pow(const Tensor& x, float e) {
  return unary("pow", UnaryOp::kPow, x, e, 0.0f);
}

Tensor clamp(const Tensor& x, float min, float max) {
  if (std::isnan(min) || std::isnan(max) || min > max) {
    fail("clamp: min {} and max {} do not bound a range", min, max);
  }
  return unary("clamp", UnaryOp::kClamp, x, min, max);
}

// ---- shape --------------------------------------------------------------------------------------

Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1) {
  check_f32("transpose", x, "the input");
  if (x.dim() != 2) fail("transpose: only 2-D tensors, got shape {}", shape_str(x.shape()));
  if (wrap_dim("transpose", dim0, 2) == wrap_dim("transpose", dim1, 2)) return x.reshape(x.shape());
  const std::int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = Tensor::empty({cols, rows}, x.device());
  backend_of(x).transpose(x.data(), rows, cols, 0.0f, out.data());
  return record("transpose", out, {x}, [rows, cols](const Tensor& g, GradSink& sink) {
    sink.accumulate(0, [&](Tensor& dx, float beta) {
      backend_of(g).transpose(g.data(), cols, rows, beta, dx.data());
    });
  });
}

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  check_f32("narrow", x, "the input");
  dim = wrap_dim("narrow", dim, x.dim());
  const Around s = around(x.shape(), dim);
  const std::int64_t given = start;
  if (start < 0 && start >= -s.d) start += s.d;  // PyTorch: a negative start counts from the end
  // Compared without forming start + length, which overflows for a start near INT64_MAX.
  if (start < 0 || start > s.d || length < 0 || length > s.d - start) {
    fail(
        "narrow: start {} and length {} do not fit dimension {} of size {} (the start must be in "
        "[-{}, {}], the length in [0, size - start])",
        given, length, dim, s.d, s.d, s.d);
  }
  Shape shape = x.shape();
  shape[static_cast<std::size_t>(dim)] = length;
  Tensor out = Tensor::empty(shape, x.device());
  backend_of(x).copy_block(x.data(), s.d, start, out.data(), length, 0, s.outer, length, s.inner,
                           0.0f);
  return record("narrow", out, {x}, [s, start, length](const Tensor& g, GradSink& sink) {
    sink.accumulate(0, [&](Tensor& dx, float beta) {
      Backend& be = backend_of(g);
      if (beta == 0.0f) be.fill(dx.data(), dx.numel(), 0.0f);  // the elements not taken
      be.copy_block(g.data(), length, 0, dx.data(), s.d, start, s.outer, length, s.inner, beta);
    });
  });
}

Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  if (tensors.empty()) fail("cat: no tensors to join");
  const Tensor& first = tensors.front();
  check_f32("cat", first, "tensor 0");
  dim = wrap_dim("cat", dim, first.dim());
  Shape shape = first.shape();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_f32("cat", t, "a tensor");
    check_same_device("cat", first, t);
    Shape other = t.shape();
    if (other.size() != shape.size()) {
      fail("cat: tensor {} has shape {}, tensor 0 {}", i, shape_str(other), shape_str(shape));
    }
    other[static_cast<std::size_t>(dim)] = shape[static_cast<std::size_t>(dim)];
    if (other != shape) {
      fail("cat: tensor {} has shape {}, which differs from tensor 0's {} outside dimension {}", i,
           shape_str(t.shape()), shape_str(first.shape()), dim);
    }
    total += t.size(dim);
  }
  shape[static_cast<std::size_t>(dim)] = total;
  Tensor out = Tensor::empty(shape, first.device());
  const Around s = around(shape, dim);
  std::vector<std::int64_t> lengths;
  std::int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const std::int64_t len = t.size(dim);
    backend_of(first).copy_block(t.data(), len, 0, out.data(), total, offset, s.outer, len, s.inner,
                                 0.0f);
    lengths.push_back(len);
    offset += len;
  }
  return record("cat", out, tensors, [s, lengths](const Tensor& g, GradSink& sink) {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::int64_t len = lengths[i];
      if (sink.needs_grad(i)) {
        sink.accumulate(i, [&](Tensor& dx, float beta) {
          backend_of(g).copy_block(g.data(), s.d, at, dx.data(), len, 0, s.outer, len, s.inner,
                                   beta);
        });
      }
      at += len;
    }
  });
}

std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  check_f32("split", x, "the input");
  dim = wrap_dim("split", dim, x.dim());
  if (split_size <= 0) fail("split: split_size must be positive, got {}", split_size);
  std::vector<Tensor> pieces;
  const std::int64_t d = x.size(dim);
  for (std::int64_t start = 0; start < d; start += split_size) {
    pieces.push_back(narrow(x, dim, start, std::min(split_size, d - start)));
  }
  return pieces;
}

// ---- reductions -------------------------------------------------------------------------------

namespace {

Shape reduced_shape(const Shape& shape, std::int64_t dim, bool keepdim) {
  Shape out = shape;
  if (keepdim) {
    out[static_cast<std::size_t>(dim)] = 1;
  } else {
    out.erase(out.begin() + dim);
  }
  return out;
}

Tensor sum_along(const char* name, const Tensor& x, std::int64_t dim, bool keepdim, bool mean) {
  check_f32(name, x, "the input");
  dim = wrap_dim(name, dim, x.dim());
  const Around s = around(x.shape(), dim);
  // The mean over an empty dimension is NaN, as in PyTorch: alpha is +inf, each sum 0.
  const float alpha = mean ? 1.0f / static_cast<float>(s.d) : 1.0f;
  Tensor out = Tensor::empty(reduced_shape(x.shape(), dim, keepdim), x.device());
  backend_of(x).sum_dim(x.data(), s.outer, s.d, s.inner, alpha, out.data());
  return record(name, out, {x}, [s, alpha](const Tensor& g, GradSink& sink) {
    sink.accumulate(0, [&](Tensor& dx, float beta) {
      backend_of(g).expand_dim(g.data(), s.outer, s.d, s.inner, alpha, beta, dx.data());
    });
  });
}

}  // namespace

Tensor sum(const Tensor& x, std::int64_t dim, bool keepdim) {
  return sum_along("sum", x, dim, keepdim, false);
}

Tensor mean(const Tensor& x, std::int64_t dim, bool keepdim) {
  return sum_along("mean", x, dim, keepdim, true);
}

MaxResult max(const Tensor& x, std::int64_t dim, bool keepdim) {
  check_f32("max", x, "the input");
  dim = wrap_dim("max", dim, x.dim());
  const Around s = around(x.shape(), dim);
  if (s.d == 0) fail("max: dimension {} is empty", dim);
  const Shape shape = reduced_shape(x.shape(), dim, keepdim);
  Tensor values = Tensor::empty(shape, x.device());
  Tensor indices = Tensor::empty(shape, x.device(), DType::kI64);
  backend_of(x).max_dim(x.data(), s.outer, s.d, s.inner, values.data(), indices.data_i64());
  // The indices are the caller's too (MaxResult): saved, not merely kept.
  values = record("max", values, {x},
                  [s, saved = SavedTensor(indices)](const Tensor& g, GradSink& sink) {
                    const Tensor index = saved.unpack();
                    sink.accumulate(0, [&](Tensor& dx, float beta) {
                      backend_of(g).index_backward(g.data(), index.data_i64(), s.outer, s.d,
                                                   s.inner, beta, dx.data());
                    });
                  });
  return MaxResult{.values = values, .indices = indices};
}

// ---- heads, losses, regularisation -----------------------------------------------------------

namespace {

Tensor softmax_impl(const char* name, const Tensor& x, std::int64_t dim, bool log) {
  check_f32(name, x, "the input");
  dim = wrap_dim(name, dim, x.dim());
  const Around s = around(x.shape(), dim);
  Tensor out = Tensor::empty_like(x);
  backend_of(x).softmax(x.data(), s.outer, s.d, s.inner, log, out.data());
  return record(name, out, {x}, [s, log, sy = SavedTensor(out)](const Tensor& g, GradSink& sink) {
    const Tensor y = sy.unpack();
    sink.accumulate(0, [&](Tensor& dx, float beta) {
      backend_of(g).softmax_backward(y.data(), g.data(), s.outer, s.d, s.inner, log, beta,
                                     dx.data());
    });
  });
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) {
  return softmax_impl("softmax", x, dim, false);
}
Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  return softmax_impl("log_softmax", x, dim, true);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) {
  check_f32("cross_entropy", logits, "the logits");
  if (logits.dim() != 2) {
    fail("cross_entropy: logits must be [batch, classes], got shape {}", shape_str(logits.shape()));
  }
  if (!targets.defined() || targets.dtype() != DType::kI64) {
    fail("cross_entropy: targets must be an int64 tensor of class indices{}",
         targets.defined() ? fmt::format(", got {}", dtype_name(targets.dtype())) : "");
  }
  check_same_device("cross_entropy", logits, targets);
  const std::int64_t rows = logits.size(0), classes = logits.size(1);
  if (targets.shape() != Shape{rows}) {
    fail("cross_entropy: targets have shape {}, expected [{}] for logits {}",
         shape_str(targets.shape()), rows, shape_str(logits.shape()));
  }
  if (classes == 0) fail("cross_entropy: logits have no classes");
  const float eps = options.label_smoothing;
  if (!(eps >= 0.0f && eps <= 1.0f)) {
    fail("cross_entropy: label_smoothing must be in [0, 1], got {}", eps);
  }
  Backend& be = backend_of(logits);
  const Device device = logits.device();
  Tensor row_loss = Tensor::empty({rows}, device), row_weight = Tensor::empty({rows}, device);
  Tensor lse = Tensor::empty({rows}, device);
  be.cross_entropy_rows(logits.data(), targets.data_i64(), rows, classes, options.ignore_index, eps,
                        row_loss.data(), row_weight.data(), lse.data());
  // The mean over the rows that count, divided on the device: no host synchronization. All
  // rows ignored gives 0 / 0 = NaN, as in PyTorch.
  Tensor total = Tensor::empty({}, device), count = Tensor::empty({}, device);
  be.sum(row_loss.data(), rows, total.data());
  be.sum(row_weight.data(), rows, count.data());
  Tensor out = Tensor::empty({}, device);
  const Broadcast one{.div = 1, .mod = 1};
  be.binary(BinaryOp::kDiv, total.data(), one, count.data(), one, out.data(), 1);
  return record("cross_entropy", out, {logits},
                [sx = SavedTensor(logits), st = SavedTensor(targets), lse, count, rows, classes,
                 eps, ignore = options.ignore_index](const Tensor& g, GradSink& sink) {
                  const Tensor x = sx.unpack(), labels = st.unpack();
                  sink.accumulate(0, [&](Tensor& dx, float beta) {
                    backend_of(g).cross_entropy_backward(x.data(), labels.data_i64(), lse.data(),
                                                         rows, classes, ignore, eps, g.data(),
                                                         count.data(), beta, dx.data());
                  });
                });
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_f32("embedding", weight, "the weight");
  if (weight.dim() != 2) {
    fail("embedding: the weight must be [num_embeddings, embedding_dim], got shape {}",
         shape_str(weight.shape()));
  }
  if (!indices.defined() || indices.dtype() != DType::kI64) {
    fail("embedding: indices must be an int64 tensor{}",
         indices.defined() ? fmt::format(", got {}", dtype_name(indices.dtype())) : "");
  }
  check_same_device("embedding", weight, indices);
  const std::int64_t rows = weight.size(0), dim = weight.size(1), n = indices.numel();
  if (weight.device().is_cpu()) {
    const std::int64_t* index = indices.data_i64();
    for (std::int64_t i = 0; i < n; ++i) {
      if (index[i] < 0 || index[i] >= rows) {
        fail("embedding: index {} (element {} of indices {}) is out of range for {} embeddings",
             index[i], i, shape_str(indices.shape()), rows);
      }
    }
  }
  Shape shape = indices.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, weight.device());
  backend_of(weight).embedding_forward(weight.data(), indices.data_i64(), n, rows, dim, out.data());
  return record("embedding", out, {weight},
                [saved = SavedTensor(indices), n, rows, dim](const Tensor& g, GradSink& sink) {
                  const Tensor index = saved.unpack();
                  sink.accumulate(0, [&](Tensor& dw, float beta) {
                    backend_of(g).embedding_backward(g.data(), index.data_i64(), n, rows, dim, beta,
                                                     dw.data());
                  });
                });
}

Tensor dropout(const Tensor& x, float p, bool training, RandomStream rng) {
  check_f32("dropout", x, "the input");
  if (!(p >= 0.0f && p <= 1.0f)) fail("dropout: probability {} is not in [0, 1]", p);
  if (!training || p == 0.0f) return x;
  Tensor out = Tensor::empty_like(x);
  backend_of(x).dropout(x.data(), x.numel(), p, rng.seed, rng.stream, rng.offset, out.data());
  return record("dropout", out, {x}, [p, rng](const Tensor& g, GradSink& sink) {
    Tensor dx = Tensor::empty_like(g);
    backend_of(g).dropout(g.data(), g.numel(), p, rng.seed, rng.stream, rng.offset, dx.data());
    sink.emit(0, dx);
  });
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  check_f32("layer_norm", x, "the input");
  if (x.dim() < 1) fail("layer_norm: the input must have at least one dimension");
  const std::int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    check_f32("layer_norm", *t, t == &weight ? "the weight" : "the bias");
    check_same_device("layer_norm", x, *t);
    if (t->shape() != Shape{cols}) {
      fail("layer_norm: {} has shape {}, expected [{}] (the input's last dimension)",
           t == &weight ? "the weight" : "the bias", shape_str(t->shape()), cols);
    }
  }
  if (!(eps > 0.0f)) fail("layer_norm: eps must be positive, got {}", eps);
  Backend& be = backend_of(x);
  Tensor y = Tensor::empty_like(x);
  Tensor mean = Tensor::empty({rows}, x.device()), rstd = Tensor::empty({rows}, x.device());
  be.layer_norm(x.data(), weight.defined() ? weight.data() : nullptr,
                bias.defined() ? bias.data() : nullptr, rows, cols, eps, y.data(), mean.data(),
                rstd.data());
  return record("layer_norm", y, {x, weight, bias},
                [sx = SavedTensor(x), sw = save_for_grad_of(x, weight), mean, rstd, rows, cols](
                    const Tensor& g, GradSink& sink) {
                  const Tensor input = sx.unpack(), w = sw.unpack();
                  Backend& bb = backend_of(g);
                  sink.accumulate(0, [&](Tensor& dx, float beta) {
                    bb.layer_norm_backward(input.data(), w.defined() ? w.data() : nullptr,
                                           mean.data(), rstd.data(), g.data(), rows, cols, beta,
                                           dx.data());
                  });
                  sink.accumulate(1, [&](Tensor& dw, float beta) {
                    bb.layer_norm_param_backward(input.data(), mean.data(), rstd.data(), g.data(),
                                                 rows, cols, beta, dw.data(), nullptr);
                  });
                  sink.accumulate(2, [&](Tensor& db, float beta) {
                    bb.layer_norm_param_backward(input.data(), mean.data(), rstd.data(), g.data(),
                                                 rows, cols, beta, nullptr, db.data());
                  });
                });
}

}  // namespace nanoddp
