#include "nanoddp/comm/zero.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/trace.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

// A bucket's reduce-scatter and the all-reduce of its left-over elements, as one Work for the
// Reducer (timed as the reduce-scatter).
class BucketWork final : public Work {
 public:
  BucketWork(std::shared_ptr<Work> scatter, std::shared_ptr<Work> tail)
      : scatter_(std::move(scatter)), tail_(std::move(tail)) {}
  void wait() override {
    scatter_->wait();
    tail_->wait();
  }
  bool is_completed() override { return scatter_->is_completed() && tail_->is_completed(); }
  std::exception_ptr error() override {
    std::exception_ptr e = scatter_->error();
    return e ? e : tail_->error();
  }
  std::uint64_t sequence_number() const override { return scatter_->sequence_number(); }
  const std::string& op_name() const override { return scatter_->op_name(); }
  std::optional<WorkTiming> timing() const override {
    std::optional<WorkTiming> a = scatter_->timing(), b = tail_->timing();
    if (!a || !b) return a;
    return WorkTiming{.start = std::min(a->start, b->start), .end = std::max(a->end, b->end)};
  }

 private:
  std::shared_ptr<Work> scatter_, tail_;
};

std::int64_t bytes(const Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

std::uint16_t* bf16_at(const Tensor& t, std::int64_t offset) {
  return static_cast<std::uint16_t*>(t.raw_data()) + offset;
}

}  // namespace

ZeroMemory unsharded_memory(const nn::FlatParameters& params, const nn::Optimizer& optimizer) {
  return {.parameter_bytes = bytes(params.values()),
          .gradient_bytes = bytes(params.grads()),
          .averaged_gradient_bytes = bytes(params.grads()),
          .optimizer_state_bytes = optimizer.state_bytes()};
}

std::vector<ZeroMemory> gather_memory(const ZeroMemory& mine, ProcessGroup* group, Device device) {
  if (group == nullptr || group->size() == 1) return {mine};
  // float32 holds integers up to 2^24 exactly; a count of up to 2^44 bytes splits into two.
  constexpr std::int64_t kHalf = std::int64_t{1} << 22;
  const std::array<std::int64_t, 4> counts = {mine.parameter_bytes, mine.gradient_bytes,
                                              mine.averaged_gradient_bytes,
                                              mine.optimizer_state_bytes};
  std::vector<float> packed;
  for (const std::int64_t c : counts) {
    NANODDP_CHECK(c >= 0 && c < kHalf * kHalf, "a byte count of {} does not fit the exchange", c);
    packed.push_back(static_cast<float>(c / kHalf));
    packed.push_back(static_cast<float>(c % kHalf));
  }
  const std::vector<float> all = allgather_values(packed, *group, device);
  std::vector<ZeroMemory> ranks(static_cast<std::size_t>(group->size()));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const float* at = all.data() + r * packed.size();
    auto count = [&](int i) {
      return static_cast<std::int64_t>(at[2 * i]) * kHalf +
             static_cast<std::int64_t>(at[2 * i + 1]);
    };
    ranks[r] = {.parameter_bytes = count(0),
                .gradient_bytes = count(1),
                .averaged_gradient_bytes = count(2),
                .optimizer_state_bytes = count(3)};
  }
  return ranks;
}

