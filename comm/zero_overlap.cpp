#include "nanoddp/comm/zero_overlap.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "nanoddp/engine/autograd.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

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
  collect(root, "", modules_);
  waits_.resize(modules_.size());
  released_at_.assign(zero_.bucket_count(), kNever);
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    nn::Module& m = *modules_[i].first;
    const int index = static_cast<int>(i);
    hook_ids_.push_back(m.register_forward_pre_hook([this, index](nn::Module&) { enter(index); }));
    hook_ids_.push_back(m.register_forward_hook([this, index](nn::Module&) { leave(index); }));
  }
}

ZeroOverlap::~ZeroOverlap() {
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    modules_[i].first->remove_forward_hook(hook_ids_[2 * i]);
    modules_[i].first->remove_forward_hook(hook_ids_[2 * i + 1]);
  }
}

const std::string& ZeroOverlap::module_name(int module) const {
  static const std::string kModel = "the model itself";
  if (module == kNone || modules_[static_cast<std::size_t>(module)].second.empty()) return kModel;
  return modules_[static_cast<std::size_t>(module)].second;
}

void ZeroOverlap::release(std::size_t bucket) {
  if (released_at_[bucket] != kNever) return;
  zero_.wait_for_bucket(bucket);
  released_at_[bucket] = next_node_sequence_nr();  // every read from now on sees it gathered
}

void ZeroOverlap::begin_forward() {
  in_forward_ = true;
  stack_.clear();
  entries_.assign(1, {next_node_sequence_nr(), kNone});
  released_at_.assign(released_at_.size(), kNever);
  // Reads autograd does not record cannot be checked: no overlap for them.
  if (!NoGrad::grad_enabled()) zero_.wait_for_parameters();
  for (const std::size_t b : first_waits_) release(b);
}

void ZeroOverlap::enter(int module) {
  if (!in_forward_) {
    zero_.wait_for_parameters();  // outside DDP's forward nothing was learned: wait for all
    return;
  }
  stack_.push_back(module);
  entries_.emplace_back(next_node_sequence_nr(), module);
  for (const std::size_t b : waits_[static_cast<std::size_t>(module)]) release(b);
}

void ZeroOverlap::leave(int module) {
  if (!in_forward_) return;
  // The innermost entry of `module` ends (a child that threw past its own exit ends with it).
  const auto it = std::find(stack_.rbegin(), stack_.rend(), module);
  if (it != stack_.rend()) stack_.erase(std::prev(it.base()), stack_.end());
  entries_.emplace_back(next_node_sequence_nr(), stack_.empty() ? kNone : stack_.back());
}

int ZeroOverlap::active_at(std::uint64_t sequence_nr) const {
  // The last entry at or before the read: nodes recorded after an entry have numbers >= it.
  const auto it = std::upper_bound(
      entries_.begin(), entries_.end(), sequence_nr,
      [](std::uint64_t n, const std::pair<std::uint64_t, int>& e) { return n < e.first; });
  return it == entries_.begin() ? kNone : std::prev(it)->second;
}

void ZeroOverlap::abort_forward() {
  in_forward_ = false;
  zero_.wait_for_parameters();
}

void ZeroOverlap::end_forward(std::span<const Tensor> outputs) {
  in_forward_ = false;
  for (std::size_t b = 0; b < released_at_.size(); ++b) release(b);
  // Each parameter's first read in this forward, in order.
  std::unordered_map<const TensorImpl*, std::size_t> slot_of;
  for (std::size_t s = 0; s < params_.slots().size(); ++s)
    slot_of[params_.slots()[s].param.impl()] = s;
  std::vector<std::pair<std::uint64_t, std::size_t>> reads;  // (sequence number, slot)
  for (const auto& [leaf, n] : first_reads(outputs)) {
    const auto it = slot_of.find(leaf);
    if (it != slot_of.end()) reads.emplace_back(n, it->second);
  }
  std::sort(reads.begin(), reads.end());
  if (!learned_) {
    if (reads.empty()) return;  // a forward without a graph teaches nothing
    std::vector<char> assigned(released_at_.size(), 0);
    for (const auto& [n, slot] : reads) {
      const std::size_t b = zero_.bucket_of_slot(slot);
      if (assigned[b] != 0) continue;
      assigned[b] = 1;
      const int module = active_at(n);
      (module == kNone ? first_waits_ : waits_[static_cast<std::size_t>(module)]).push_back(b);
    }
    for (std::size_t b = 0; b < assigned.size(); ++b) {
      if (assigned[b] == 0) first_waits_.push_back(b);
    }
    // The gathers complete in the order they are launched, so they are launched in the order
    // the next forward will wait for them: the whole model's first, then each module's on its
    // first entry. (In the order of the first reads instead, a bucket the model itself reads
    // at its end would be launched last and waited for first: no overlap at all.)
    for (const std::size_t b : first_waits_) plan_.emplace_back(b, kNone);
    std::vector<char> entered(modules_.size(), 0);
    for (const auto& [n, module] : entries_) {
      if (module == kNone || entered[static_cast<std::size_t>(module)] != 0) continue;
      entered[static_cast<std::size_t>(module)] = 1;
      for (const std::size_t b : waits_[static_cast<std::size_t>(module)])
        plan_.emplace_back(b, module);
    }
    std::vector<std::size_t> order;
    for (const auto& [b, module] : plan_) order.push_back(b);
    learned_ = true;
    zero_.set_overlap(true, std::move(order));
    return;
  }
  for (const auto& [n, slot] : reads) {
    const std::size_t b = zero_.bucket_of_slot(slot);
    if (n >= released_at_[b]) continue;
    fail(
        "ZeRO all-gather overlap (zero_overlap_gather): parameter '{}' was read in {} before its "
        "bucket's all-gather was waited for. This forward reads the parameters in another order "
        "than the first forward did (a branch taken only now?), so it may have computed with a "
        "half-gathered parameter. Turn the overlap off for this model (nanoddp-train: drop "
        "--zero-overlap-gather)",
        params_.slots()[slot].name, module_name(active_at(n)));
  }
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
