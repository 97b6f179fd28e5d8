#include "nanoddp/comm/ddp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nanoddp/comm/consistency.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

DistributedDataParallel::DistributedDataParallel(nn::Module& module, nn::FlatParameters& params,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 std::shared_ptr<Store> store,
                                                 const DdpOptions& options)
    : module_(module), group_(std::move(group)), options_(options) {
  NANODDP_CHECK(group_ != nullptr && store != nullptr, "DDP needs a process group and a store");
  // 1. Every rank must hold the same model and settings, or the collectives below would pair
  //    up different buffers. Each DDP instance gets its own key space in the store.
  const std::int64_t instance = store->add("ddp/instances/" + std::to_string(group_->rank()), 1);
  std::vector<std::string> description;
  for (const nn::NamedTensor& p : module.named_parameters()) {
    description.push_back(fmt::format("{} {} {}", p.name, dtype_name(p.tensor.dtype()),
                                      shape_str(p.tensor.shape())));
  }
  std::vector<std::string> settings = {
      fmt::format("bucket_cap_mb={}", options.bucket_cap_mb),
      fmt::format("first_bucket_mb={}", options.first_bucket_mb),
      fmt::format("find_unused_parameters={}", options.find_unused_parameters),
      fmt::format("comm_hook={}", comm_hook_name(options.comm_hook)),
      fmt::format("overlap={}", options.overlap),
      fmt::format("broadcast_parameters={}", options.broadcast_parameters),
      fmt::format("check_steps={}", options.check_steps)};
  const std::string key = fmt::format("ddp/{}", instance);
  check_same_on_all_ranks(*store, group_->rank(), group_->size(), key + "/parameters",
                          "parameter", description);
  check_same_on_all_ranks(*store, group_->rank(), group_->size(), key + "/settings",
                          "DDP setting", settings);

  // 2. Start from rank 0's parameters.
  if (options.broadcast_parameters) {
    Tensor values = params.values();
    group_->broadcast(values, 0)->wait();
  }

  // 3. Buckets and hooks.
  reducer_ = std::make_unique<Reducer>(
      params, group_,
      ReducerOptions{.bucket_cap_mb = options.bucket_cap_mb,
                     .first_bucket_mb = options.first_bucket_mb,
                     .find_unused_parameters = options.find_unused_parameters,
                     .comm_hook = options.comm_hook,
                     .overlap = options.overlap,
                     .check_steps = options.check_steps});
}

}  // namespace nanoddp::comm
