#pragma once
// The Reducer: averages gradients across ranks while the backward pass is still running.
//
// Follow one gradient:
//  1. Buckets. The model's gradients live in one flat buffer laid out in reverse registration
//     order (nn/flat_parameters.h), i.e. in the order backward produces them. The Reducer cuts
//     that buffer into buckets: contiguous slices, the first capped at `first_bucket_mb` (small,
//     so the first all-reduce can start early), the others at `bucket_cap_mb`. A gradient is a
//     view into its bucket: nothing is copied in or out.
//  2. Ready. Each parameter's post-accumulate-grad hook fires when autograd has finished its
//     gradient. The hook counts down the parameter's bucket; at zero the bucket is ready.
//     Only in the backward that follows DDP's forward (prepare_for_backward arms the hooks, that
//     backward's finalize disarms them, as PyTorch's expect_autograd_hooks_): the backward of a
//     graph built by calling the module directly returns from every hook at once, gradients
//     stay local and no collective is issued.
//  3. Launch, in order. Ready buckets are launched strictly in index order: bucket 2 never goes
//     before bucket 1, even if it is ready first. Every rank therefore issues the same sequence
//     of collectives, which is what collectives require (a rank that launched out of order
//     would pair its bucket 2 with another rank's bucket 1: a hang or garbage).
//     The all-reduce (average) runs on the process group's worker thread (Gloo) or
//     communication stream (NCCL) while autograd goes on with earlier layers.
//  4. Finalize. When the backward pass ends (a callback autograd runs after the last node), the
//     Reducer launches what is left and waits for every bucket before backward() returns: on
//     the CPU the host waits; on a GPU only the compute stream does (the host goes on, and
//     kernels enqueued later see the averages). The all-reduce time after backward's end is
//     the *exposed* communication: the part the overlap did not hide (ReducerStats).
//  5. Averaging happens exactly once, in the collective (ReduceOp::kAvg).
//  6. Optionally, a bucket-reduced hook runs for each bucket, in order, as soon as its average
//     is in place (finalize waits for bucket 0, runs the hook, then waits for bucket 1, ...):
//     the optimizer in backward (nn/optimizer_in_backward.h) updates bucket 0's parameters
//     while bucket 1's all-reduce is still on the wire.
//
// A parameter that received no gradient leaves its bucket incomplete. By default that is an
// error naming the parameter, on every rank at once: the rank that found it reduces the bucket
// with zeros (so no rank waits in that all-reduce) and reports it through the step check. With
// find_unused_parameters the parameters DDP's forward output does not reach are marked ready as
// backward starts (prepare_for_backward), any other missing one at finalize, and their buckets are
// reduced with what the parameter's gradient holds: the sum of earlier no_sync micro-batches that
// used it (kept, as PyTorch keeps it), or zero when nothing wrote it since zero_grad(). One more
// all-reduce (after the buckets) counts the ranks that used each parameter: one that no rank used
// is left without a gradient (has_grad() false, as PyTorch leaves .grad None), so the optimizer
// skips it.

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/reducer_timeline.h"
#include "nanoddp/comm/step_check.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/nn/flat_parameters.h"

namespace nanoddp::comm {

// What a bucket's collective does to its gradients.
enum class CommHook {
  kAllreduce,  // float32 all-reduce (average)
  kBf16,       // compress to bf16, all-reduce in bf16, expand back to float32 in place
};
CommHook parse_comm_hook(const std::string& name);
const char* comm_hook_name(CommHook hook);

class Zero;  // zero.h

struct ReducerOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool find_unused_parameters = false;
  CommHook comm_hook = CommHook::kAllreduce;
  // Off: nothing is launched during backward; all buckets are reduced at finalize (for
  // measuring what the overlap buys).
  bool overlap = true;
  // At the end of every synchronized pass, check that all ranks are at the same step and
  // issued the same collectives (step_check.h): one tiny all-reduce; on a GPU the host waits
  // for it.
  bool check_steps = true;
  // Learn the order backward really produces gradients in during the first synchronized pass,
  // and cut the buckets again in that order, once (PyTorch's rebuild_buckets). All ranks take
  // rank 0's order. Not with find_unused_parameters, whose order may change from step to step
  // (PyTorch's rule too). Off: the buckets stay in reverse registration order.
  bool rebuild_buckets = true;
  // A world of one issues no collective: the average of one rank's gradients is its gradients.
  // On: it issues every one anyway (averaging over one rank, the same result), so that one GPU
  // exercises the communication stream and its events (the GPU tests; PyTorch always does).
  bool collectives_in_world_of_one = false;
};