Zero::Zero(int stage, nn::FlatParameters& params, nn::Optimizer& optimizer,
           std::shared_ptr<ProcessGroup> group, const std::vector<Bucket>& buckets, CommHook hook)
    : stage_(stage),
      params_(params),
      optimizer_(optimizer),
      group_(std::move(group)),
      hook_(hook),
      rank_(group_->rank()),
      world_(group_->size()) {
  NANODDP_CHECK(stage == 1 || stage == 2, "ZeRO stage {} (expected 1 or 2)", stage);
  // Rank r owns chunk r of every bucket (the last rank the left-over elements too); the
  // chunks sit one after the other in the shard buffers.
  std::vector<nn::ShardRange> ranges;
  const bool last = rank_ == world_ - 1;
  for (const Bucket& bucket : buckets) {
    NANODDP_CHECK(!bucket.packed, "ZeRO needs buckets that are contiguous runs of the flat buffer");
    Chunk c{.offset = bucket.offset, .numel = bucket.numel};
    c.q = bucket.numel / world_;
    c.tail = bucket.numel - c.q * world_;
    c.own = c.q + (last ? c.tail : 0);
    c.local = shard_numel_;
    shard_numel_ += c.own;
    ranges.push_back({.offset = c.offset + rank_ * c.q, .numel = c.own, .local = c.local});
    chunks_.push_back(c);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const nn::ShardRange& a, const nn::ShardRange& b) { return a.offset < b.offset; });
  const Device device = params.device();
  if (stage_ == 2) {
    shard_grads_ = Tensor::zeros({shard_numel_}, device);
    if (hook_ == CommHook::kBf16) {
      shard_grads_bf16_ = Tensor::empty({shard_numel_}, device, DType::kBF16);
    }
  }
  bucket_of_slot_.assign(params.slots().size(), 0);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    for (const std::size_t slot : buckets[b].slots) bucket_of_slot_.at(slot) = b;
  }
  pending_.resize(chunks_.size());
  for (std::size_t b = chunks_.size(); b-- > 0;) gather_order_.push_back(b);
  adds_.assign(params.slots().size(), 0);
  accumulating_.assign(chunks_.size(), 0);
  incoming_.resize(chunks_.size());
  optimizer_.shard({.ranges = std::move(ranges),
                    .numel = shard_numel_,
                    .grads = stage_ == 2 ? shard_grads_ : Tensor()});
}

void Zero::land(std::size_t b, const Bucket& bucket, const float* main, const float* tail) {
  Backend& backend = backend_for(params_.device());
  const Chunk& c = chunks_[b];
  // This rank's elements of the bucket (flat offsets [begin, end)), where their averages are
  // and where they go in the shard: the chunk, and on the last rank the left-over elements.
  struct Part {
    std::int64_t begin, end;
    const float* from;
    std::int64_t local;
  };
  std::vector<Part> parts;
  if (world_ == 1) {
    parts.push_back({c.offset, c.offset + c.numel, main, c.local});
  } else {
    parts.push_back({c.offset + rank_ * c.q, c.offset + (rank_ + 1) * c.q, main, c.local});
    if (c.own > c.q)
      parts.push_back({c.offset + world_ * c.q, c.offset + c.numel, tail, c.local + c.q});
  }
  // Cut at parameter borders: each parameter's averages are added or copied (set_adds).
  for (const std::size_t s : bucket.slots) {
    const nn::ParameterSlot& slot = params_.slots()[s];
    for (const Part& p : parts) {
      const std::int64_t from = std::max(p.begin, slot.offset);
      const std::int64_t to = std::min(p.end, slot.offset + slot.numel);
      if (from >= to) continue;
      float* dst = shard_grads_.data() + p.local + (from - p.begin);
      const float* src = p.from + (from - p.begin);
      if (adds_[s] != 0) {
        backend.axpy(to - from, 1.0f, src, dst);
      } else if (dst != src) {
        backend.copy(dst, src, static_cast<std::size_t>(to - from) * sizeof(float));
      }
    }
  }
}

