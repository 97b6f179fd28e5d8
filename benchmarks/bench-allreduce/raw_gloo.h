#pragma once
// --raw and --vs-raw: gloo::allreduce called straight, on the calling thread — the same calls
// the process group's worker makes, without the group (no Work, no worker thread).

#include <gloo/allreduce.h>
#include <gloo/barrier.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/bf16.h"

namespace nanoddp::bench_allreduce {

using comm::ReduceOp;
using kernels::bf16_to_float;
using kernels::float_to_bf16;

template <typename T, typename F>
void reduce_loop(void* c, const void* a, const void* b, std::size_t n, F f) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = f(x[i], y[i]);
}

inline gloo::AllreduceOptions::Func raw_reduce(ReduceOp op, DType dtype) {
  const auto pick = [](ReduceOp o, float a, float b) {
    return o == ReduceOp::kMax ? std::max(a, b) : o == ReduceOp::kMin ? std::min(a, b) : a + b;
  };
  if (dtype == DType::kF32) {
    return [op, pick](void* c, const void* a, const void* b, std::size_t n) {
      reduce_loop<float>(c, a, b, n, [&](float x, float y) { return pick(op, x, y); });
    };
  }
  return [op, pick](void* c, const void* a, const void* b, std::size_t n) {
    reduce_loop<std::uint16_t>(c, a, b, n, [&](std::uint16_t x, std::uint16_t y) {
      return float_to_bf16(pick(op, bf16_to_float(x), bf16_to_float(y)));
    });
  };
}

struct RawGloo {
  comm::GlooConnection connection;
  std::chrono::milliseconds timeout;
  std::uint32_t tag = 0;

  // In place, or from `input` (same size and type) into `t`.
  void allreduce(Tensor& t, ReduceOp op, const Tensor* input = nullptr) {
    const auto n = static_cast<std::size_t>(t.numel());
    if (n == 0) return;
    gloo::AllreduceOptions opts(connection.context);
    if (t.dtype() == DType::kF32) {
      if (input != nullptr) {
        opts.setInput(static_cast<float*>(const_cast<void*>(input->raw_data())), n);
      }
      opts.setOutput(static_cast<float*>(t.raw_data()), n);
    } else {
      if (input != nullptr) {
        opts.setInput(static_cast<std::uint16_t*>(const_cast<void*>(input->raw_data())), n);
      }
      opts.setOutput(static_cast<std::uint16_t*>(t.raw_data()), n);
    }
    opts.setReduceFunction(raw_reduce(op, t.dtype()));
    opts.setTag(++tag);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
    if (op == ReduceOp::kAvg) {
      const float size = static_cast<float>(connection.context->size);
      if (t.dtype() == DType::kF32) {
        for (std::size_t i = 0; i < n; ++i) t.data()[i] /= size;
      } else {
        auto* p = static_cast<std::uint16_t*>(t.raw_data());
        for (std::size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / size);
      }
    }
  }
  void barrier() {
    gloo::BarrierOptions opts(connection.context);
    opts.setTag(++tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  }
};

}  // namespace nanoddp::bench_allreduce
