#pragma once
// Element types. Compute is float32; bf16 exists for storage and communication (the bf16
// gradient-compression hook reduces in bf16 and accumulates back in float32).

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nanoddp {

enum class DType : std::uint8_t { kF32, kBF16 };

constexpr std::size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType dtype) {
  return dtype == DType::kF32 ? "float32" : "bfloat16";
}

}  // namespace nanoddp
