#pragma once
// DistributedDataParallel: wraps a model so that `loss.backward()` leaves every rank with the
// average of all ranks' gradients, reduced bucket by bucket while backward runs (see reducer.h).
//
//   nn::Mlp model(...);
//   nn::FlatParameters params(model, device);
//   comm::DistributedDataParallel ddp(model, params, dist.group, dist.store,
//                                     {.reducer = {.bucket_cap_mb = 25}});
//   nn::SGD sgd(params, {.lr = 0.01f});
//   for (...) { sgd.zero_grad(); mse_loss(ddp(x), y).backward(); sgd.step(); }
//
// At construction every rank checks that all ranks hold the same model (names, dtypes, shapes)
// and the same DDP settings — a mismatch fails on every rank, naming the first difference —
// and rank 0's parameters are broadcast so that all ranks start equal. At the end of every
// synchronized backward pass the ranks check that they are at the same step (step_check.h).
// After the first one the buckets are cut again in the gradient order rank 0 observed
// (ReducerOptions::rebuild_buckets; the order travels through the store). With
// find_unused_parameters, forward walks its output's graph so that the backward that follows
// need not wait for the parameters it cannot reach (Reducer::prepare_for_backward).
//
// ZeRO (zero.h): with zero_stage 1 or 2 the DDP also takes the optimizer, shards its state
// (each rank keeps 1/W), and the step is ddp.zero()->step() instead of optimizer.step():
//
//   comm::DistributedDataParallel ddp(model, params, group, store, {.zero_stage = 2}, &sgd);
//   for (...) { sgd.zero_grad(); mse_loss(ddp(x), y).backward(); ddp.zero()->step(); }

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/reducer.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/comm/zero.h"
#include "nanoddp/comm/zero_overlap.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/module.h"
#include "nanoddp/nn/optimizer.h"

namespace nanoddp::comm {

struct DdpOptions {
  // Buckets and their rebuild, overlap, unused parameters, the comm hook, the per-step check
  // (reducer.h).
  ReducerOptions reducer;
  // Start from rank 0's parameters (PyTorch always does; off when every rank loaded the same).
  bool broadcast_parameters = true;
  // 0: every rank keeps the whole optimizer state and averaged gradient. 1: the optimizer state
  // sharded over the ranks. 2: the averaged gradients too (zero.h). Turns rebuild_buckets off:
  // the buckets define which rank owns what.
  int zero_stage = 0;
  // ZeRO: the parameter all-gathers after a step run while the next forward computes, each
  // waited for before the first module that reads it (zero_overlap.h). Every rank sets it alike
  // (checked). Ops and host reads wait for what they use; whoever reads the parameters through
  // raw pointers between zero()->step() and the next forward calls
  // zero()->wait_for_parameters() first.
  bool zero_overlap_gather = false;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, nn::FlatParameters& params,
                          std::shared_ptr<ProcessGroup> group, std::shared_ptr<Store> store,
                          const DdpOptions& options = {}, nn::Optimizer* optimizer = nullptr);

  // Calls the model through its operator(), so its forward hooks run (as PyTorch's DDP does).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // Several inputs and outputs (nn::Module::forward_many). Every parameter that took part in
  // any output gets its gradient through the same hooks; one that took part in none is an
  // unused parameter as with one input.
  std::vector<Tensor> forward_many(std::span<const Tensor> inputs);
  template <typename... Ts>
  requires(sizeof...(Ts) >= 2 &&
           (std::is_convertible_v<const Ts&, const Tensor&> && ...)) std::vector<Tensor>
  operator()(const Ts&... inputs) {
    const Tensor all[] = {inputs...};
    return forward_many(all);
  }

  // While a NoSync is alive, forward does not arm the Reducer, so the backward of its output
  // only accumulates gradients locally (decided at forward, as in PyTorch); the next
  // synchronized backward reduces the accumulated sum (gradient accumulation without paying
  // for an all-reduce per micro-batch).
  // It names the DDP, not its Reducer: reconfigure() replaces the Reducer, and a NoSync that
  // held the old one wrote into freed memory when it ended, leaving the new one unsynchronized
  // (the ranks then stopped averaging, silently).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.reducer_->sync()) {
      ddp_.reducer_->set_sync(false);
    }
    ~NoSync() { ddp_.reducer_->set_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Between steps, cut the buckets anew with other options (bucket caps, overlap, the comm
  // hook, ...), as a scaling study sweeping bucket sizes on one live model does. Every rank must
  // call it, with the same options (checked, like the constructor's settings). no_sync state, a
  // forward's arming of the next backward and the bucket-reduced hook carry over; the old
  // Reducer's hooks are removed.
  // Not under ZeRO (its shards follow the buckets).
  void reconfigure(const ReducerOptions& options);

  // ZeRO's step, memory and checkpoint state; null with zero_stage 0.
  Zero* zero() { return zero_.get(); }
  // zero_overlap_gather's plan; null without it.
  const ZeroOverlap* zero_overlap() const { return overlap_.get(); }

  Reducer& reducer() { return *reducer_; }
  ProcessGroup& group() { return *group_; }
  nn::Module& module() { return module_; }
  const DdpOptions& options() const { return options_; }

 private:
  void check_settings(const ReducerOptions& options);
  std::string optimizer_description_ = "(not given)";  // compared across ranks (ZeRO's)
  void agree_order_through_store();

  nn::Module& module_;
  nn::FlatParameters& params_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<Store> store_;
  DdpOptions options_;
  std::string key_;             // this instance's key space in the store
  int generation_ = 0;          // settings checks so far (the constructor's is 0)
  std::unique_ptr<Zero> zero_;  // before reducer_: the Reducer's collectives use its buffers
  std::unique_ptr<ZeroOverlap> overlap_;  // zero_overlap_gather
  // The model's call, between the overlap's begin and end of a forward.
  std::vector<Tensor> call_model(const std::function<std::vector<Tensor>()>& call);
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace nanoddp::comm
