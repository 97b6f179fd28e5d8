#pragma once
// ZeRO's all-gather overlap (DdpOptions::zero_overlap_gather): the parameter all-gathers that
// Zero::step() launched run while the next forward computes, and each bucket's is waited for
// just before the first module that reads it. PyTorch's FSDP does the same in its forward
// pre-hooks (forward_prefetch), DeepSpeed's ZeRO-3 with its parameter prefetch.
//
// Which module waits for which bucket is learned, not assumed: a module may read parameters it
// does not own (ResidualBlock runs its fc1's GEMM itself), and a user's module may call a
// child's forward() directly, past the child's hooks. So the first forward under DDP, which
// runs with every parameter in place (nothing is in flight before the first step), watches the
// reads (autograd's LeafReadObserver: every op that reads a parameter says so) and, with a hook
// before and after every module, which module was running at each parameter's first read: the
// innermost one entered through operator(), or none (the model's own forward called past its
// hooks). From then on a module's pre-hook waits for the buckets first read inside it, and the
// buckets first read by none, or by nothing at all, are waited for before the forward starts.
// The gathers are launched in the order they will be waited for, which the ranks agree on at
// the first step (rank 0's plan: a rank that learned another order still waits correctly, only
// later; the ranks must agree on the switch itself, which DDP checks).
//
// Checked at every read, not only in the learned order: a parameter read while its bucket is
// still owed fails, naming the parameter and the module, instead of computing with a
// half-gathered parameter (the read has happened, so the step cannot go on). In DDP's forward
// that is a read the first forward did not make in that module (a branch taken only now); after
// it, until every bucket is waited for, any read (an evaluation through model.forward(x)
// instead of model(x), which runs no hook of the model itself). Raw reads (data pointers,
// to_vector) are not seen; call Zero::wait_for_parameters() before them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nanoddp/comm/zero.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::comm {

class ZeroOverlap final : public LeafReadObserver {
 public:
  // Hooks every module of `root` and watches the reads of this thread (the one that trains).
  ZeroOverlap(nn::Module& root, const nn::FlatParameters& params, Zero& zero);
  ~ZeroOverlap() override;  // removes its hooks and its watch
  ZeroOverlap(const ZeroOverlap&) = delete;
  ZeroOverlap& operator=(const ZeroOverlap&) = delete;

  // Around DDP's call of the model. abort_forward: the model threw; everything is waited for.
  void begin_forward();
  void end_forward();
  void abort_forward();

  // Whether the first forward has been learned (before it, step() waits for its gathers).
  bool learned() const { return learned_; }
  // One line per bucket, in the order they are waited for: which module waits for it.
  std::string describe() const;

  void leaf_read(const TensorImpl* leaf) override;

 private:
  static constexpr int kNone = -1;  // no module entered: the model's own forward
  void enter(int module);
  void leave(int module);
  void release(std::size_t bucket);
  const std::string& module_name(int module) const;

  const nn::FlatParameters& params_;
  Zero& zero_;
  std::unordered_map<const TensorImpl*, std::size_t> slot_of_;  // parameter -> its slot
  std::vector<std::pair<nn::Module*, std::string>> modules_;  // every module once, with its path
  std::vector<std::uint64_t> hook_ids_;                       // two per module
  bool learned_ = false;
  bool in_forward_ = false;
  std::vector<int> stack_;                         // modules entered, innermost last
  std::vector<int> entered_;                       // the learning forward: modules, first entry
  std::vector<char> assigned_;                     // the learning forward: per bucket
  std::vector<std::vector<std::size_t>> waits_;    // per module: the buckets it waits for
  std::vector<std::size_t> first_waits_;           // before the forward
  std::vector<char> released_;                     // per bucket, this forward
  std::vector<std::pair<std::size_t, int>> plan_;  // (bucket, module) in waiting order
};

}  // namespace nanoddp::comm
