#include "nanoddp/comm/gloo_helpers.h"

#include <mutex>
#include <vector>

#include "nanoddp/comm/reduce_ops.h"
#include "nanoddp/kernels/bf16.h"

namespace nanoddp::comm {
namespace {

using ReduceFunc = gloo::AllreduceOptions::Func;

using detail::Max;
using detail::Min;
using detail::Sum;

template <typename Op>
void reduce_f32(void* c, const void* a, const void* b, std::size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = Op{}(x[i], y[i]);
}

// bf16 values are widened to float32, reduced, and rounded back (kernels/bf16.h).
using kernels::bf16_to_float;
using kernels::float_to_bf16;

template <typename Op>
void reduce_bf16(void* c, const void* a, const void* b, std::size_t n) {
  std::uint16_t* out = static_cast<std::uint16_t*>(c);
  const std::uint16_t* x = static_cast<const std::uint16_t*>(a);
  const std::uint16_t* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = float_to_bf16(Op{}(bf16_to_float(x[i]), bf16_to_float(y[i])));
  }
}

}  // namespace

gloo::AllreduceOptions::Func gloo_reduce_function(ReduceOp op, DType dtype) {
  const bool f32 = dtype == DType::kF32;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // summed on the wire, divided once afterwards (divide_by)
      return f32 ? ReduceFunc(&reduce_f32<Sum>) : ReduceFunc(&reduce_bf16<Sum>);
    case ReduceOp::kMax:
      return f32 ? ReduceFunc(&reduce_f32<Max>) : ReduceFunc(&reduce_bf16<Max>);
    case ReduceOp::kMin:
      return f32 ? ReduceFunc(&reduce_f32<Min>) : ReduceFunc(&reduce_bf16<Min>);
  }
  return {};
}

void divide_by(void* data, DType dtype, std::size_t n, int size) {
  const float divisor = static_cast<float>(size);
  if (dtype == DType::kF32) {
    float* p = static_cast<float*>(data);
    for (std::size_t i = 0; i < n; ++i) p[i] /= divisor;
  } else {
    std::uint16_t* p = static_cast<std::uint16_t*>(data);
    for (std::size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / divisor);
  }
}

std::string strip_gloo_location(std::string message) {
  // GLOO_ERROR_MSG prefixes "[/build/gloo/transport/tcp/pair.cc:598] ".
  if (!message.empty() && message[0] == '[') {
    const std::size_t end = message.find("] ");
    if (end != std::string::npos && message.find(':') < end) message.erase(0, end + 2);
  }
  return message;
}

// The options of failed Gloo ops, never destroyed (see Impl::run_gloo). Reachable from a static
// pointer, so LeakSanitizer does not count them as leaks: they are kept on purpose.
void keep_failed_gloo_op(std::shared_ptr<void> op) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(op));
}

}  // namespace nanoddp::comm
