#pragma once
// nanoddp-bench-allreduce's flag values and closed forms: what a size, a reduction and a
// collective are on the command line, what each rank puts in (element i of rank r is
// (r + 1) * (i % 4 + 1)), and what every collective must give back (-c 1).

#include <cstdint>
#include <string>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/tensor.h"

namespace nanoddp::bench_allreduce {

using comm::ReduceOp;

// nccl-tests style sizes: 8, 1K, 16M, 1G, 1T (powers of 1024, decimal, at most 1T).
std::int64_t parse_bytes(const std::string& text);
// sum, avg, max, min (a collective's name is refused, pointing at --collective).
ReduceOp parse_op(const std::string& op);

enum class Collective { kAllreduce, kReduceScatter, kAllgather };
Collective parse_collective(const std::string& name);

float fill_value(int rank, std::int64_t i);
// The all-reduce of fill_value over `size` ranks at element i.
float expected_value(ReduceOp op, int size, std::int64_t i);
// Fills the first `count` elements of the host buffer and copies them where the op runs.
void fill_for_check(Tensor& host, Tensor& buffer, int rank, std::int64_t count);
// Elements of an all-reduce's result that miss their closed form.
std::int64_t count_wrong(const Tensor& result_host, ReduceOp op, int size, std::int64_t count);
// Element i of a float32 or bfloat16 host tensor, as float.
float get_value(const Tensor& host, std::int64_t i);
void set_value(Tensor& host, std::int64_t i, float v);
// What a reduce_scatter (element j of this rank's output) or an allgather (element j of the
// output) must hold, from fill_value's inputs.
float scatter_gather_expected(Collective c, ReduceOp op, int rank, int size, std::int64_t block,
                              std::int64_t j);

}  // namespace nanoddp::bench_allreduce
