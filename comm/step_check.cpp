#include "nanoddp/comm/step_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace nanoddp::comm {

namespace {

constexpr std::size_t kPieces = 4;  // 16-bit pieces of a 64-bit value: each exact in float32
// pass, forward calls, ops, hash, parameters without a gradient
constexpr std::size_t kCountsLength = 5 * kPieces;
constexpr std::size_t kRecordLength = 2 * kPieces + 2;  // sequence, kind, count, dtype
// Parameters without a gradient named in a mismatch's details, per rank (slot indices, exact in
// float32 below 2^24).
constexpr std::size_t kNamedMissing = 8;
// What each rank publishes on a mismatch: its counts, how many ops follow, the ops, the first
// slots without a gradient.
constexpr std::size_t kDetailLength =
    kCountsLength + 1 + ProcessGroup::kRecentOps * kRecordLength + kNamedMissing;

void put(std::vector<float>& out, std::uint64_t value) {
  for (std::size_t i = 0; i < kPieces; ++i) {
    out.push_back(static_cast<float>((value >> (16 * (kPieces - 1 - i))) & 0xffff));
  }
}

std::uint64_t take(const float*& in) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < kPieces; ++i) {
    value = (value << 16) | static_cast<std::uint64_t>(*in++);
  }
  return value;
}

// One rank's side, decoded from its allgathered detail.
struct Side {
  std::uint64_t pass = 0;
  std::uint64_t forward_calls = 0;
  OpFingerprint fingerprint;
  std::uint64_t missing = 0;  // parameters without a gradient
  std::vector<OpRecord> recent;
  std::vector<std::size_t> named_missing;  // the first of them (slots)

  bool operator==(const Side& o) const {
    if (pass != o.pass || forward_calls != o.forward_calls || missing != o.missing ||
        fingerprint.ops != o.fingerprint.ops || fingerprint.hash != o.fingerprint.hash ||
        recent.size() != o.recent.size()) {
      return false;
    }
    for (std::size_t i = 0; i < recent.size(); ++i) {
      const OpRecord& a = recent[i];
      const OpRecord& b = o.recent[i];
      if (a.sequence_number != b.sequence_number || a.kind != b.kind || a.count != b.count ||
          a.dtype != b.dtype) {
        return false;
      }
    }
    return true;
  }

  std::string describe() const {
    std::vector<std::string> ops;
    for (const OpRecord& op : recent) ops.push_back(describe_op(op));
    return fmt::format(
        "step {} (synchronized backward pass {}, after {} DDP forward call(s)), {} collective(s) "
        "issued before this check (fingerprint {:016x}), the last: {}",
        pass, pass, forward_calls, fingerprint.ops, fingerprint.hash,
        ops.empty() ? std::string("none") : fmt::format("{}", fmt::join(ops, ", ")));
  }
};

Side decode(const float* in) {
  Side side;
  side.pass = take(in);
  side.forward_calls = take(in);
  side.fingerprint.ops = take(in);
  side.fingerprint.hash = take(in);
  side.missing = take(in);
  const float* records_start = in + 1;
  const auto records = static_cast<std::size_t>(*in++);
  for (std::size_t i = 0; i < records && i < ProcessGroup::kRecentOps; ++i) {
    OpRecord op;
    op.sequence_number = take(in);
    op.kind = static_cast<OpKind>(static_cast<int>(*in++));
    op.count = take(in);
    op.dtype = static_cast<DType>(static_cast<int>(*in++));
    side.recent.push_back(op);
  }
  const float* named = records_start + ProcessGroup::kRecentOps * kRecordLength;
  for (std::size_t i = 0; i < std::min<std::uint64_t>(side.missing, kNamedMissing); ++i) {
    side.named_missing.push_back(static_cast<std::size_t>(named[i]));
  }
  return side;
}

