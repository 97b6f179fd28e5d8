#include "nanoddp/engine/ops.h"

#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/op_checks.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {

namespace {

using op_checks::backend_of;
using op_checks::check_f32;
using op_checks::check_same_device;

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  check_f32(op, a, "the first operand");
  check_f32(op, b, "the second operand");
  check_same_device(op, a, b);
  if (a.shape() != b.shape()) {
    fail("{}: shapes {} and {} differ (nanoddp does not broadcast)", op, shape_str(a.shape()),
         shape_str(b.shape()));
  }
}

void check_matrix(const char* op, const Tensor& t, const char* what) {
  check_f32(op, t, what);
  if (t.dim() != 2) fail("{}: {} must be 2-D, got shape {}", op, what, shape_str(t.shape()));
}

// The activation part of linear and of relu/gelu: y = act(x).
Tensor activation(const char* name, const Tensor& x, Activation act) {
  check_f32(name, x, "the input");
  Tensor y = x.detach().clone();  // the history is the activation, not a copy
  backend_of(x).bias_activation(y.data(), nullptr, 1, x.numel(), act, nullptr);
  return record(name, y, {x}, [saved = SavedTensor(x), act](const Tensor& g, GradSink& sink) {
    const Tensor input = saved.unpack();
    Tensor dx = Tensor::empty_like(g);
    backend_of(g).activation_backward(act, input.data(), g.data(), dx.data(), g.numel());
    sink.emit(0, dx);
  });
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matrix("matmul", a, "the left operand");
  check_matrix("matmul", b, "the right operand");
  check_same_device("matmul", a, b);
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.size(0) != k) {
    fail("matmul: inner dimensions differ: {} x {}", shape_str(a.shape()), shape_str(b.shape()));
  }
  Tensor c = Tensor::empty({m, n}, a.device());
  backend_of(a).gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), b.data(), 0.0f,
                     c.data());
  return record(
      "matmul", c, {a, b},
      [sa = save_for_grad_of(b, a), sb = save_for_grad_of(a, b), m, n, k](const Tensor& g,
                                                                          GradSink& sink) {
        const Tensor lhs = sa.unpack(), rhs = sb.unpack();
        Backend& be = backend_of(g);
        // dA[m,k] = G[m,n] B[k,n]^T ;  dB[k,n] = A[m,k]^T G[m,n]
        sink.accumulate(0, [&](Tensor& da, float beta) {
          be.gemm(Transpose::kNo, Transpose::kYes, m, k, n, 1.0f, g.data(), rhs.data(), beta,
                  da.data());
        });
        sink.accumulate(1, [&](Tensor& db, float beta) {
          be.gemm(Transpose::kYes, Transpose::kNo, k, n, m, 1.0f, lhs.data(), g.data(), beta,
                  db.data());
        });
      });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  // [*, in] as in PyTorch: the leading dimensions are one batch (a sequence model's [B, T, C]),
  // through views, so the gradient flows back through them.
  if (x.defined() && x.dtype() == DType::kF32 && x.dim() != 2 && weight.defined() &&
      weight.dim() == 2) {
    if (x.dim() == 0) fail("linear: the input must have at least one dimension, got a scalar");
    Shape shape(x.shape().begin(), x.shape().end() - 1);  // the batch dimensions
    const std::int64_t rows = shape_numel(shape);         // 1 for a single vector [in]
    shape.push_back(weight.size(0));
    return linear(x.reshape({rows, x.size(-1)}), weight, bias, act).reshape(shape);
  }
  check_matrix("linear", x, "the input");
  check_matrix("linear", weight, "the weight");
  check_same_device("linear", x, weight);
  const std::int64_t batch = x.size(0), in = x.size(1), out = weight.size(0);
  if (weight.size(1) != in) {
    fail("linear: the input has {} features but the weight {} expects {}", in,
         shape_str(weight.shape()), weight.size(1));
  }
  if (bias.defined()) {
    check_f32("linear", bias, "the bias");
    check_same_device("linear", x, bias);
    if (bias.shape() != Shape{out}) {
      fail("linear: bias has shape {}, expected [{}]", shape_str(bias.shape()), out);
    }
  }
  Backend& be = backend_of(x);
  Tensor y = Tensor::empty({batch, out}, x.device());
  be.gemm(Transpose::kNo, Transpose::kYes, batch, out, in, 1.0f, x.data(), weight.data(), 0.0f,
          y.data());
  // The pre-activation z = x W^T + b is kept only when an activation needs it for backward.
  Tensor z;
  if (act != Activation::kNone) z = Tensor::empty({batch, out}, x.device());
  be.bias_activation(y.data(), bias.defined() ? bias.data() : nullptr, batch, out, act,
                     z.defined() ? z.data() : nullptr);

  return record(
      "linear", y, {x, weight, bias},
      [sx = save_for_grad_of(weight, x), sw = save_for_grad_of(x, weight), z, act, batch, in, out](
          const Tensor& g, GradSink& sink) {
        // z is the op's own (nobody else can write it); x and the weight are the caller's.
        const Tensor input = sx.unpack(), w = sw.unpack();
        Backend& bb = backend_of(g);
        // Through the activation first: dz = g * act'(z).
        Tensor dz = g;
        if (act != Activation::kNone) {
          dz = Tensor::empty_like(g);
          bb.activation_backward(act, z.data(), g.data(), dz.data(), g.numel());
        }
        // dX[batch,in] = dZ[batch,out] W[out,in]
        sink.accumulate(0, [&](Tensor& dx, float beta) {
          bb.gemm(Transpose::kNo, Transpose::kNo, batch, in, out, 1.0f, dz.data(), w.data(),
                  beta, dx.data());
        });
        // dW[out,in] = dZ^T X, written straight into the weight's gradient buffer.
        sink.accumulate(1, [&](Tensor& dw, float beta) {
          bb.gemm(Transpose::kYes, Transpose::kNo, out, in, batch, 1.0f, dz.data(), input.data(),
                  beta, dw.data());
        });
        // db[out] = column sums of dZ.
        sink.accumulate(2, [&](Tensor& db, float beta) {
          bb.column_sum(dz.data(), batch, out, beta, db.data());
        });
      });
}

