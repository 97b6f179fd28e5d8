#include "nanoddp/comm/ddp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nanoddp/comm/consistency.h"
#include "nanoddp/engine/allocator.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

std::vector<std::string> describe(const ReducerOptions& options, bool broadcast_parameters,
                                  int zero_stage, bool zero_overlap_gather,
                                  const std::string& optimizer) {
  return {fmt::format("bucket_cap_mb={}", options.bucket_cap_mb),
          fmt::format("first_bucket_mb={}", options.first_bucket_mb),
          fmt::format("find_unused_parameters={}", options.find_unused_parameters),
          fmt::format("comm_hook={}", comm_hook_name(options.comm_hook)),
          fmt::format("overlap={}", options.overlap),
          fmt::format("check_steps={}", options.check_steps),
          fmt::format("rebuild_buckets={}", options.rebuild_buckets),
          fmt::format("broadcast_parameters={}", broadcast_parameters),
          fmt::format("zero_stage={}", zero_stage),
          // Its launch order differs from the gathers' after the step: the ranks must agree.
          fmt::format("zero_overlap_gather={}", zero_overlap_gather),
          // Under ZeRO each rank applies its own optimizer to its share: another kind or
          // learning rate on one rank would train a silently mixed model.
          fmt::format("optimizer={}", optimizer)};
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, nn::FlatParameters& params,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 std::shared_ptr<Store> store,
                                                 const DdpOptions& options,
                                                 nn::Optimizer* optimizer)
    : module_(module),
      params_(params),
      group_(std::move(group)),
      store_(std::move(store)),
      options_(options) {
  NANODDP_CHECK(group_ != nullptr && store_ != nullptr, "DDP needs a process group and a store");
  if (options.zero_stage < 0 || options.zero_stage > 2) {
    fail("DdpOptions::zero_stage {}: expected 0, 1 or 2", options.zero_stage);
  }
  params.require_parameters_of(module, "DistributedDataParallel");
  if (optimizer != nullptr && &optimizer->parameters() != &params) {
    fail(
        "the optimizer given to DistributedDataParallel updates another FlatParameters than the "
        "one DDP reduces: build it over the same FlatParameters");
  }
  if (options.zero_overlap_gather && options.zero_stage == 0) {
    fail(
        "DdpOptions::zero_overlap_gather overlaps ZeRO's parameter all-gather: set zero_stage 1 or "
        "2");
  }
  if (options.zero_stage > 0) {
    if (optimizer == nullptr) {
      fail("DdpOptions::zero_stage {} shards the optimizer: pass it to DDP's constructor",
           options.zero_stage);
    }
    if (options.zero_stage == 2 && params.attached() > 0) {
      fail(
          "DdpOptions::zero_stage 2 frees the parameters' flat gradient buffer, which {} other "
          "DistributedDataParallel(s) on the same parameters still use: destroy them first",
          params.attached());
    }
    // The buckets define who owns which chunk: they must never be cut again.
    options_.reducer.rebuild_buckets = false;
    optimizer_description_ = optimizer->describe();
  }
  // 1. Every rank must hold the same model and settings, or the collectives below would pair
  //    up different buffers. Each DDP instance gets its own key space in the store.
  const std::int64_t instance = store_->add("ddp/instances/" + std::to_string(group_->rank()), 1);
  key_ = fmt::format("ddp/{}", instance);
  std::vector<std::string> description;
  for (const nn::NamedTensor& p : module.named_parameters()) {
    description.push_back(
        fmt::format("{} {} {}", p.name, dtype_name(p.tensor.dtype()), shape_str(p.tensor.shape())));
  }
  check_same_on_all_ranks(*store_, group_->rank(), group_->size(), key_ + "/parameters",
                          "parameter", description);
  check_settings(options_.reducer);

  // 2. Start from rank 0's parameters.
  if (options.broadcast_parameters) {
    Tensor values = params.values();
    group_->broadcast(values, 0)->wait();
  }

  // 3. Buckets and hooks.
  reducer_ = std::make_unique<Reducer>(params, group_, options_.reducer);
  agree_order_through_store();

  // 4. ZeRO: the optimizer sharded along the buckets (zero.h).
  if (options_.zero_stage > 0) {
    zero_ = std::make_unique<Zero>(options_.zero_stage, params, *optimizer, group_,
                                   reducer_->buckets(), options_.reducer.comm_hook);
    reducer_->set_zero(zero_.get());
    if (options_.zero_overlap_gather) {
      zero_->set_overlap(true);
      overlap_ = std::make_unique<ZeroOverlap>(module_, params_, *zero_);
    }
    // The whole optimizer state (and under stage 2 the flat gradient buffer) was freed into the
    // caching allocator: give it back to the system, or the process would hold more, not less.
    allocator_for(params.device()).empty_cache();
  }
}

