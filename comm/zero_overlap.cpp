#include "nanoddp/comm/zero_overlap.h"

#include <fmt/format.h>

#include <algorithm>

#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

void collect(nn::Module& module, const std::string& path,
             std::vector<std::pair<nn::Module*, std::string>>& out) {
  for (const auto& [m, name] : out) {
    if (m == &module) return;  // reachable twice: hooked once, under its first path
  }
  out.emplace_back(&module, path);
  for (const auto& [name, child] : module.children()) {
    collect(*child, path.empty() ? name : path + "." + name, out);
  }
}

}  // namespace

ZeroOverlap::ZeroOverlap(nn::Module& root, const nn::FlatParameters& params, Zero& zero)
    : params_(params), zero_(zero) {
  for (std::size_t s = 0; s < params_.slots().size(); ++s) {
    slot_of_[params_.slots()[s].param.impl()] = s;
  }
  collect(root, "", modules_);
  waits_.resize(modules_.size());
  released_.assign(zero_.bucket_count(), 0);
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    nn::Module& m = *modules_[i].first;
    const int index = static_cast<int>(i);
    hook_ids_.push_back(m.register_forward_pre_hook([this, index](nn::Module&) { enter(index); }));
    hook_ids_.push_back(m.register_forward_hook([this, index](nn::Module&) { leave(index); }));
  }
  add_leaf_read_observer(this);
}

ZeroOverlap::~ZeroOverlap() {
  remove_leaf_read_observer(this);
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    modules_[i].first->remove_forward_hook(hook_ids_[2 * i]);
    modules_[i].first->remove_forward_hook(hook_ids_[2 * i + 1]);
  }
}

const std::string& ZeroOverlap::module_name(int module) const {
  static const std::string kModel = "the model", kNone_ =
                                                     "no module (the model's forward called "
                                                     "past its hooks)";
  if (module == kNone) return kNone_;
  const std::string& path = modules_[static_cast<std::size_t>(module)].second;
  return path.empty() ? kModel : path;
}

void ZeroOverlap::release(std::size_t bucket) {
  if (released_[bucket] != 0) return;
  zero_.wait_for_bucket(bucket);
  released_[bucket] = 1;
}

void ZeroOverlap::begin_forward() {
  in_forward_ = true;
  stack_.clear();
  released_.assign(released_.size(), 0);
  if (!learned_) assigned_.assign(released_.size(), 0);
  for (const std::size_t b : first_waits_) release(b);
}

void ZeroOverlap::enter(int module) {
  if (!in_forward_) {
    zero_.wait_for_parameters();  // outside DDP's forward nothing was learned: wait for all
    return;
  }
  stack_.push_back(module);
  if (!learned_ && std::find(entered_.begin(), entered_.end(), module) == entered_.end()) {
    entered_.push_back(module);
  }
  for (const std::size_t b : waits_[static_cast<std::size_t>(module)]) release(b);
}

void ZeroOverlap::leave(int module) {
  if (!in_forward_) return;
  // The innermost entry of `module` ends (a child that threw past its own exit ends with it).
  const auto it = std::find(stack_.rbegin(), stack_.rend(), module);
  if (it != stack_.rend()) stack_.erase(std::prev(it.base()), stack_.end());
}

void ZeroOverlap::leaf_read(const TensorImpl* leaf) {
  const auto it = slot_of_.find(leaf);
  if (it == slot_of_.end()) return;  // not one of these parameters
  const std::size_t b = zero_.bucket_of_slot(it->second);
  const int module = stack_.empty() ? kNone : stack_.back();
  if (!in_forward_) {
    // Between step() and the next forward only a read of a bucket still in flight matters.
    if (!zero_.gathering(b)) return;
    fail(
        "ZeRO all-gather overlap (zero_overlap_gather): parameter '{}' was read while its "
        "all-gather was still in flight, outside DistributedDataParallel's forward (the model "
        "called as model.forward(x) instead of model(x)?). Call zero()->wait_for_parameters() "
        "after step() before reading the parameters",
        params_.slots()[it->second].name);
  }
  if (!learned_) {
    // The first read of a bucket's parameters names the module that waits for it.
    if (assigned_[b] != 0) return;
    assigned_[b] = 1;
    (module == kNone ? first_waits_ : waits_[static_cast<std::size_t>(module)]).push_back(b);
    return;
  }
  if (released_[b] != 0) return;
  fail(
      "ZeRO all-gather overlap (zero_overlap_gather): parameter '{}' was read in {} before its "
      "bucket's all-gather was waited for. This forward reads the parameters in another order "
      "than the first forward did (a branch taken only now?), so it may have computed with a "
      "half-gathered parameter. Turn the overlap off for this model (nanoddp-train: drop "
      "--zero-overlap-gather)",
      params_.slots()[it->second].name, module_name(module));
}

void ZeroOverlap::abort_forward() {
  in_forward_ = false;
  zero_.wait_for_parameters();
  if (!learned_) {  // learn again from the next forward
    entered_.clear();
    first_waits_.clear();
    for (std::vector<std::size_t>& w : waits_) w.clear();
  }
}

void ZeroOverlap::end_forward() {
  in_forward_ = false;
  for (std::size_t b = 0; b < released_.size(); ++b) release(b);
  if (learned_) return;
  if (std::none_of(assigned_.begin(), assigned_.end(), [](char a) { return a != 0; })) {
    return;  // nothing read (a forward that reads no parameter teaches nothing)
  }
  // A bucket the first forward did not read is waited for before the forward starts.
  for (std::size_t b = 0; b < assigned_.size(); ++b) {
    if (assigned_[b] == 0) first_waits_.push_back(b);
  }
  // The gathers complete in the order they are launched, so they are launched in the order
  // the next forward will wait for them: the model's own first, then each module's on its
  // first entry. (In the order of the first reads instead, a bucket the model reads at its very
  // end would be launched last and waited for first: no overlap at all.)
  for (const std::size_t b : first_waits_) plan_.emplace_back(b, kNone);
  for (const int module : entered_) {
    for (const std::size_t b : waits_[static_cast<std::size_t>(module)]) {
      plan_.emplace_back(b, module);
    }
  }
  std::vector<std::size_t> order;
  for (const auto& [b, module] : plan_) order.push_back(b);
  learned_ = true;
  zero_.propose_gather_order(std::move(order));
}

std::string ZeroOverlap::describe() const {
  std::string out;
  for (const auto& [b, module] : plan_) {
    out += module == kNone
               ? fmt::format("bucket {}: waited for before the forward\n", b)
               : fmt::format("bucket {}: waited for on entering {}\n", b, module_name(module));
  }
  return out;
}

}  // namespace nanoddp::comm
