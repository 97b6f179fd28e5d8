#include "nanoddp/comm/zero_overlap.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

// Per thread: for each bucket, the launch (Zero::launches) after which this thread announced a
// use of it and saw it gathered. An op announces its inputs before it reads them and reports
// them again after: the report is safe when the same thread announced since the latest launch,
// even if a forward began meanwhile (an outside tester's op on another thread, started after
// step(), ended inside the next forward, and was refused although it had waited).
struct Announced {
  const void* owner = nullptr;
  std::vector<std::uint64_t> after_launch;  // launches + 1; 0: never
};
thread_local Announced tls_announced;

std::vector<std::uint64_t>& announced_by_this_thread(const void* owner, std::size_t buckets) {
  if (tls_announced.owner != owner) tls_announced = {owner, {}};
  if (tls_announced.after_launch.size() < buckets) tls_announced.after_launch.resize(buckets, 0);
  return tls_announced.after_launch;
}

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
    : params_(params), zero_(zero), storage_(params.values().impl()->storage.get()) {
  collect(root, "", modules_);
  waits_.resize(modules_.size());
  released_.assign(zero_.bucket_count(), 0);
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    nn::Module& m = *modules_[i].first;
    const int index = static_cast<int>(i);
    hook_ids_.push_back(m.register_forward_pre_hook([this, index](nn::Module&) { enter(index); }));
    hook_ids_.push_back(m.register_forward_hook([this, index](nn::Module&) { leave(index); }));
  }
  add_tensor_access_observer(this);
}

ZeroOverlap::~ZeroOverlap() {
  remove_tensor_access_observer(this);
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    modules_[i].first->remove_forward_hook(hook_ids_[2 * i]);
    modules_[i].first->remove_forward_hook(hook_ids_[2 * i + 1]);
  }
}

const std::string& ZeroOverlap::module_name(int module) const {
  static const std::string kModel = "the model",
                           kNoModule =
                               "no module (the model's forward called past its hooks, "
                               "or another thread)";
  if (module == kNone) return kNoModule;
  const std::string& path = modules_[static_cast<std::size_t>(module)].second;
  return path.empty() ? kModel : path;
}

std::string ZeroOverlap::parameter_in(std::size_t bucket, std::int64_t begin,
                                      std::int64_t end) const {
  for (const nn::ParameterSlot& slot : params_.slots()) {
    if (zero_.bucket_of_slot(static_cast<std::size_t>(&slot - params_.slots().data())) == bucket &&
        slot.offset < end && begin < slot.offset + slot.numel) {
      return slot.name;
    }
  }
  return fmt::format("(bucket {})", bucket);
}

void ZeroOverlap::release(std::size_t bucket) {
  if (released_[bucket] != 0) return;
  zero_.wait_for_bucket(bucket);
  released_[bucket] = 1;
}

void ZeroOverlap::begin_forward() {
  const std::lock_guard lock(mutex_);
  in_forward_ = true;
  forward_thread_ = std::this_thread::get_id();
  stack_.clear();
  released_.assign(released_.size(), 0);
  if (!learned_) assigned_.assign(released_.size(), 0);
  for (const std::size_t b : first_waits_) release(b);
}

void ZeroOverlap::enter(int module) {
  const std::lock_guard lock(mutex_);
  if (!in_forward_) {
    zero_.wait_for_parameters();  // outside DDP's forward nothing was learned: wait for all
    return;
  }
  if (std::this_thread::get_id() == forward_thread_) {
    stack_.push_back(module);
    if (!learned_ && std::find(entered_.begin(), entered_.end(), module) == entered_.end()) {
      entered_.push_back(module);
    }
  }
  for (const std::size_t b : waits_[static_cast<std::size_t>(module)]) release(b);
}

void ZeroOverlap::leave(int module) {
  const std::lock_guard lock(mutex_);
  if (!in_forward_ || std::this_thread::get_id() != forward_thread_) return;
  // The innermost entry of `module` ends (a child that threw past its own exit ends with it).
  const auto it = std::find(stack_.rbegin(), stack_.rend(), module);
  if (it != stack_.rend()) stack_.erase(std::prev(it.base()), stack_.end());
}

