// The checks every op makes of its operands, shared by ops.cpp and functional.cpp (internal:
// not installed).
#pragma once

#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::op_checks {

inline Backend& backend_of(const Tensor& t) {
  return backend_for(t.device());
}

// Every op checks each float input here before it reads it, and says it is about to: an access
// observer may still wait for the memory (ZeRO's all-gather overlap, comm/zero_overlap.h).
inline void check_f32(const char* op, const Tensor& t, const char* what) {
  if (!t.defined()) fail("{}: {} is an undefined tensor", op, what);
  if (t.dtype() != DType::kF32) {
    fail("{}: {} is {}, but ops compute in float32", op, what, dtype_name(t.dtype()));
  }
  notify_tensor_access(t, /*before=*/true);
}

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device()) {
    fail("{}: operands are on different devices ({} and {}); move one with .to()", op,
         a.device().str(), b.device().str());
  }
}

}  // namespace nanoddp::op_checks