struct Bucket {
  std::int64_t offset = 0;  // first element in the flat gradient buffer (-1 when packed)
  std::int64_t numel = 0;
  std::vector<std::size_t> slots;  // indices into FlatParameters::slots(), in layout order
  // The bucket's gradients: a view of the flat gradient buffer when its slots are one
  // contiguous run of it (always, until buckets are rebuilt in an observed order that differs
  // from the layout). Otherwise the bucket is *packed*: `grads` is a buffer of its own, the
  // gradients are copied in before the all-reduce and back after it.
  Tensor grads;
  bool packed = false;
  Tensor compressed;  // bf16 buffer (comm hook kBf16 only), kept across steps
};

class Reducer {
 public:
  Reducer(nn::FlatParameters& params, std::shared_ptr<ProcessGroup> group,
          const ReducerOptions& options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // DDP's forward calls this: the step check compares the count across ranks.
  void note_forward() { ++forward_calls_; }
  // DDP's forward hands its output here (PyTorch's prepare_for_backward). In a synchronized
  // (not no_sync), grad-enabled forward it arms the hooks: only the backward that follows
  // reduces; its finalize disarms them. Any other backward (a graph built by calling the module
  // directly, or under no_sync) leaves the gradients local and issues no collective.
  // find_unused_parameters: the parameters the output's graph does not reach will get no
  // gradient in that backward, so it marks them ready as it starts, and their buckets launch
  // with the others instead of at finalize.
  void prepare_for_backward(std::span<const Tensor> outputs);
  void prepare_for_backward(const Tensor& output) {
    prepare_for_backward(std::span<const Tensor>(&output, 1));
  }

  // While false, prepare_for_backward arms nothing, so the backward of that forward's graph
  // only accumulates gradients locally (no_sync; decided at forward, as in PyTorch).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // Whether a DDP forward armed the next backward to reduce (PyTorch's expect_autograd_hooks_).
  bool expects_autograd_hooks() const { return expect_autograd_hooks_; }
  void set_expect_autograd_hooks(bool expect) { expect_autograd_hooks_ = expect; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ReducerOptions& options() const { return options_; }
  // Statistics of the last synchronized backward pass. On CUDA the all-reduce timings arrive
  // once the collectives have finished on their stream (call it after the step synchronized).
  const ReducerStats& last_stats() { return timeline_.stats(); }
  // A one-line-per-bucket description: index, size, parameter names.
  std::string describe_buckets() const;

  // Runs in finalize, once per bucket and in bucket order, right after that bucket's averaged
  // gradients are in the flat gradient buffer (on a GPU: in stream order on the compute stream,
  // after the stream waited for the bucket). A packed bucket is handed on as its contiguous
  // pieces, one call each (offset, numel and slots of one run of the flat buffer). Only
  // synchronized passes reduce, so only they call it. The time the hook takes is not counted as
  // exposed communication.
  using BucketReducedHook = std::function<void(const Bucket& bucket)>;
  // Not under ZeRO (set_zero): the optimizer in backward would update whole buckets.
  void set_bucket_reduced_hook(BucketReducedHook hook);
  const BucketReducedHook& bucket_reduced_hook() const { return bucket_reduced_hook_; }
  // True from the first gradient hook of a synchronized pass until its finalize has ended.
  bool in_backward() const { return in_backward_; }
  // Whether the buckets were cut again in the observed gradient order (rebuild_buckets).
  bool buckets_rebuilt() const { return rebuilt_; }
  // rebuild_buckets: how the ranks agree on one gradient order. Gets this rank's observed order
  // (slot indices) and returns rank 0's, on every rank. By default a broadcast through the
  // process group (two host synchronizations, once); DDP sets one through its store instead.
  using OrderAgreement =
      std::function<std::vector<std::size_t>(const std::vector<std::size_t>& observed)>;
  void set_order_agreement(OrderAgreement agreement) { agree_order_ = std::move(agreement); }
  // ZeRO (zero.h), set by DDP: under stage 2 each bucket is reduce-scattered by `zero` instead
  // of all-reduced, and gradient memory is handed out one bucket at a time (below). The buckets
  // must stay as they are (no rebuild_buckets).
  //
  // Stage 2's gradient memory. The flat gradient buffer is freed (FlatParameters::
  // release_gradient_buffer); each parameter gets a grad source instead (Tensor::
  // set_grad_source). The first time autograd writes a gradient of bucket b, the source *binds*
  // b: a buffer of the bucket's size, with each of its parameters' .grad a view into it, as the
  // flat buffer's were. Once b is reduce-scattered and its chunk is in the shard, b is
  // *released*: the buffer is freed and its parameters have no gradient any more (PyTorch's
  // .grad = None; the optimizer reads the shard). Before binding another bucket while
  // kBoundBuckets already hold memory, the Reducer waits for the oldest launched one and
  // releases it: one bucket filling while the one before it is on the wire, the overlap kept.
  // Buckets bound but not launched are never waited for (backward may fill a later bucket
  // first, and under no_sync nothing is launched): then more are bound, no deadlock.
  static constexpr std::size_t kBoundBuckets = 2;
  void set_zero(Zero* zero);

 private:
  // The algorithm, in PyTorch's reducer's words (docs/ddp-internals.md, "Names").
  void autograd_hook(std::size_t slot);           // a parameter's post-accumulate-grad hook
  void mark_variable_ready(std::size_t slot);     // counts its bucket down
  void launch_ready_buckets();                    // in index order (PyTorch: mark_bucket_ready)
  void all_reduce_bucket(std::size_t bucket);     // applies the comm hook's collective
  std::shared_ptr<Work> average(Tensor& tensor);  // its all-reduce (none in a world of one)
  bool skips_collectives() const {
    return group_->size() == 1 && !options_.collectives_in_world_of_one;
  }
  void finalize_backward();                       // the end-of-backward callback
  void launch_rest();                             // finalize: what backward did not launch
  std::exception_ptr wait_for_buckets();          // finalize: in order, each handed on
  void bucket_reduced(std::size_t bucket);        // the comm hook and packing undone
  std::exception_ptr end_of_pass_checks(std::exception_ptr failure);
  // Bucket order from observation (rebuild_buckets): what the first synchronized pass saw,
  // agreed across ranks in its finalize, applied when the next synchronized pass starts.
  std::vector<std::size_t> observed_order() const;
  void agree_on_order();
  void rebuild_buckets();
  void set_buckets(const std::vector<std::vector<std::size_t>>& members);
  void pack(std::size_t bucket);     // a packed bucket's gradients into its buffer
  void unpack(std::size_t bucket);   // and the averages back
  void hand_on(std::size_t bucket);  // the bucket-reduced hook
  void abort();
  void wait_for_launched();  // every launched bucket's collective, errors ignored
  void reset();
  void handle_unused();
  std::string missing_gradients_message(const std::vector<std::string>& names) const;
  void mark_unused_ready(std::size_t slot);  // find_unused_parameters: no gradient will come
  // ZeRO-2's gradient memory (set_zero): a slot's buffer (its bucket bound first), binding,
  // the wait for the oldest launched bucket, and releasing.
  Tensor gradient_buffer(std::size_t slot);
  void bind(std::size_t bucket);
  void finish_oldest();
  void release(std::size_t bucket);
  // find_unused_parameters: all-reduces which parameters each rank used, then takes the
  // gradient away from those no rank used.
  void launch_used_map(const std::vector<float>& used);
  void resolve_unused();

  nn::FlatParameters& params_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_slot_;
  std::vector<std::vector<Bucket>> pieces_;  // per packed bucket: its contiguous runs
  std::shared_ptr<Reducer*> alive_;          // the autograd hooks hold weak handles to it
  std::vector<HookHandle> autograd_hooks_;   // removed by the destructor: nothing is left behind
  BucketReducedHook bucket_reduced_hook_;
  Zero* zero_ = nullptr;
  bool scatter_ = false;     // ZeRO stage 2
  std::vector<bool> bound_;  // stage 2, per bucket: holds gradient memory
  std::size_t bound_count_ = 0;
  std::unique_ptr<StepCheck> step_check_;  // null with one rank or check_steps off
  std::uint64_t forward_calls_ = 0;
  std::uint64_t synchronized_passes_ = 0;
  // rebuild_buckets: the pass that observes, per slot the number of autograd nodes run when its
  // gradient became final, the order being agreed, and the agreed order until it is applied.
  bool observing_ = false;
  bool rebuilt_ = false;
  std::vector<std::uint64_t> ready_node_;
  OrderAgreement agree_order_;
  std::vector<std::size_t> agreed_order_;
  ReducerTimeline timeline_;  // timing and tracing; the algorithm only reports to it

  // Per-step state.
  bool sync_ = true;
  bool expect_autograd_hooks_ = false;  // set by prepare_for_backward, cleared by finalize
  bool in_backward_ = false;
  bool finalizing_ = false;          // launches now come after backward ended
  std::uint64_t backward_pass_ = 0;  // autograd's id of the pass in progress
  std::vector<int> pending_;         // per bucket: gradients still to come
  std::vector<bool> slot_ready_;     // per slot
  std::vector<bool> used_;           // per slot: a gradient since zero_grad() (this rank)
  std::vector<bool> marked_unused_;  // per slot: marked ready without a gradient
  // Without find_unused_parameters: the slots that got no gradient in this pass, reduced as
  // zeros so that no rank waits, reported through the step check (then the pass fails).
  std::vector<std::size_t> missing_;
  // find_unused_parameters: the slots the last forward's output does not reach, for the next
  // synchronized pass to mark ready as it starts.
  std::vector<std::size_t> unused_after_forward_;
  std::size_t next_to_launch_ = 0;
  std::size_t next_to_finish_ = 0;  // stage 2: buckets released during backward come first
  std::vector<std::shared_ptr<Work>> works_;
  Tensor used_map_;                  // per slot: ranks that used it (find_unused_parameters)
  std::shared_ptr<Work> used_work_;  // its all-reduce, until resolve_unused()
};

}  // namespace nanoddp::comm
