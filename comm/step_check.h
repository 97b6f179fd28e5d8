#pragma once
// The per-step check that every rank is at the same step and issued the same collectives.
//
// Why. Collectives pair up by position: if one rank catches an exception and skips a step (or
// issues an op the others do not), the next all-reduces pair one rank's step k with another's
// step k+1 — same sizes, so no error, only gradients averaged across different steps — until
// a timeout far later names an op that is not the cause. PyTorch's TORCH_DISTRIBUTED_DEBUG=
// DETAIL compares a fingerprint of every collective across ranks; this does it once per step,
// for the price of one tiny all-reduce.
//
// How. At the end of each synchronized backward pass the Reducer issues, right after the last
// bucket, one all-reduce (max) of this rank's [pass, forward calls, ops issued, op hash,
// parameters without a gradient] split
// into 16-bit pieces (exact in float32), each followed by its negation: the maximum of v and
// of -v is every rank's max and -min, so all ranks hold the same values iff max == min
// everywhere. The ops and hash are the group's running fingerprint (process_group.h) taken
// before the check itself. Every rank sees the same reduced result, so on a mismatch all of
// them go on, together, to an allgather of each rank's numbers and last few ops, and all throw
// the same CommError naming the step, the first difference and each side.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/tensor.h"

namespace nanoddp::comm {

class StepCheck {
 public:
  // `slot_names`: the parameters' names by slot, to name the ones a rank gave no gradient.
  StepCheck(std::shared_ptr<ProcessGroup> group, Device device,
            std::vector<std::string> slot_names = {});

  // Issues the check for this rank's synchronized backward pass `pass` (1, 2, ...) after
  // `forward_calls` calls of DDP's forward. `missing`: the slots that got no gradient in this
  // pass on this rank (the Reducer reduced their buckets with zeros so that no rank waits); a
  // count that differs across ranks fails every rank in verify(), naming those parameters.
  void launch(std::uint64_t pass, std::uint64_t forward_calls,
              std::span<const std::size_t> missing = {});
  // Waits for it; throws CommError on every rank if the ranks differ.
  void verify();
  // Waits for it, ignoring its result (after another failure).
  void wait_quietly();

 private:
  std::shared_ptr<ProcessGroup> group_;
  Device device_;
  Tensor values_;  // [pieces..., -pieces...]
  std::shared_ptr<Work> work_;
  std::uint64_t pass_ = 0;
  std::uint64_t forward_calls_ = 0;
  std::vector<std::string> slot_names_;
  std::vector<std::size_t> missing_;
  OpFingerprint fingerprint_;
  std::vector<OpRecord> recent_;
};

}  // namespace nanoddp::comm