// What differs first between two sides, in words.
std::string first_difference(const Side& a, int rank_a, const Side& b, int rank_b) {
  if (a.pass != b.pass) {
    return fmt::format("rank {} is at step {}, rank {} at step {}", rank_a, a.pass, rank_b, b.pass);
  }
  if (a.forward_calls != b.forward_calls) {
    return fmt::format(
        "at step {} rank {} has called DDP's forward {} time(s), rank {} {} time(s): a rank "
        "skipped a step's backward (an exception caught and the step skipped?), so the "
        "all-reduces paired different steps",
        a.pass, rank_a, a.forward_calls, rank_b, b.forward_calls);
  }
  // The same step: the ops differ. Name the first op, by sequence number, that differs.
  for (const OpRecord& x : a.recent) {
    for (const OpRecord& y : b.recent) {
      if (x.sequence_number == y.sequence_number &&
          (x.kind != y.kind || x.count != y.count || x.dtype != y.dtype)) {
        return fmt::format("op #{} is {} on rank {} but {} on rank {}", x.sequence_number,
                           describe_op(x), rank_a, describe_op(y), rank_b);
      }
    }
  }
  if (a.fingerprint.ops != b.fingerprint.ops) {
    return fmt::format("at step {} rank {} has issued {} collective(s), rank {} {}", a.pass, rank_a,
                       a.fingerprint.ops, rank_b, b.fingerprint.ops);
  }
  return fmt::format("at step {} the collectives issued by ranks {} and {} differ", a.pass, rank_a,
                     rank_b);
}

}  // namespace

StepCheck::StepCheck(std::shared_ptr<ProcessGroup> group, Device device,
                     std::vector<std::string> slot_names)
    : group_(std::move(group)), device_(device), slot_names_(std::move(slot_names)) {}

void StepCheck::launch(std::uint64_t pass, std::uint64_t forward_calls,
                       std::span<const std::size_t> missing) {
  pass_ = pass;
  forward_calls_ = forward_calls;
  missing_.assign(missing.begin(), missing.end());
  // Taken before the check is issued: the check itself is the same op on every rank.
  fingerprint_ = group_->fingerprint();
  recent_ = group_->recent_ops();
  std::vector<float> host;
  host.reserve(2 * kCountsLength);
  put(host, pass);
  put(host, forward_calls);
  put(host, fingerprint_.ops);
  put(host, fingerprint_.hash);
  put(host, missing_.size());
  for (std::size_t i = 0; i < kCountsLength; ++i) host.push_back(-host[i]);
  const auto n = static_cast<std::int64_t>(host.size());
  if (device_.is_cpu()) {
    // Host memory on both ends: written in place, no upload (and no host synchronization, which
    // a CPU run counts where a GPU run would have one: engine/host_sync.h).
    if (!values_.defined()) values_ = Tensor::empty({n}, device_);
    std::copy(host.begin(), host.end(), values_.data());
  } else {
    values_ = Tensor::from_vector(host, {n}, device_);
  }
  work_ = group_->allreduce(values_, ReduceOp::kMax);
}

void StepCheck::wait_quietly() {
  if (!work_) return;
  try {
    work_->wait();
  } catch (...) {
  }
  work_ = nullptr;
}

