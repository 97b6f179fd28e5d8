#include "values.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/cli.h"
#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::bench_allreduce {

using kernels::bf16_to_float;
using kernels::float_to_bf16;

std::int64_t parse_bytes(const std::string& text) {
  // nccl-tests style: 8, 1K, 16M, 1G, 1T (powers of 1024), with a decimal fraction where it
  // makes whole bytes (1.5K). Plain decimal only: "-8", "+8", "08", "0x10", "1e3" and " 16" are
  // refused (an outside tester's "+8", "08" and "64E0" passed), as is a fraction of a byte
  // ("4.9" measured 4 bytes).
  const std::size_t number_end = text.find_first_of("KkMmGgTt");
  const std::string number = text.substr(0, number_end);
  const std::size_t point = number.find('.');
  const std::string whole = number.substr(0, point);
  const std::string fraction = point == std::string::npos ? "1" : number.substr(point + 1);
  if (whole.empty() || whole.find_first_not_of("0123456789") != std::string::npos ||
      (whole.size() > 1 && whole[0] == '0') || fraction.empty() ||
      fraction.find_first_not_of("0123456789") != std::string::npos ||
      (number_end != std::string::npos && number_end + 1 != text.size())) {
    fail("'{}' is not a size (e.g. 8, 1K, 1.5K, 16M, 1G, 1T)", text);
  }
  const double value = std::strtod(number.c_str(), nullptr);
  const std::string suffix = number_end == std::string::npos ? "" : text.substr(number_end);
  double scale = 1;
  if (suffix == "K" || suffix == "k")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "m")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g")
    scale = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "t")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!suffix.empty())
    fail("'{}' is not a size (e.g. 8, 1K, 16M, 1G, 1T)", text);
  // 1 TiB: past any buffer this benchmark can allocate, and within int64 whatever was typed.
  if (value * scale > 1099511627776.0) {
    fail("'{}' is more than 1T (1099511627776 bytes)", text);
  }
  const double bytes = value * scale;
  if (bytes != std::floor(bytes)) fail("'{}' is not a whole number of bytes", text);
  return static_cast<std::int64_t>(bytes);
}

ReduceOp parse_op(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "avg") return ReduceOp::kAvg;
  if (op == "max") return ReduceOp::kMax;
  if (op == "min") return ReduceOp::kMin;
  if (op == "allreduce" || op == "reduce_scatter" || op == "allgather") {
    fail(
        "--op {}: --op is the reduction (sum, avg, max or min); the collective is "
        "--collective {}",
        op, op);
  }
  fail("--op {}: expected sum, avg, max or min", op);
}

Collective parse_collective(const std::string& name) {
  if (name == "allreduce") return Collective::kAllreduce;
  if (name == "reduce_scatter") return Collective::kReduceScatter;
  if (name == "allgather") return Collective::kAllgather;
  fail("--collective {}: expected allreduce, reduce_scatter or allgather", name);
}

float fill_value(int rank, std::int64_t i) {
  return static_cast<float>((rank + 1) * (i % 4 + 1));
}

float expected_value(ReduceOp op, int size, std::int64_t i) {
  const float f = static_cast<float>(i % 4 + 1);
  const float n = static_cast<float>(size);
  switch (op) {
    case ReduceOp::kSum:
      return f * n * (n + 1) / 2;
    case ReduceOp::kAvg:
      return f * (n + 1) / 2;
    case ReduceOp::kMax:
      return f * n;
    case ReduceOp::kMin:
      return f;
  }
  return 0;
}

// Fills the first `count` elements of the host buffer and copies them where the op runs.
void fill_for_check(Tensor& host, Tensor& buffer, int rank, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    if (host.dtype() == DType::kF32) {
      host.data()[i] = fill_value(rank, i);
    } else {
      static_cast<std::uint16_t*>(host.raw_data())[i] = float_to_bf16(fill_value(rank, i));
    }
  }
  if (!buffer.is_same(host)) buffer.copy_from(host);
}

std::int64_t count_wrong(const Tensor& result_host, ReduceOp op, int size, std::int64_t count) {
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const float expected = expected_value(op, size, i);
    const float actual =
        result_host.dtype() == DType::kF32
            ? result_host.data()[i]
            : bf16_to_float(static_cast<const std::uint16_t*>(result_host.raw_data())[i]);
    const float tolerance = result_host.dtype() == DType::kF32 ? 1e-5f : 1e-2f;
    if (!(std::fabs(actual - expected) <= tolerance * std::max(1.0f, std::fabs(expected)))) {
      ++wrong;
    }
  }
  return wrong;
}

float get_value(const Tensor& host, std::int64_t i) {
  return host.dtype() == DType::kF32
             ? host.data()[i]
             : bf16_to_float(static_cast<const std::uint16_t*>(host.raw_data())[i]);
}
void set_value(Tensor& host, std::int64_t i, float v) {
  if (host.dtype() == DType::kF32) {
    host.data()[i] = v;
  } else {
    static_cast<std::uint16_t*>(host.raw_data())[i] = float_to_bf16(v);
  }
}

// What a reduce_scatter (element k of this rank's output) or an allgather (element j of the
// output) must hold, from fill_value's inputs.
float scatter_gather_expected(Collective c, ReduceOp op, int rank, int size, std::int64_t block,
                              std::int64_t j) {
  if (c == Collective::kReduceScatter) return expected_value(op, size, rank * block + j);
  return fill_value(static_cast<int>(j / block), j % block);
}

}  // namespace nanoddp::bench_allreduce
