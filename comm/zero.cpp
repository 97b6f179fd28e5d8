#include "nanoddp/comm/zero.h"

#include <fmt/format.h>

#include <algorithm>

#include "nanoddp/engine/backend.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

// One rank alone: a reduce-scatter is a copy, done before it is "launched".
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
  std::exception_ptr error() override { return nullptr; }
  std::uint64_t sequence_number() const override { return 0; }
  const std::string& op_name() const override { return name_; }

 private:
  std::string name_ = "local copy";
};

std::int64_t bytes(const Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

std::uint16_t* bf16_at(const Tensor& t, std::int64_t offset) {
  return static_cast<std::uint16_t*>(t.raw_data()) + offset;
}

}  // namespace

int parse_zero_stage(const std::string& text) {
  if (text == "0" || text == "1" || text == "2") return text[0] - '0';
  fail("--zero {}: expected 0 (plain DDP), 1 (optimizer state sharded) or 2 (and gradients)", text);
}

ZeroMemory unsharded_memory(const nn::FlatParameters& params, const nn::Optimizer& optimizer) {
  return {.parameter_bytes = bytes(params.values()),
          .gradient_bytes = bytes(params.grads()),
          .averaged_gradient_bytes = bytes(params.grads()),
          .optimizer_state_bytes = optimizer.state_bytes()};
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
  // Rank r owns chunk r of every bucket; the chunks sit one after the other in the shard.
  std::int64_t max_chunk = 0;
  std::vector<nn::ShardRange> ranges;
  for (const Bucket& bucket : buckets) {
    NANODDP_CHECK(!bucket.packed, "ZeRO needs buckets that are contiguous runs of the flat buffer");
    Chunk c{.offset = bucket.offset, .numel = bucket.numel};
    c.chunk = (bucket.numel + world_ - 1) / world_;
    c.own = std::clamp<std::int64_t>(bucket.numel - rank_ * c.chunk, 0, c.chunk);
    c.local = shard_numel_;
    shard_numel_ += c.chunk;
    max_chunk = std::max(max_chunk, c.chunk);
    max_padded_ = std::max(max_padded_, c.chunk * world_);
    ranges.push_back({.offset = c.offset + rank_ * c.chunk, .numel = c.own, .local = c.local});
    chunks_.push_back(c);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const nn::ShardRange& a, const nn::ShardRange& b) { return a.offset < b.offset; });
  const Device device = params.device();
  if (stage_ == 2) {
    shard_grads_ = Tensor::zeros({shard_numel_}, device);
    if (hook_ == CommHook::kBf16)
      shard_grads_bf16_ = Tensor::empty({shard_numel_}, device, DType::kBF16);
  }
  zeros_ = Tensor::zeros({world_}, device);
  if (world_ > 1) {
    gather_in_ = Tensor::zeros({max_chunk}, device);
    gather_out_ = Tensor::empty({max_padded_}, device);
  }
  optimizer_.shard({.ranges = std::move(ranges),
                    .numel = shard_numel_,
                    .grads = stage_ == 2 ? shard_grads_ : Tensor()});
}

Tensor& Zero::staging(std::size_t slot, DType dtype) {
  Tensor& buffer = dtype == DType::kBF16 ? staging_bf16_[slot] : staging_[slot];
  if (!buffer.defined()) buffer = Tensor::empty({max_padded_}, params_.device(), dtype);
  return buffer;
}

std::shared_ptr<Work> Zero::reduce_scatter(std::size_t b, const Bucket& bucket) {
  const Chunk& c = chunks_[b];
  Backend& backend = backend_for(params_.device());
  Tensor out = shard_grads_.view(c.local, {c.chunk});
  const bool bf16 = hook_ == CommHook::kBf16;
  if (world_ == 1) {
    // The whole bucket is this rank's chunk; the bf16 hook still rounds, as its all-reduce would.
    if (bf16) {
      backend.f32_to_bf16(bucket.grads.data(), bf16_at(shard_grads_bf16_, c.local), c.numel);
      backend.bf16_to_f32(bf16_at(shard_grads_bf16_, c.local), out.data(), c.numel);
    } else {
      out.copy_from(bucket.grads);
    }
    return std::make_shared<DoneWork>();
  }
  const std::int64_t padded = c.chunk * world_;
  if (!bf16 && padded == c.numel) return group_->reduce_scatter(bucket.grads, out, ReduceOp::kAvg);
  // Uneven (or compressed): the bucket copied into a staging buffer of W whole chunks, padded
  // with zeros. The buffer two buckets back must be done with first.
  const std::size_t slot = b % 2;
  if (staging_work_[slot]) staging_work_[slot]->wait();
  Tensor& buffer = staging(slot, bf16 ? DType::kBF16 : DType::kF32);
  Tensor input = buffer.view(0, {padded});
  std::shared_ptr<Work> work;
  if (bf16) {
    backend.f32_to_bf16(bucket.grads.data(), bf16_at(buffer, 0), c.numel);
    backend.f32_to_bf16(zeros_.data(), bf16_at(buffer, c.numel), padded - c.numel);
    Tensor out_bf16 = shard_grads_bf16_.view(c.local, {c.chunk});
    work = group_->reduce_scatter(input, out_bf16, ReduceOp::kAvg);
  } else {
    backend.copy(buffer.data(), bucket.grads.data(), static_cast<std::size_t>(c.numel) * 4);
    backend.copy(buffer.data() + c.numel, zeros_.data(),
                 static_cast<std::size_t>(padded - c.numel) * 4);
    work = group_->reduce_scatter(input, out, ReduceOp::kAvg);
  }
  staging_work_[slot] = work;
  return work;
}