void ZeroOverlap::accessed(const TensorImpl& t, bool before) {
  if (t.storage.get() != storage_) return;  // not the flat parameter buffer
  std::int64_t numel = 1;
  for (const std::int64_t d : t.shape) numel *= d;
  const std::int64_t begin = t.offset, end = t.offset + numel;
  const std::lock_guard lock(mutex_);
  const bool here = in_forward_ && std::this_thread::get_id() == forward_thread_;
  const int module = here && !stack_.empty() ? stack_.back() : kNone;
  std::vector<std::uint64_t>& announced = announced_by_this_thread(this, released_.size());
  const std::uint64_t launch = zero_.launches() + 1;
  for (const std::size_t b : zero_.buckets_touching(begin, numel)) {
    if (before) {
      // Whatever follows waits for b if it must, before this thread reads it.
      announced[b] = launch;
    } else if (announced[b] == launch) {
      if (in_forward_ && learned_) released_[b] = 1;  // waited for by that announcement
      continue;
    }
    if (!in_forward_) {
      // Between step() and the next forward only a bucket still in flight matters.
      if (!zero_.gathering(b)) continue;
      if (before) {
        zero_.wait_for_bucket(b, /*in_forward=*/false);  // a host read or copy: then correct
        continue;
      }
      fail(
          "ZeRO all-gather overlap (zero_overlap_gather): parameter '{}' was used while its "
          "all-gather was still in flight, outside DistributedDataParallel's forward, by an op "
          "that says so only after it ran (it records without announcing its reads): it may have "
          "read a half-gathered parameter. Such an op calls notify_tensor_access(input, true) "
          "before it reads; or call zero()->wait_for_parameters() after step() first",
          parameter_in(b, begin, end));
    }
    if (!learned_) {
      // The first use of a bucket names the module that waits for it.
      if (assigned_[b] != 0) continue;
      assigned_[b] = 1;
      (module == kNone ? first_waits_ : waits_[static_cast<std::size_t>(module)]).push_back(b);
      continue;
    }
    if (released_[b] != 0) continue;
    if (before) {
      release(b);  // not where the plan waits, but in time
      continue;
    }
    fail(
        "ZeRO all-gather overlap (zero_overlap_gather): parameter '{}' was used in {} before its "
        "bucket's all-gather was waited for, by an op that says so only after it ran (it records "
        "without announcing its reads): it may have computed with a half-gathered parameter. "
        "Such an op calls notify_tensor_access(input, true) before it reads; or turn "
        "zero_overlap_gather off for this model",
        parameter_in(b, begin, end), here ? module_name(module) : "another thread");
  }
}

void ZeroOverlap::abort_forward() {
  const std::lock_guard lock(mutex_);
  in_forward_ = false;
  zero_.wait_for_parameters();
  if (!learned_) {  // learn again from the next forward
    entered_.clear();
    first_waits_.clear();
    for (std::vector<std::size_t>& w : waits_) w.clear();
  }
}

void ZeroOverlap::end_forward() {
  const std::lock_guard lock(mutex_);
  in_forward_ = false;
  for (std::size_t b = 0; b < released_.size(); ++b) release(b);
  if (learned_) return;
  if (std::none_of(assigned_.begin(), assigned_.end(), [](char a) { return a != 0; })) {
    return;  // nothing used (a forward that reads no parameter teaches nothing)
  }
  // A bucket the first forward did not use is waited for before the forward starts.
  for (std::size_t b = 0; b < assigned_.size(); ++b) {
    if (assigned_[b] == 0) first_waits_.push_back(b);
  }
  // The gathers complete in the order they are launched, so they are launched in the order
  // the next forward will wait for them: the model's own first, then each module's on its
  // first entry. (In the order of the first uses instead, a bucket the model uses at its very
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
  const std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [b, module] : plan_) {
    out += module == kNone
               ? fmt::format("bucket {}: waited for before the forward\n", b)
               : fmt::format("bucket {}: waited for on entering {}\n", b, module_name(module));
  }
  return out;
}

}  // namespace nanoddp::comm