void StepCheck::verify() {
  if (!work_) return;
  std::shared_ptr<Work> work = std::move(work_);
  work->wait();
  // On the CPU the finished all-reduce left its result in host memory; on a GPU reading it
  // waits for the stream (one host synchronization per step; check_steps = false avoids it).
  const std::vector<float> reduced =
      device_.is_cpu() ? std::vector<float>(values_.data(), values_.data() + values_.numel())
                       : values_.to_vector();
  bool same = true;
  for (std::size_t i = 0; i < kCountsLength; ++i) {
    same = same && reduced[i] == -reduced[kCountsLength + i];
  }
  if (same) return;

  // Every rank got the same reduced values, so every rank is here: exchange the details.
  std::vector<float> mine;
  mine.reserve(kDetailLength);
  put(mine, pass_);
  put(mine, forward_calls_);
  put(mine, fingerprint_.ops);
  put(mine, fingerprint_.hash);
  put(mine, missing_.size());
  mine.push_back(static_cast<float>(recent_.size()));
  for (const OpRecord& op : recent_) {
    put(mine, op.sequence_number);
    mine.push_back(static_cast<float>(op.kind));
    put(mine, op.count);
    mine.push_back(static_cast<float>(op.dtype));
  }
  mine.resize(kDetailLength - kNamedMissing, 0.0f);
  for (std::size_t i = 0; i < kNamedMissing; ++i) {
    mine.push_back(i < missing_.size() ? static_cast<float>(missing_[i]) : 0.0f);
  }
  const int size = group_->size();
  const int rank = group_->rank();
  Tensor input = Tensor::from_vector(mine, {static_cast<std::int64_t>(kDetailLength)}, device_);
  Tensor output = Tensor::zeros({static_cast<std::int64_t>(kDetailLength) * size}, device_);
  std::vector<Side> sides;
  try {
    group_->allgather(input, output)->wait();
    const std::vector<float> all = output.to_vector();
    for (int r = 0; r < size; ++r) {
      sides.push_back(decode(all.data() + static_cast<std::size_t>(r) * kDetailLength));
    }
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "the ranks are out of step at the end of this rank's step {} (rank {} of {}): the "
        "per-step check of the collectives issued found a difference, and exchanging the "
        "details failed ({}). This rank: {}",
        pass_, rank, size, e.what(), decode(mine.data()).describe()));
  }
  // A rank that gave parameters no gradient is the cause: name them (every rank throws this).
  std::vector<std::string> without;
  std::vector<int> failed;
  for (int r = 0; r < size; ++r) {
    const Side& side = sides[static_cast<std::size_t>(r)];
    if (side.missing == 0) continue;
    failed.push_back(r);
    std::vector<std::string> names;
    for (const std::size_t slot : side.named_missing) {
      names.push_back(slot < slot_names_.size() ? slot_names_[slot]
                                                : fmt::format("parameter #{}", slot));
    }
    without.push_back(fmt::format(
        "on rank {}, {} parameter(s): {}{}", r, side.missing, fmt::join(names, ", "),
        side.missing > names.size() ? fmt::format(" and {} more", side.missing - names.size())
                                    : std::string()));
  }
  if (!failed.empty()) {
    throw CommError(fmt::format(
        "step {}: parameters received no gradient in this backward pass ({}), so their buckets "
        "could not be reduced (seen on rank {} of {}; rank{} {} reduced them with zeros so that "
        "no rank waits, and every rank stops at this step). Make every parameter take part in "
        "the loss on every rank, or construct DistributedDataParallel with "
        "find_unused_parameters = true.",
        pass_, fmt::join(without, "; "), rank, size, failed.size() > 1 ? "s" : "",
        fmt::join(failed, ", ")));
  }
  // Group the ranks by side; name the first difference from rank 0's side.
  std::vector<std::pair<Side, std::vector<int>>> groups;
  for (int r = 0; r < size; ++r) {
    const Side& side = sides[static_cast<std::size_t>(r)];
    bool placed = false;
    for (auto& [s, ranks] : groups) {
      if (s == side) {
        ranks.push_back(r);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({side, {r}});
  }
  std::vector<std::string> parts;
  for (const auto& [side, ranks] : groups) {
    parts.push_back(fmt::format("rank{} {}: {}", ranks.size() > 1 ? "s" : "",
                                fmt::join(ranks, ", "), side.describe()));
  }
  const std::string difference = groups.size() > 1
                                     ? first_difference(groups[0].first, groups[0].second.front(),
                                                        groups[1].first, groups[1].second.front())
                                     : std::string("the check's values differ");
  throw CommError(fmt::format(
      "the ranks are out of step at the end of this rank's step {} (rank {} of {}): {}. "
      "{}. Every rank must run the same steps and issue the same collectives in the same order; "
      "a rank that catches an exception must not go on alone.",
      pass_, rank, size, difference, fmt::join(parts, "; ")));
}

}  // namespace nanoddp::comm