std::shared_ptr<Work> Zero::reduce_scatter(std::size_t b, const Bucket& bucket) {
  if (b == 0) buckets_scattered_ = 0;  // a new synchronized pass begins
  const Chunk& c = chunks_[b];
  Backend& backend = backend_for(params_.device());
  const bool bf16 = hook_ == CommHook::kBf16;
  // Some parameter adds to what the shard holds (zero.h, accumulation): the averages land in a
  // buffer of their own first.
  accumulating_[b] = std::any_of(bucket.slots.begin(), bucket.slots.end(),
                                 [&](std::size_t s) { return adds_[s] != 0; });
  // The bucket as it goes on the wire: float32, or the bf16 hook's compressed copy.
  if (bf16) {
    backend.f32_to_bf16(bucket.grads.data(), bf16_at(bucket.compressed, 0), c.numel);
  }
  const Tensor& wire = bf16 ? bucket.compressed : bucket.grads;
  if (world_ == 1) {
    // The whole bucket is this rank's chunk (the bf16 hook still rounds, as its all-reduce).
    if (bf16) {
      Tensor expanded = Tensor::empty({c.numel}, params_.device());
      backend.bf16_to_f32(bf16_at(bucket.compressed, 0), expanded.data(), c.numel);
      land(b, bucket, expanded.data(), nullptr);
    } else {
      land(b, bucket, bucket.grads.data(), nullptr);
    }
    return completed_work("local copy");  // one rank alone: a copy, done at "launch"
  }
  // Block r of the first W*q elements is rank r's chunk: reduced straight into this rank's
  // shard, the bucket itself the input (nothing copied); when accumulating, into a buffer of
  // its own first (bucket_scattered adds it).
  Tensor out;
  if (bf16) {
    out = shard_grads_bf16_.view(c.local, {c.q});
  } else if (accumulating_[b] != 0) {
    incoming_[b] = Tensor::empty({c.q}, params_.device());
    out = incoming_[b];
  } else {
    out = shard_grads_.view(c.local, {c.q});
  }
  std::shared_ptr<Work> scatter =
      group_->reduce_scatter(wire.view(0, {c.q * world_}), out, ReduceOp::kAvg);
  if (c.tail == 0) return scatter;
  // The < W left-over elements: averaged in place; the last rank keeps them (bucket_scattered).
  Tensor tail = wire.view(c.q * world_, {c.tail});
  return std::make_shared<BucketWork>(std::move(scatter), group_->allreduce(tail, ReduceOp::kAvg));
}

void Zero::bucket_scattered(std::size_t b, const Bucket& bucket) {
  ++buckets_scattered_;
  if (world_ == 1) return;
  const Chunk& c = chunks_[b];
  Backend& backend = backend_for(params_.device());
  const bool bf16 = hook_ == CommHook::kBf16;
  // The averages as float32: where the reduce-scatter put them, or expanded from bf16.
  const float* main = nullptr;
  Tensor main_f32, tail_f32;
  if (bf16) {
    main_f32 = Tensor::empty({std::max<std::int64_t>(c.q, 1)}, params_.device());
    backend.bf16_to_f32(bf16_at(shard_grads_bf16_, c.local), main_f32.data(), c.q);
    main = main_f32.data();
  } else {
    main = accumulating_[b] != 0 ? incoming_[b].data() : shard_grads_.data() + c.local;
  }
  const float* tail = nullptr;
  if (c.own > c.q) {  // the last rank: the left-over elements, all-reduced in place
    const std::int64_t at = c.q * world_;
    if (bf16) {
      tail_f32 = Tensor::empty({c.tail}, params_.device());
      backend.bf16_to_f32(bf16_at(bucket.compressed, at), tail_f32.data(), c.tail);
      tail = tail_f32.data();
    } else {
      tail = bucket.grads.data() + at;
    }
  }
  land(b, bucket, main, tail);
  incoming_[b] = Tensor();
}

void Zero::gradient_memory_changed(std::int64_t bytes) {
  bucket_bytes_ += bytes;
  bucket_bytes_peak_ = std::max(bucket_bytes_peak_, bucket_bytes_);
}

const Tensor& Zero::averaged_gradients() const {
  return stage_ == 2 ? shard_grads_ : params_.grads();
}

std::vector<std::shared_ptr<Work>> Zero::launch_gather(const Chunk& c, const float* own,
                                                       Tensor& full) {
  Backend& backend = backend_for(params_.device());
  std::vector<std::shared_ptr<Work>> works;
  // A chunk lies in `full` as an all-gather's output does: the W blocks of q elements in rank
  // order (then the tail). So it is gathered in place, in one collective: this rank's block is
  // put where it belongs (the parameters' already is), and the others arrive around it.
  if (c.q > 0) {
    float* place = full.data() + c.offset + rank_ * c.q;
    if (own != place) backend.copy(place, own, static_cast<std::size_t>(c.q) * sizeof(float));
    Tensor in = full.view(c.offset + rank_ * c.q, {c.q});
    Tensor out = full.view(c.offset, {c.q * world_});
    works.push_back(group_->allgather(in, out));
  }
  if (c.tail > 0) {
    // The left-over elements, from the last rank.
    float* tail = full.data() + c.offset + c.q * world_;
    if (rank_ == world_ - 1 && own + c.q != tail) {
      backend.copy(tail, own + c.q, static_cast<std::size_t>(c.tail) * sizeof(float));
    }
    Tensor tail_view = full.view(c.offset + c.q * world_, {c.tail});
    works.push_back(group_->broadcast(tail_view, world_ - 1));
  }
  return works;
}

