#pragma once
// ZeRO stages 1 and 2 (the Zero Redundancy Optimizer of DeepSpeed; PyTorch's
// ZeroRedundancyOptimizer is stage 1): each rank keeps the optimizer state of 1/W of the
// parameters only, updates that part, and the ranks all-gather the updated parameters.
//
// Who owns what. Rank r owns chunk r of every bucket: a bucket of n elements is cut into W
// chunks of q = floor(n / W) elements, rank r's is [r*q, (r+1)*q), and the last rank also owns
// the n - W*q < W elements left over at the bucket's end. Why per bucket and not one contiguous
// 1/W of the flat buffer: the stage-2 reduce-scatter of a bucket (its first W*q elements, read
// where they lie, no copy; the output is this rank's part of the shard gradient buffer) then
// leaves every rank exactly the chunk it owns as soon as that bucket is reduced, and no bucket is
// cut at a shard boundary; the few left-over elements take one tiny all-reduce more, in place.
// (Chunks of ceil(n / W) would need a padded copy of every uneven bucket.) The shard buffers (the
// optimizer state, and under stage 2 the averaged gradients) hold the chunks of all buckets one
// after the other: about 1/W of the elements per rank, W-1 more at most on the last rank per
// bucket. Stage 1 and stage 2 own the same elements.
//
// Follow one step:
//  stage 1  backward all-reduces every bucket as without ZeRO (the Reducer, reducer.h); the
//           optimizer updates only this rank's chunks (nn::Optimizer::shard), reading the full
//           averaged gradient; then each bucket's parameters are all-gathered (step()).
//  stage 2  the Reducer hands each ready bucket to reduce_scatter() instead of all-reducing it,
//           in bucket order while backward runs: the average of this rank's chunk lands in the
//           shard's gradient buffer, the only gradient the optimizer reads. Then as stage 1.
//
// The buckets must not change under ZeRO (they define the ownership): DDP turns
// ReducerOptions::rebuild_buckets off and refuses reconfigure(). The bf16 comm hook compresses
// the reduce-scatter as it compresses the all-reduce. Parameters without a gradient
// (find_unused_parameters) are skipped by the sharded optimizer as by the whole one, since
// every rank agrees which they are.
//
// Stage 2's gradient memory: there is no flat gradient buffer. The Reducer hands each bucket a
// buffer of its own when backward writes its first gradient and frees it once the bucket is
// reduce-scattered (reducer.h, set_zero), with at most two buckets holding memory at once in an
// ordinary backward: one filling, one on the wire. So a rank holds its shard of the averaged
// gradients plus at most two buckets (all of them while no_sync accumulates micro-batches, as
// PyTorch's FSDP holds whole gradients under no_sync). A parameter's .grad is gone once its
// bucket is reduced (its buffer dropped: grad() is undefined, has_grad() still says whether it
// has one, as zero_grad() clears it), and the optimizer reads the shard.
//
// Accumulation. Without zero_grad() between them, a second synchronized backward adds to the
// gradients of the first (the flat buffer accumulates; so do several backwards before one
// step). Stage 2 does the same in the shard: a parameter that still has a gradient when its
// bucket is bound again accumulates from zero, and its part of the chunk gets the new averages
// added instead of overwritten (set_adds).
//
// The all-gathers run in place, one per bucket: a bucket's chunks lie in the flat buffer just
// as an all-gather's output does (rank r's block at r x q), so no staging buffer is needed. By
// default the host waits for them at the end of step(). With DdpOptions::zero_overlap_gather
// step() only launches them, in the order the forward reads the buckets, and each is waited
// for just before the first module that reads it (zero_overlap.h): the gathers of the later
// layers run while the first ones compute. Whoever reads parameters between step() and the
// next forward calls wait_for_parameters() first (a checkpoint, a NaN check).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/reducer.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/optimizer.h"