std::vector<Tensor> DistributedDataParallel::call_model(
    const std::function<std::vector<Tensor>()>& call) {
  if (!overlap_) return call();
  overlap_->begin_forward();
  std::vector<Tensor> outputs;
  try {
    outputs = call();
  } catch (...) {
    overlap_->abort_forward();
    throw;
  }
  overlap_->end_forward();
  return outputs;
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  reducer_->note_forward();  // compared across ranks every step (step_check.h)
  Tensor output = call_model([&] { return std::vector<Tensor>{module_(x)}; }).front();
  reducer_->prepare_for_backward(output);  // find_unused_parameters: walks its graph
  return output;
}

std::vector<Tensor> DistributedDataParallel::forward_many(std::span<const Tensor> inputs) {
  reducer_->note_forward();
  std::vector<Tensor> outputs = call_model([&] { return module_(inputs); });
  reducer_->prepare_for_backward(outputs);  // find_unused_parameters: walks every output
  return outputs;
}

void DistributedDataParallel::agree_order_through_store() {
  // rebuild_buckets: rank 0's gradient order goes through the store, host to host, instead of a
  // collective (which on a GPU would cost an upload and a read-back).
  reducer_->set_order_agreement([this, key = fmt::format("{}/order/{}", key_, generation_)](
                                    const std::vector<std::size_t>& observed) {
    if (group_->rank() == 0) store_->set(key, fmt::format("{}", fmt::join(observed, ",")));
    const std::string text = group_->rank() == 0 ? std::string() : store_->get_string(key);
    if (group_->rank() == 0) return observed;
    std::vector<std::size_t> order;
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t end = text.find(',', at);
      if (end == std::string::npos) end = text.size();
      order.push_back(std::stoul(text.substr(at, end - at)));
      at = end + 1;
    }
    return order;
  });
}

void DistributedDataParallel::check_settings(const ReducerOptions& options) {
  check_same_on_all_ranks(*store_, group_->rank(), group_->size(),
                          fmt::format("{}/settings/{}", key_, generation_++), "DDP setting",
                          describe(options, options_.broadcast_parameters, options_.zero_stage,
                                   options_.zero_overlap_gather, optimizer_description_));
}

void DistributedDataParallel::reconfigure(const ReducerOptions& options) {
  if (reducer_->in_backward()) {
    fail(
        "DistributedDataParallel::reconfigure: called during a backward pass; call it between "
        "steps");
  }
  if (zero_) {
    fail(
        "DistributedDataParallel::reconfigure: not under ZeRO (zero_stage {}): the optimizer's "
        "shards follow the buckets",
        options_.zero_stage);
  }
  check_settings(options);
  const bool sync = reducer_->sync();
  const bool expect = reducer_->expects_autograd_hooks();
  Reducer::BucketReducedHook bucket_hook = reducer_->bucket_reduced_hook();
  reducer_.reset();  // waits for its collectives and removes its hooks first
  try {
    reducer_ = std::make_unique<Reducer>(params_, group_, options);
  } catch (...) {
    // The options were checked equal on every rank, so every rank refuses them here: each goes
    // back to a Reducer with the options it had, and the DDP stays usable after the error (it
    // used to be left without a Reducer, and the next call crashed).
    reducer_ = std::make_unique<Reducer>(params_, group_, options_.reducer);
    reducer_->set_sync(sync);
    reducer_->set_expect_autograd_hooks(expect);
    if (bucket_hook) reducer_->set_bucket_reduced_hook(std::move(bucket_hook));
    agree_order_through_store();
    throw;
  }
  reducer_->set_sync(sync);
  reducer_->set_expect_autograd_hooks(expect);
  if (bucket_hook) reducer_->set_bucket_reduced_hook(std::move(bucket_hook));
  agree_order_through_store();
  options_.reducer = options;
}

}  // namespace nanoddp::comm