template <typename Mine>
void Zero::all_gather(Mine mine, Tensor& full) {
  // In the agreed order: with the overlap the ranks may have learned different orders.
  for (const std::size_t b : gather_order_) {
    const Chunk& c = chunks_[b];
    for (const std::shared_ptr<Work>& work : launch_gather(c, mine(c), full)) work->wait();
  }
}

void Zero::propose_gather_order(std::vector<std::size_t> order) {
  std::vector<char> seen(chunks_.size(), 0);
  for (const std::size_t b : order) seen.at(b) += 1;
  NANODDP_CHECK(order.size() == chunks_.size() &&
                    std::all_of(seen.begin(), seen.end(), [](char n) { return n == 1; }),
                "a gather order must name every bucket once");
  proposal_ = std::move(order);
  launch_async_ = true;
}

Zero::GatherTimes Zero::take_gather_times() {
  const std::lock_guard lock(pending_mutex_);
  return std::exchange(gather_times_, GatherTimes{});
}

std::uint64_t Zero::launches() const {
  const std::lock_guard lock(pending_mutex_);
  return launches_;
}

bool Zero::gathering(std::size_t b) const {
  const std::lock_guard lock(pending_mutex_);
  return !pending_.at(b).empty();
}

std::vector<std::size_t> Zero::buckets_touching(std::int64_t offset, std::int64_t numel) const {
  std::vector<std::size_t> out;
  for (std::size_t b = 0; b < chunks_.size(); ++b) {
    const Chunk& c = chunks_[b];
    if (c.offset < offset + numel && offset < c.offset + c.numel) out.push_back(b);
  }
  return out;
}