void Zero::bucket_scattered(std::size_t b) {
  if (hook_ != CommHook::kBf16 || world_ == 1) return;
  const Chunk& c = chunks_[b];
  backend_for(params_.device())
      .bf16_to_f32(bf16_at(shard_grads_bf16_, c.local), shard_grads_.data() + c.local, c.chunk);
}

const Tensor& Zero::averaged_gradients() const {
  return stage_ == 2 ? shard_grads_ : params_.grads();
}

void Zero::all_gather(const Tensor& shard, Tensor& full) {
  // Bucket by bucket through one staging pair: chunk r of the gathered W chunks is exactly
  // elements [r*c, (r+1)*c) of the bucket, so its first n elements are the bucket.
  Backend& backend = backend_for(params_.device());
  const bool flat_source = shard.numel() == full.numel() && shard.data() == full.data();
  for (const Chunk& c : chunks_) {
    if (c.numel == 0) continue;
    const float* mine =
        flat_source ? full.data() + c.offset + rank_ * c.chunk : shard.data() + c.local;
    if (c.own > 0) backend.copy(gather_in_.data(), mine, static_cast<std::size_t>(c.own) * 4);
    Tensor in = gather_in_.view(0, {c.chunk});
    Tensor out = gather_out_.view(0, {c.chunk * world_});
    group_->allgather(in, out)->wait();
    backend.copy(full.data() + c.offset, gather_out_.data(), static_cast<std::size_t>(c.numel) * 4);
  }
}

void Zero::step() {
  optimizer_.step();  // this rank's chunks only (nn::Optimizer::shard)
  if (world_ == 1) return;
  Tensor values = params_.values();
  all_gather(values, values);
}

std::vector<nn::NamedTensor> Zero::full_optimizer_state() {
  std::vector<nn::NamedTensor> full;
  for (const nn::NamedTensor& s : optimizer_.state()) {
    Tensor whole = Tensor::zeros({params_.numel()}, params_.device());
    if (world_ == 1) {
      for (const Chunk& c : chunks_) {
        if (c.numel > 0)
          whole.view(c.offset, {c.numel}).copy_from(s.tensor.view(c.local, {c.numel}));
      }
    } else {
      all_gather(s.tensor, whole);
    }
    full.push_back({s.name, whole});
  }
  return full;
}

ZeroMemory Zero::memory() const {
  std::int64_t gradients = bytes(params_.grads()) + bytes(shard_grads_) + bytes(shard_grads_bf16_);
  for (const Tensor& t : staging_) gradients += bytes(t);
  for (const Tensor& t : staging_bf16_) gradients += bytes(t);
  return {.parameter_bytes = bytes(params_.values()) + bytes(gather_in_) + bytes(gather_out_),
          .gradient_bytes = gradients,
          .averaged_gradient_bytes = stage_ == 2 ? bytes(shard_grads_) : bytes(params_.grads()),
          .optimizer_state_bytes = optimizer_.state_bytes()};
}

std::string Zero::describe() const {
  const ZeroMemory m = memory();
  return fmt::format(
      "ZeRO stage {}: rank {} of {} owns {} of {} elements ({} buckets); parameters {} B, "
      "gradients {} B (averaged {} B), optimizer state {} B",
      stage_, rank_, world_, shard_numel_, params_.numel(), chunks_.size(), m.parameter_bytes,
      m.gradient_bytes, m.averaged_gradient_bytes, m.optimizer_state_bytes);
}

}  // namespace nanoddp::comm