// add and sub broadcast: they live with the other binary ops in functional.cpp.

Tensor mul(const Tensor& a, float scalar) {
  check_f32("mul", a, "the operand");
  Tensor out = Tensor::empty_like(a);
  backend_of(a).scale_copy(a.data(), scalar, out.data(), out.numel());
  return record("mul", out, {a}, [scalar](const Tensor& g, GradSink& sink) {
    Tensor dx = Tensor::empty_like(g);
    backend_of(g).scale_copy(g.data(), scalar, dx.data(), g.numel());
    sink.emit(0, dx);
  });
}

Tensor relu(const Tensor& x) { return activation("relu", x, Activation::kRelu); }
Tensor gelu(const Tensor& x) { return activation("gelu", x, Activation::kGelu); }

namespace {

// sum and mean: out = scale * sum(x); d out / d x_i = scale.
Tensor scaled_sum(const char* name, const Tensor& x, float scale) {
  check_f32(name, x, "the input");
  Tensor out = Tensor::empty({}, x.device());
  Backend& be = backend_of(x);
  be.sum(x.data(), x.numel(), out.data());
  if (scale != 1.0f) be.scale(out.data(), 1, scale);
  return record(name, out, {x}, [shape = x.shape(), scale](const Tensor& g, GradSink& sink) {
    sink.accumulate(0, [&](Tensor& dx, float beta) {
      backend_of(g).broadcast_scalar(g.data(), scale, beta, dx.data(), shape_numel(shape));
    });
  });
}

}  // namespace

Tensor sum(const Tensor& x) { return scaled_sum("sum", x, 1.0f); }

Tensor mean(const Tensor& x) {
  // The mean of nothing is 0 / 0 = NaN, as in PyTorch (scale is +inf, the sum 0).
  return scaled_sum("mean", x, 1.0f / static_cast<float>(x.defined() ? x.numel() : 1));
}

Tensor mse_loss(const Tensor& pred, const Tensor& target) {
  check_same_shape("mse_loss", pred, target);
  // An empty prediction gives NaN, as in PyTorch (the kernels divide 0 by 0).
  Tensor out = Tensor::empty({}, pred.device());
  backend_of(pred).mse_forward(pred.data(), target.data(), pred.numel(), out.data());
  return record("mse_loss", out, {pred, target},
                [sp = SavedTensor(pred), st = SavedTensor(target)](const Tensor& g,
                                                                   GradSink& sink) {
                  const Tensor p = sp.unpack(), t = st.unpack();
                  sink.accumulate(0, [&](Tensor& dp, float beta) {
                    backend_of(g).mse_backward(p.data(), t.data(), p.numel(), g.data(), beta,
                                               dp.data());
                  });
                  if (sink.needs_grad(1)) {
                    // d/dt = -d/dp: computed as -(dp) into a fresh tensor.
                    Tensor dt = Tensor::empty_like(t);
                    backend_of(g).mse_backward(p.data(), t.data(), p.numel(), g.data(), 0.0f,
                                               dt.data());
                    backend_of(g).scale(dt.data(), dt.numel(), -1.0f);
                    sink.emit(1, dt);
                  }
                });
}

}  // namespace nanoddp