namespace nanoddp::comm {

// What one process holds, in bytes (ZeroMemory of a run without ZeRO: the whole of each).
struct ZeroMemory {
  std::int64_t parameter_bytes = 0;
  // The flat gradient buffer autograd writes into; under stage 2 instead the most the bucket
  // buffers held at once so far (with the bf16 hook's compressed copies) plus the shard of
  // averaged gradients. (Not counted without stage 2: the bf16 hook's compressed copy of each
  // bucket, half the flat buffer's bytes.)
  std::int64_t gradient_bytes = 0;
  std::int64_t averaged_gradient_bytes = 0;  // what the optimizer reads: whole, or the shard
  std::int64_t optimizer_state_bytes = 0;
};
// Without ZeRO.
ZeroMemory unsharded_memory(const nn::FlatParameters& params, const nn::Optimizer& optimizer);
// Every rank's `mine`, in rank order: one all-gather over `group` (a collective, so every rank
// calls it at the same point; a null group is a world of one). `device` is where the group's
// tensors live. Each count travels as two float32 of 22 bits each, so it arrives exact.
std::vector<ZeroMemory> gather_memory(const ZeroMemory& mine, ProcessGroup* group, Device device);

class Zero {
 public:
  // Shards `optimizer` (its state so far, e.g. loaded from a checkpoint, is cut to this rank's
  // chunks). `buckets` are the Reducer's, fixed from now on.
  Zero(int stage, nn::FlatParameters& params, nn::Optimizer& optimizer,
       std::shared_ptr<ProcessGroup> group, const std::vector<Bucket>& buckets, CommHook hook);
  Zero(const Zero&) = delete;
  Zero& operator=(const Zero&) = delete;

  int stage() const { return stage_; }

  // The optimizer step on this rank's chunks, then every bucket's parameters all-gathered, so
  // that all ranks hold the same, updated, parameters again. Every rank calls it.
  void step();
  // The parameter all-gathers' time since the last call, in ms (0 when no step ran, e.g. a
  // skipped one). `after_step_ms`: the host's time in step() issuing and waiting for them (not
  // with the overlap, whose issue is short and stays the step's); `in_forward_ms`: its waits
  // for them in the forward (the overlap); `comm_ms`: their own time, as the process group
  // measured each (else the host's wait). On a GPU the host only issues them and waits for
  // none.
  struct GatherTimes {
    double after_step_ms = 0, in_forward_ms = 0, comm_ms = 0;
  };
  GatherTimes take_gather_times();

  // The all-gather overlap (zero_overlap.h). set_overlap(true), on every rank (DDP checks that
  // they agree): at the next step() the ranks agree on the order of the gathers, rank 0's
  // proposal (propose_gather_order) or else the default (last bucket first: it holds the first
  // layers, since buckets fill in the order gradients arrive). From then on step() launches them
  // in that order, without waiting once this rank proposed (learned its plan);
  // wait_for_bucket(b) waits for bucket b's, wait_for_parameters() for all.
  void set_overlap(bool on) { overlap_ = on; }
  // An order of all buckets; one proposed after the ranks agreed is not taken.
  void propose_gather_order(std::vector<std::size_t> order);
  // Whether bucket b's all-gather is still pending (launched and not yet waited for).
  bool gathering(std::size_t b) const;
  // How many times step() has launched the gathers without waiting (zero_overlap.h: a use
  // announced since the latest launch was waited for).
  std::uint64_t launches() const;
  // `in_forward`: the wait is the forward's (booked as in_forward_ms), else it happens between
  // steps (a checkpoint's wait_for_parameters(): the collectives' time only).
  void wait_for_bucket(std::size_t b, bool in_forward = true);
  void wait_for_parameters();
  std::size_t bucket_count() const { return chunks_.size(); }
  const std::vector<std::size_t>& gather_order() const { return gather_order_; }
  // Which bucket parameter slot `slot` lies in; which buckets elements [offset, offset + numel)
  // of the flat buffer touch.
  std::size_t bucket_of_slot(std::size_t slot) const { return bucket_of_slot_.at(slot); }
  std::vector<std::size_t> buckets_touching(std::int64_t offset, std::int64_t numel) const;
  ~Zero();

