#pragma once
// ZeRO's all-gather overlap (DdpOptions::zero_overlap_gather): the parameter all-gathers that
// Zero::step() launched run while the next forward computes, and each bucket's is waited for
// just before the first module that reads it. PyTorch's FSDP does the same in its forward
// pre-hooks (forward_prefetch), DeepSpeed's ZeRO-3 with its parameter prefetch.
//
// Which module waits for which bucket is learned, not assumed: a module may read parameters it
// does not own (ResidualBlock runs its fc1's GEMM itself), and a user's module may call a
// child's forward() directly, past the child's hooks. So the first forward under DDP, which
// runs with every parameter in place (nothing is in flight before the first step), records with
// a hook before and after every module which module was running when each parameter was first
// read: the innermost one entered through operator(). Autograd's node sequence numbers date the
// reads (first_reads), next_node_sequence_nr() the hooks. From then on module M's pre-hook waits
// for the buckets first read inside M; a bucket the first forward did not read is waited for
// before the forward starts. The gathers are launched in the order of those first reads.
//
// Checked every forward: each parameter's first read must come after its bucket was waited for.
// A forward that reads in another order (a branch taken only now) fails, naming the parameter
// and the module, rather than train on a half-gathered parameter. Reads autograd does not
// record are not seen: a forward under NoGrad waits for everything first; raw data pointers
// read in a forward are the user's to avoid (or leave the overlap off). Outside DDP's forward
// (evaluation, a checkpoint) the first module entered, or Zero::wait_for_parameters(), waits
// for every bucket.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/comm/zero.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::comm {

class ZeroOverlap {
 public:
  ZeroOverlap(nn::Module& root, const nn::FlatParameters& params, Zero& zero);
  ~ZeroOverlap();  // removes its hooks
  ZeroOverlap(const ZeroOverlap&) = delete;
  ZeroOverlap& operator=(const ZeroOverlap&) = delete;

  // Around DDP's call of the model. abort_forward: the model threw; everything is waited for.
  void begin_forward();
  void end_forward(std::span<const Tensor> outputs);
  void abort_forward();

  // Whether the first forward has been learned (before it, step() waits for its gathers).
  bool learned() const { return learned_; }
  // One line per bucket, in the order they are waited for (and launched): which module waits
  // for it.
  std::string describe() const;

 private:
  static constexpr int kNone = -1;  // no module entered: the whole model
  void enter(int module);
  void leave(int module);
  void release(std::size_t bucket);
  int active_at(std::uint64_t sequence_nr) const;
  const std::string& module_name(int module) const;

  const nn::FlatParameters& params_;
  Zero& zero_;
  std::vector<std::pair<nn::Module*, std::string>> modules_;  // every module once, with its path
  std::vector<std::uint64_t> hook_ids_;                       // two per module
  bool learned_ = false;
  bool in_forward_ = false;
  std::vector<int> stack_;                              // modules entered, innermost last
  std::vector<std::pair<std::uint64_t, int>> entries_;  // (sequence number, module active from)
  std::vector<std::vector<std::size_t>> waits_;         // per module: the buckets it waits for
  std::vector<std::size_t> first_waits_;                // before the forward
  std::vector<std::uint64_t> released_at_;              // per bucket, this forward
  std::vector<std::pair<std::size_t, int>> plan_;       // (bucket, module) in waiting order
};

}  // namespace nanoddp::comm
