#pragma once
// DistributedDataParallel: wraps a model so that `loss.backward()` leaves every rank with the
// average of all ranks' gradients, reduced bucket by bucket while backward runs (see reducer.h).
//
//   nn::Mlp model(...);
//   nn::FlatParameters params(model, device);
//   comm::DistributedDataParallel ddp(model, params, dist.group, dist.store, {.bucket_cap_mb = 25});
//   nn::SGD sgd(params, {.lr = 0.01f});
//   for (...) { sgd.zero_grad(); mse_loss(ddp(x), y).backward(); sgd.step(); }
//
// At construction every rank checks that all ranks hold the same model (names, dtypes, shapes)
// and the same DDP settings — a mismatch fails on every rank, naming the first difference —
// and rank 0's parameters are broadcast so that all ranks start equal. At the end of every
// synchronized backward pass the ranks check that they are at the same step (step_check.h).

#include <memory>
#include <string>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/reducer.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/module.h"

namespace nanoddp::comm {

struct DdpOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool find_unused_parameters = false;
  bool broadcast_parameters = true;
  CommHook comm_hook = CommHook::kAllreduce;
  bool overlap = true;
  // Every step, check that all ranks are at the same step and issued the same collectives; a
  // rank that skipped a step fails every rank at once (step_check.h). Off saves one tiny
  // all-reduce per step (and, on a GPU, the host's wait for it).
  bool check_steps = true;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, nn::FlatParameters& params,
                          std::shared_ptr<ProcessGroup> group, std::shared_ptr<Store> store,
                          const DdpOptions& options = {});

  Tensor forward(const Tensor& x) {
    reducer_->note_forward();  // compared across ranks every step (step_check.h)
    return module_.forward(x);
  }
  Tensor operator()(const Tensor& x) { return forward(x); }

  // While a NoSync is alive, backward passes only accumulate gradients locally; the next
  // synchronized backward reduces the accumulated sum (gradient accumulation without paying
  // for an all-reduce per micro-batch).
  class NoSync {
   public:
    explicit NoSync(Reducer& reducer) : reducer_(reducer), previous_(reducer.sync()) {
      reducer_.set_sync(false);
    }
    ~NoSync() { reducer_.set_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*reducer_); }

  Reducer& reducer() { return *reducer_; }
  ProcessGroup& group() { return *group_; }
  nn::Module& module() { return module_; }
  const DdpOptions& options() const { return options_; }

 private:
  nn::Module& module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace nanoddp::comm
