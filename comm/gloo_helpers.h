#pragma once
// What the group's flat ring and the hierarchical all-reduce's ring of host leaders share: the
// element-wise reductions handed to gloo::allreduce, the one division of an average, and the
// handling of a failed Gloo op.

#include <gloo/allreduce.h>

#include <cstddef>
#include <memory>
#include <string>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/dtype.h"

namespace nanoddp::comm {

// Gloo calls it on segments of the buffer as they arrive from the ring neighbour:
// c[i] = a[i] (op) b[i] for n elements (c may alias a). Average sums; divide_by divides after.
gloo::AllreduceOptions::Func gloo_reduce_function(ReduceOp op, DType dtype);

// Average = sum, then one division by the world size: exactly one rounding for float32, and
// never divided twice (the Reducer relies on this).
void divide_by(void* data, DType dtype, std::size_t n, int size);

// The options of failed Gloo ops, never destroyed (see GlooProcessGroup::Impl::run_gloo): Gloo's
// transport thread may still complete a send on their buffers.
void keep_failed_gloo_op(std::shared_ptr<void> op);

// Gloo's message without the "[/build/gloo/transport/tcp/pair.cc:598] " prefix.
std::string strip_gloo_location(std::string message);

}  // namespace nanoddp::comm