  // Stage 2, from the Reducer: bucket b's gradients (bucket.grads) reduce-scattered, averaged,
  // into this rank's chunk of the shard gradient buffer.
  std::shared_ptr<Work> reduce_scatter(std::size_t b, const Bucket& bucket);
  // Stage 2, after that collective's wait: the left-over elements into the last rank's shard,
  // and the bf16 hook's chunk expanded to float32.
  void bucket_scattered(std::size_t b, const Bucket& bucket);
  // Stage 2, from the Reducer as it binds a bucket: whether parameter `slot`'s averages are
  // added to its part of the shard (it has a gradient there already) or overwrite it.
  void set_adds(std::size_t slot, bool adds) { adds_.at(slot) = adds ? 1 : 0; }
  // The bytes of bucket buffers the Reducer allocated (+) or freed (-), for memory().
  void gradient_memory_changed(std::int64_t bytes);

  // The averaged gradients this rank holds: stage 2 the shard buffer (c elements per bucket),
  // stage 1 the flat gradient buffer.
  const Tensor& averaged_gradients() const;

  // The optimizer's state in the layout of the whole flat buffer (what checkpoints hold, the
  // same as without ZeRO): all-gathered, so every rank calls it and every rank gets it.
  std::vector<nn::NamedTensor> full_optimizer_state();

  ZeroMemory memory() const;
  // One line: stage, chunk sizes, bytes held.
  std::string describe() const;

 private:
  struct Chunk {
    std::int64_t offset = 0;  // the bucket in the flat buffers
    std::int64_t numel = 0;
    std::int64_t q = 0;      // floor(numel / W): every rank's chunk
    std::int64_t tail = 0;   // numel - W*q, owned by the last rank too
    std::int64_t own = 0;    // this rank's elements: q, or q + tail on the last rank
    std::int64_t local = 0;  // where they sit in the shard buffers
  };
  // All-gathers every bucket's chunks into `full` (flat layout); this rank's chunk of bucket c
  // is read from mine(c).
  template <typename Mine>
  void all_gather(Mine mine, Tensor& full);
  // Launches chunk c's all-gather into `full` (and the left-over elements' broadcast); `own` is
  // where this rank's chunk is now.
  std::vector<std::shared_ptr<Work>> launch_gather(const Chunk& c, const float* own, Tensor& full);
  // Stage 2: bucket b's averages into this rank's part of the shard, each parameter's copied or
  // added (set_adds). `main` holds the chunk's q elements, `tail` the left-over ones (the last
  // rank's; world 1: `main` is the whole bucket).
  void land(std::size_t b, const Bucket& bucket, const float* main, const float* tail);

  int stage_;
  GatherTimes gather_times_;
  bool overlap_ = false;
  bool order_agreed_ = false;
  bool launch_async_ = false;  // proposed: its plan is learned
  std::vector<std::size_t> proposal_;
  std::vector<std::size_t> gather_order_;                    // the order of the gathers
  // Per bucket: the gathers in flight. Waited for from any thread (zero_overlap.h): one at a
  // time, under the lock.
  std::vector<std::vector<std::shared_ptr<Work>>> pending_;
  mutable std::mutex pending_mutex_;
  std::uint64_t launches_ = 0;  // under the lock
  std::vector<std::size_t> bucket_of_slot_;
  std::size_t buckets_scattered_ = 0;  // stage 2: of the pass since the last step
  nn::FlatParameters& params_;
  nn::Optimizer& optimizer_;
  std::shared_ptr<ProcessGroup> group_;
  CommHook hook_;
  int rank_, world_;
  std::vector<Chunk> chunks_;
  std::int64_t shard_numel_ = 0;
  Tensor shard_grads_;                                     // stage 2
  std::vector<char> adds_;                                 // stage 2, per slot (set_adds)
  // Stage 2, per bucket: whether the reduce-scatter in flight adds to some of the chunk, and
  // then where its averages land first.
  std::vector<char> accumulating_;
  std::vector<Tensor> incoming_;
  std::int64_t bucket_bytes_ = 0, bucket_bytes_peak_ = 0;  // stage 2: bucket buffers held
  Tensor shard_grads_bf16_;  // stage 2 with the bf16 hook: the reduce-scatter's output
};

}  // namespace nanoddp::comm
