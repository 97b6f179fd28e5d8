// The batch source: which samples each micro-batch holds, filled here or by the prefetcher, and
// on CUDA uploaded through pinned staging buffers on a stream of its own.
#include "trainer.h"

#include <fmt/format.h>

#include <algorithm>

#include "nanoddp/engine/cuda_device.h"
#include "trainer_internal.h"

namespace nanoddp::train {

void Trainer::resize_batch(std::int64_t rows) {
  const std::int64_t in = dataset_->in_features(), out = dataset_->out_features();
  if (device_.is_cpu()) {
    if (!x_.defined() || x_.size(0) != rows) {
      x_ = Tensor::empty({rows, in}, device_);
      y_ = classify() ? Tensor::empty({rows}, device_, DType::kI64)
                      : Tensor::empty({rows, out}, device_);
    }
  } else {
    next_device_batch(rows);
    next_staging_buffer();  // the caller writes the staging buffers next
    Staging& staging = staging_[staging_index_];
    const auto x_bytes = static_cast<std::size_t>(rows * in) * sizeof(float);
    // --task classify stages the int64 class indices themselves: they go up with the inputs,
    // on the upload stream, and the host never waits for them.
    const auto y_bytes = classify() ? static_cast<std::size_t>(rows) * sizeof(std::int64_t)
                                    : static_cast<std::size_t>(rows * out) * sizeof(float);
    if (staging.x.size() < x_bytes) staging.x = PinnedBuffer(x_bytes);
    if (staging.y.size() < y_bytes) staging.y = PinnedBuffer(y_bytes);
  }
}

// Called before a micro-batch's upload, when everything that reads the previous micro-batch
// has been enqueued on the compute stream: that buffer is free once the compute stream gets
// past this point (its `free` event), and this micro-batch takes the other buffer, last read by
// the micro-batch before, which the upload stream waits for.
void Trainer::next_device_batch(std::int64_t rows) {
  const Stream compute = Stream::compute(device_);
  if (upload_stream_.native() == nullptr) upload_stream_ = Stream::create(device_);
  DeviceBatch& previous = device_batches_[device_batch_index_];
  if (previous.used) {
    if (previous.free.device() != device_) previous.free = Event(device_);
    previous.free.record(compute);
  }
  device_batch_index_ = 1 - device_batch_index_;
  DeviceBatch& batch = device_batches_[device_batch_index_];
  if (!batch.x.defined() || batch.x.size(0) != rows) {
    batch.x = Tensor::empty({rows, dataset_->in_features()}, device_);
    batch.y = classify() ? Tensor::empty({rows}, device_, DType::kI64)
                         : Tensor::empty({rows, dataset_->out_features()}, device_);
    // New memory from the caching allocator may be a block that work already enqueued on the
    // compute stream still uses (blocks are handed out in compute-stream order): the upload
    // stream waits for all of it.
    if (batch.free.device() != device_) batch.free = Event(device_);
    batch.free.record(compute);
    batch.used = true;
  }
  if (batch.used) batch.free.block(upload_stream_);
  batch.used = true;
  x_ = batch.x;
  y_ = batch.y;
}

// The GPU copies a staging buffer after the host has moved on (upload_batch): the buffer is written
// again only once it has. The buffer taken was uploaded kStagingBuffers micro-batches ago, so this
// is usually an event query; the host waits (a counted synchronization) only when it has run
// that far ahead of the GPU, which is then busy, not idle.
void Trainer::next_staging_buffer() {
  staging_index_ = (staging_index_ + 1) % kStagingBuffers;
  Staging& staging = staging_[staging_index_];
  if (staging.busy && !staging.copied.query()) staging.copied.synchronize();
  staging.busy = false;
}

std::span<const std::int64_t> Trainer::lookahead_indices(std::int64_t g) {
  const std::int64_t step0 = g / o_.grad_accum;  // 0-based optimizer step
  const std::int64_t epoch = step0 / steps_per_epoch_;
  if (epoch != lookahead_epoch_) {
    lookahead_sampler_->set_epoch(epoch);
    lookahead_epoch_ = epoch;
  }
  return lookahead_sampler_->batch(first_micro_batch(step0 + 1) + g % o_.grad_accum, o_.batch);
}

std::string Trainer::data_description() const {
  const std::string order = o_.shuffle ? "shuffled" : "in order (--no-shuffle)";
  // The task is part of what the data is: the same files read as classes or as values differ.
  const std::string out =
      classify() ? fmt::format("{} classes", o_.classes) : std::to_string(dataset_->out_features());
  if (!o_.data_path.empty()) {
    return fmt::format(".npy data, {} samples x {} -> {}, {}, {}", dataset_->size(),
                       dataset_->in_features(), out, npy_checksums_, order);
  }
  return fmt::format("synthetic {}, {} samples x {} -> {}, --noise {} --teacher-hidden {}, {}",
                     classify() ? "classification" : "data", dataset_->size(),
                     dataset_->in_features(), out, o_.noise_std, o_.teacher_hidden, order);
}

std::int64_t Trainer::first_micro_batch(std::int64_t step) const {
  return ((step - 1) % steps_per_epoch_) * o_.grad_accum;
}

std::int64_t Trainer::micro_batches_in_step(std::int64_t step) const {
  return std::min<std::int64_t>(o_.grad_accum, micro_batches_per_epoch_ - first_micro_batch(step));
}

void Trainer::load_batch(std::int64_t step, std::int64_t m) {
  if (!prefetcher_) {
    fill_batch(first_micro_batch(step) + m);
    return;
  }
  const std::int64_t g = (step - 1) * o_.grad_accum + m;
  std::int64_t rows = 0;
  if (prefetched_ != g) {  // the first batch of the run: nothing was prefetched yet
    rows = static_cast<std::int64_t>(lookahead_indices(g).size());
    prefetcher_->start(lookahead_indices(g));
  } else {
    rows = prefetched_rows_;
  }
  resize_batch(rows);
  prefetcher_->take(device_.is_cpu() ? x_.data() : x_staging(), target_rows(rows));
  finish_targets(rows);
  if (!device_.is_cpu()) upload_batch();
  prefetched_ = -1;
  // The next micro-batch is filled while this one trains: the next of this step, or the first
  // of the next step (an epoch's last step may have fewer than --grad-accum).
  const std::int64_t next_g = m + 1 < micro_batches_in_step(step) ? g + 1 : step * o_.grad_accum;
  if (next_g < steps_ * o_.grad_accum) {
    const std::span<const std::int64_t> next = lookahead_indices(next_g);
    prefetched_rows_ = static_cast<std::int64_t>(next.size());
    prefetcher_->start(next);
    prefetched_ = next_g;
  }
}

void Trainer::fill_batch(std::int64_t micro_batch_in_epoch) {
  const std::span<const std::int64_t> indices = sampler_->batch(micro_batch_in_epoch, o_.batch);
  const auto rows = static_cast<std::int64_t>(indices.size());
  resize_batch(rows);
  dataset_->fill_batch(indices, device_.is_cpu() ? x_.data() : x_staging(), target_rows(rows));
  finish_targets(rows);
  if (!device_.is_cpu()) upload_batch();
}

float* Trainer::target_rows(std::int64_t rows) {
  if (classify()) {
    class_scratch_.resize(static_cast<std::size_t>(rows));
    return class_scratch_.data();
  }
  return device_.is_cpu() ? y_.data() : y_staging();
}

void Trainer::finish_targets(std::int64_t rows) {
  if (!classify()) return;
  auto* out =
      device_.is_cpu() ? y_.data_i64() : static_cast<std::int64_t*>(staging_[staging_index_].y.data());
  for (std::int64_t k = 0; k < rows; ++k) {
    out[k] = static_cast<std::int64_t>(class_scratch_[static_cast<std::size_t>(k)]);
  }
}

void Trainer::upload_batch() {
  // From pinned memory, on the upload stream: the host does not wait, and the copy overlaps
  // the compute stream's work on the micro-batch before; the forward pass waits for it there.
  Staging& staging = staging_[staging_index_];
  upload_async_on(upload_stream_, x_.raw_data(), staging.x.data(), x_.nbytes());
  upload_async_on(upload_stream_, y_.raw_data(), staging.y.data(), y_.nbytes());
  if (staging.copied.device() != device_) staging.copied = Event(device_);
  staging.copied.record(upload_stream_);
  staging.copied.block(Stream::compute(device_));
  staging.busy = true;
}

}  // namespace nanoddp::train
