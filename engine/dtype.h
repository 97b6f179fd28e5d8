#pragma once
// Element types. Compute is float32; bf16 exists for storage and communication (the bf16
// gradient-compression hook reduces in bf16 and accumulates back in float32); int64 holds
// indices (class targets of cross_entropy, the arg-max of max) and never a gradient.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nanoddp {

enum class DType : std::uint8_t { kF32, kBF16, kI64 };

constexpr std::size_t dtype_size(DType dtype) {
  return dtype == DType::kF32 ? 4 : dtype == DType::kBF16 ? 2 : 8;
}
constexpr std::string_view dtype_name(DType dtype) {
  return dtype == DType::kF32 ? "float32" : dtype == DType::kBF16 ? "bfloat16" : "int64";
}

}  // namespace nanoddp