void Zero::wait_for_bucket(std::size_t b, bool in_forward) {
  const std::lock_guard lock(pending_mutex_);
  std::vector<std::shared_ptr<Work>>& works = pending_.at(b);
  if (works.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  {
    TraceSpan span("wait for all-gather", TraceTrack::kCompute, params_.device());
    for (const std::shared_ptr<Work>& work : works) work->wait();
  }
  const double waited =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (in_forward) gather_times_.in_forward_ms += waited;
  // The collectives' own time, where the group measured it (they ran while the host computed),
  // and in a trace each bucket's gather where it ran, beside the forward.
  double comm = 0;
  Tracer* const tracer = active_tracer();
  for (const std::shared_ptr<Work>& work : works) {
    const std::optional<WorkTiming> t = work->timing();
    if (!t) {
      comm = waited;
      break;
    }
    comm += std::chrono::duration<double, std::milli>(t->end - t->start).count();
    if (tracer != nullptr) {
      tracer->span(fmt::format("all-gather bucket {}", b), TraceTrack::kCommunication, t->start,
                   t->end, {{"elements", std::to_string(chunks_[b].numel)}});
    }
  }
  gather_times_.comm_ms += comm;
  works.clear();
}

void Zero::wait_for_parameters() {
  for (const std::size_t b : gather_order_) wait_for_bucket(b, /*in_forward=*/false);
}

Zero::~Zero() {
  // The collectives in flight write into the parameters: never leave them running.
  for (std::vector<std::shared_ptr<Work>>& works : pending_) {
    for (const std::shared_ptr<Work>& work : works) {
      try {
        work->wait();
      } catch (...) {  // the group reports its failure elsewhere; a destructor cannot throw
      }
    }
  }
}

void Zero::step() {
  // Gathers still in flight from the last step (its forward never ran, or threw) write the
  // parameters the optimizer is about to update.
  wait_for_parameters();
  // Stage 2's averaged gradients exist only as the shard the last synchronized backward left.
  // Without one since the last step (a backward that bypassed DDP's forward, or only no_sync
  // passes) the shard still holds the previous step's averages: applying them again would be a
  // silently wrong step.
  if (stage_ == 2 && buckets_scattered_ < chunks_.size()) {
    fail(
        "ZeRO stage 2: step() without a synchronized backward since the last step ({} of {} "
        "buckets reduce-scattered): the gradient shard would be stale. Run the step's last "
        "backward through DistributedDataParallel::forward, outside no_sync",
        buckets_scattered_, chunks_.size());
  }
  buckets_scattered_ = 0;
  optimizer_.step_shard();  // this rank's chunks only (nn::Optimizer::shard)
  if (world_ == 1) return;
  // Communication, not optimizer work: traced on the communication track and timed for the
  // trainer's comm_ms (an outside tester found it booked as optimizer time).
  if (overlap_ && !order_agreed_) {
    // The gathers must pair up in the same order on every rank, and each rank learned its own
    // plan (a branch one rank took in its first forward, a module order that differed): rank
    // 0's order goes to all, once (bucket indices are exact in float32).
    std::vector<float> order(chunks_.size());
    const std::vector<std::size_t>& mine = proposal_.empty() ? gather_order_ : proposal_;
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<float>(mine[i]);
    Tensor agreed =
        Tensor::from_vector(order, {static_cast<std::int64_t>(order.size())}, params_.device());
    group_->broadcast(agreed, 0)->wait();
    const std::vector<float> root = agreed.to_vector();
    for (std::size_t i = 0; i < root.size(); ++i) {
      gather_order_[i] = static_cast<std::size_t>(root[i]);
    }
    order_agreed_ = true;
  }
  const auto start = std::chrono::steady_clock::now();
  Tensor values = params_.values();
  auto own = [&](const Chunk& c) { return values.data() + c.offset + rank_ * c.q; };
  if (overlap_ && launch_async_) {
    // Launched in the order the forward reads them; each is waited for before the first module
    // that reads it (zero_overlap.h).
    TraceSpan span("launch all-gathers", TraceTrack::kCommunication, params_.device());
    const std::lock_guard lock(pending_mutex_);
    for (const std::size_t b : gather_order_)
      pending_[b] = launch_gather(chunks_[b], own(chunks_[b]), values);
    ++launches_;
  } else {
    TraceSpan span("all-gather parameters", TraceTrack::kCommunication, params_.device());
    all_gather(own, values);
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!(overlap_ && launch_async_)) {
    const std::lock_guard lock(pending_mutex_);
    gather_times_.after_step_ms += ms;
    gather_times_.comm_ms += ms;
  }
}

std::vector<nn::NamedTensor> Zero::full_optimizer_state() {
  wait_for_parameters();  // its collectives would queue behind them; the caller reads both
  std::vector<nn::NamedTensor> full;
  for (const nn::NamedTensor& s : optimizer_.state()) {
    Tensor whole = Tensor::zeros({params_.numel()}, params_.device());
    if (world_ == 1) {
      for (const Chunk& c : chunks_) {
        if (c.numel > 0)
          whole.view(c.offset, {c.numel}).copy_from(s.tensor.view(c.local, {c.numel}));
      }
    } else {
      all_gather([&](const Chunk& c) { return s.tensor.data() + c.local; }, whole);
    }
    full.push_back({s.name, whole});
  }
  return full;
}

ZeroMemory Zero::memory() const {
  return {.parameter_bytes = bytes(params_.values()),
          .gradient_bytes =
              stage_ == 2 ? bucket_bytes_peak_ + bytes(shard_grads_) + bytes(shard_grads_bf16_)
                          : bytes(params_.grads()),
          .averaged_gradient_bytes = stage_ == 2 ? bytes(shard_grads_) : bytes(params_.grads()),
          .optimizer_state_bytes = optimizer_.state_bytes()};
}

std::string Zero::describe() const {
  const ZeroMemory m = memory();
  // Under stage 2 the bucket buffers come and go during backward: not counted until one ran.
  const std::string gradients =
      stage_ == 2 && bucket_bytes_peak_ == 0
          ? fmt::format(
                "gradients {} B (the averaged shard; during backward also at most two "
                "buckets' buffers)",
                m.gradient_bytes)
          : fmt::format("gradients {} B (averaged {} B)", m.gradient_bytes,
                        m.averaged_gradient_bytes);
  return fmt::format(
      "ZeRO stage {}: rank {} of {} owns {} of {} elements ({} buckets); parameters {} B, {}, "
      "optimizer state {} B",
      stage_, rank_, world_, shard_numel_, params_.numel(), chunks_.size(), m.parameter_bytes,
      gradients, m.optimizer_state_bytes);
}

}  // namespace nanoddp::comm
