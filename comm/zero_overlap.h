#pragma once
// ZeRO's all-gather overlap (DdpOptions::zero_overlap_gather): the parameter all-gathers that
// Zero::step() launched run while the next forward computes, and each bucket's is waited for
// just before the first module that reads it. PyTorch's FSDP does the same in its forward
// pre-hooks (forward_prefetch), DeepSpeed's ZeRO-3 with its parameter prefetch.
//
// Which module waits for which bucket is learned, not assumed: a module may read parameters it
// does not own (ResidualBlock runs its fc1's GEMM itself), and a user's module may call a
// child's forward() directly, past the child's hooks. So the first forward under DDP, which
// runs with every parameter in place (nothing is in flight before the first step), watches
// every use of the flat parameter buffer (autograd's TensorAccessObserver: every op tells it of
// its inputs before reading them, every host read or copy of what it is about to touch) and,
// with a hook before and
// after every module, which module was running at each bucket's first use: the innermost one
// entered through operator() on the thread that runs DDP's forward, or none (the model's forward
// called past its hooks, another thread). From then on a module's pre-hook waits for the buckets
// first used inside it, and those first used by none, or not at all, are waited for before the
// forward starts. The gathers are launched in the order they will be waited for, which the ranks
// agree on at the first step (rank 0's plan: a rank that learned another order still waits
// correctly, only later; the ranks must agree on the switch itself, which DDP checks).
//
// Checked at every use, not only in the learned order, on any thread. Ops announce each input
// before they read it (their input checks), host reads and copies (to_vector, item, clone,
// copy_from, ...) and Optimizer::step() before they touch the memory: a use of a bucket still in
// flight waits for it first, correct if later than planned (a branch taken only now, a tower on
// another thread, an evaluation through model.forward(x) right after step()). A use told only
// after it happened (an op outside the library that records without announcing its reads) of a
// bucket still in flight fails, naming the parameter and the module. Raw pointers (data(),
// raw_data()) are not seen: call Zero::wait_for_parameters() before them.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nanoddp/comm/zero.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::comm {

class ZeroOverlap final : public TensorAccessObserver {
 public:
  // Hooks every module of `root` and watches every use of `params`' flat buffer.
  ZeroOverlap(nn::Module& root, const nn::FlatParameters& params, Zero& zero);
  ~ZeroOverlap() override;  // removes its hooks and its watch
  ZeroOverlap(const ZeroOverlap&) = delete;
  ZeroOverlap& operator=(const ZeroOverlap&) = delete;

  // Around DDP's call of the model. abort_forward: the model threw; everything is waited for.
  void begin_forward();
  void end_forward();
  void abort_forward();

  // One line per bucket, in the order they are waited for: which module waits for it.
  std::string describe() const;

  void accessed(const TensorImpl& t, bool before) override;

 private:
  static constexpr int kNone = -1;  // no module entered: the model's own forward
  void enter(int module);
  void leave(int module);
  void release(std::size_t bucket);  // with mutex_ held
  const std::string& module_name(int module) const;
  std::string parameter_in(std::size_t bucket, std::int64_t begin, std::int64_t end) const;

  const nn::FlatParameters& params_;
  Zero& zero_;
  const void* storage_;                                       // the flat buffer's
  std::vector<std::pair<nn::Module*, std::string>> modules_;  // every module once, with its path
  std::vector<std::uint64_t> hook_ids_;                       // two per module
  // Hooks and observers may run on several threads (a tower in std::async): one at a time.
  mutable std::mutex mutex_;
  std::thread::id forward_thread_;  // the one in DDP's forward
  bool learned_ = false;
  bool in_forward_ = false;
  std::vector<int> stack_;                         // modules entered there, innermost last
  std::vector<int> entered_;                       // the learning forward: modules, first entry
  std::vector<char> assigned_;                     // the learning forward: per bucket
  std::vector<std::vector<std::size_t>> waits_;    // per module: the buckets it waits for
  std::vector<std::size_t> first_waits_;           // before the forward
  std::vector<char> released_;                     // per bucket, this forward
  std::vector<std::pair<std::size_t, int>> plan_;  // (bucket, module) in waiting order
};

}  // namespace nanoddp::comm
