#pragma once
// A compute profile read from a nanoddp trace (`nanoddp-train --trace FILE`, Chrome trace JSON
// written by engine/trace.cpp).
//
// What the trace holds, per rank (pid), per step: on the compute track (tid 0) a "forward" span,
// one "backward <op>" span per autograd node ("backward mse_loss", "backward linear",
// "backward relu", ...), "wait for all-reduce" (the Reducer's finalize) and "optimizer step";
// on the data track (tid 3) "data"; on the communication track (tid 1) "all-reduce bucket b"
// spans with an `elements` argument; on the markers track (tid 2) "bucket b ready" and, in
// traces since the per-parameter markers, a "grad <parameter name>" instant with a `numel`
// argument when each parameter's gradient became final (autograd emits it just before the
// post-accumulate-grad hooks: when the Reducer counts it ready).
//
// With "grad" markers the parameters (names, sizes) and each one's ready time come from them:
// any model, no shape flags needed. The layout order (FlatParameters': reverse registration
// order; DDP's buckets are cut over it) is not in the trace: it is taken to be the order of the
// backward nodes, each node's markers reversed (see marker_grads in the .cpp) -- exact for
// nanoddp's MLP; checked against the shape when given (which then also fixes the order) and
// against a DDP trace's buckets.
//
// Without markers (older traces) the model's shape comes from the same --in/--out/--hidden/
// --layers flags the traced run used (nanoddp-train's defaults when not given), and the k-th
// "backward linear" span of a step is taken to produce the gradients of the k-th Linear from
// the end (its bias and weight), ready when the span ends.
//
// Either way every other node's time goes to the next gradient. Backward ends with its last
// node (or last marker) or, in a DDP trace, where "wait for all-reduce" starts (the Reducer's
// finalize): the time between is the backward tail.
//
// Steps are cut at each "forward" span; a step runs from its "data" span to the end of its
// "optimizer step", without the data time (as nanoddp-train's step_ms). The first `skip_steps`
// are left out (the first step touches fresh memory); each quantity is the median over the
// rest.
//
// With `peers`, a DDP trace of several ranks also gives, per gradient, when the slowest rank had
// produced it (ComputeProfile::peers_ready_ms): in each step, the latest over all ranks (this
// one included) of the same gradient's ready time, minus this rank's backward start, then the
// median over the steps. That needs one clock for all ranks (ranks on one host: the trace's
// times are steady_clock); it is checked on the collectives, which join every rank (see
// check_one_clock in the .cpp).
//
// Refused besides (SimError naming the event): a "ts" that is no time (below 0, from 2^53 us),
// and spans that overlap on a rank's compute thread where nanoddp-train runs one at a time
// (forward, each backward node, the optimizer step).

#include <optional>
#include <string>

#include "benchmarks/sim/profile.h"

namespace nanoddp::sim {

struct TraceProfileOptions {
  // The traced MLP's shape: optional with "grad" markers (checked against them when given);
  // without markers nanoddp-train's defaults when not given.
  std::optional<MlpShape> shape;
  int rank = 0;
  int skip_steps = 1;
  bool peers = false;
};

// Throws SimError for an unreadable file, JSON that is not such a trace, a rank not in it, too
// few steps, or a shape (or shape flags) that does not match the trace.
ComputeProfile profile_from_trace(const std::string& path, const TraceProfileOptions& options);
// The same from the file's text; `name` is used in messages.
ComputeProfile profile_from_trace_text(const std::string& text, const std::string& name,
                                       const TraceProfileOptions& options);

}  // namespace nanoddp::sim
