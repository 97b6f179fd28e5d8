#pragma once
// Tensor: a cheap, shared handle to (storage, offset, shape, dtype, device) plus autograd state.
//
// Tensors are dense and row-major ("contiguous"); there are no strides. A view is the same
// storage at another offset with its own shape: that is all a gradient needs to live inside a
// DDP bucket's flat buffer, or a parameter inside the model's flat parameter buffer.
//
// Copying a Tensor copies the handle, not the data (like torch.Tensor in Python): two handles
// to one tensor see each other's in-place updates and autograd state.

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nanoddp/engine/device.h"
#include "nanoddp/engine/dtype.h"

namespace nanoddp {

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

// Owns one allocation from a device's caching allocator; returns it to the cache when the
// last tensor using it goes away.
class Storage {
 public:
  Storage(Device device, std::size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Device device_;
  std::size_t nbytes_;
  void* data_;
};

// Where random numbers come from: the Philox stream `stream` under key `seed`, starting at
// counter `offset` (see kernels/philox.h). A Generator hands out one fresh stream per tensor,
// so initialising layer 3 never depends on how many numbers layers 1 and 2 drew.
struct RandomStream {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
  std::uint64_t offset = 0;
};

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : seed_(seed) {}
  RandomStream next() { return RandomStream{.seed = seed_, .stream = next_stream_++}; }
  std::uint64_t seed() const { return seed_; }

 private:
  std::uint64_t seed_;
  std::uint64_t next_stream_ = 0;
};

class Node;
struct TensorImpl;
class HookHandle;

class Tensor {
 public:
  using Hook = std::function<void(Tensor& param)>;

  Tensor() = default;

  // ---- factories ----
  static Tensor empty(const Shape& shape, Device device = Device::cpu(), DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, Device device = Device::cpu()) {
    return full(shape, 1.0f, device);
  }
  static Tensor uniform(const Shape& shape, float lo, float hi, RandomStream rng,
                        Device device = Device::cpu());
  static Tensor normal(const Shape& shape, float mean, float stddev, RandomStream rng,
                       Device device = Device::cpu());
  static Tensor from_vector(std::span<const float> values, const Shape& shape,
                            Device device = Device::cpu());
  // int64 values (class indices): a tensor that never carries a gradient.
  static Tensor from_int64(std::span<const std::int64_t> values, const Shape& shape,
                           Device device = Device::cpu());
  static Tensor empty_like(const Tensor& other) {
    return empty(other.shape(), other.device(), other.dtype());
  }

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const;
  DType dtype() const;
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;
  std::int64_t storage_offset() const;  // in elements
  // Two handles to the same tensor (not merely equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- data ----
  void* raw_data() const;
  float* data() const;                   // float32 tensors only
  std::vector<float> to_vector() const;  // copies to the host
  std::int64_t* data_i64() const;        // int64 tensors only
  std::vector<std::int64_t> to_int64_vector() const;
  float item() const;  // one-element tensors only

  // Every op below that returns a tensor computed from this one is differentiable (recorded by
  // autograd like the ops in ops.h); the in-place writes are not, and refuse a tensor that
  // requires a gradient while autograd records (PyTorch refuses in-place writes into leaves).
  //
  // A tensor over `shape` elements of this tensor's storage, starting `offset` elements after
  // this tensor's start. No copy: writes through either are seen by both. Its gradient flows
  // back into those elements; a view that reaches past this tensor's own elements (into the
  // rest of a flat buffer) is an Error while autograd records.
  Tensor view(std::int64_t offset, const Shape& shape) const;
  // Same elements, new shape (a view); one dimension may be -1, inferred from the others.
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const { return reshape(shape); }  // PyTorch's view(shape)
  Tensor to(Device device) const;  // a copy on `device`; the gradient goes back
  Tensor clone() const;
  // In-place writes: refused (Error) into a tensor that requires a gradient, and copy_from also
  // from one, unless under NoGrad.
  void copy_from(const Tensor& source);  // same shape, any devices
  void fill(float value);
  void zero();
  // Rebinds this tensor (every handle to it) to `source`'s storage and offset, keeping
  // autograd state and its version: how parameters are moved into a flat buffer (PyTorch's
  // `p.data = ...`).
  void set_data(const Tensor& source);
  // How many in-place writes this tensor's data has had (PyTorch's `_version`), counted by
  // copy_from, fill, zero, backward's writes into a gradient and the optimizers' steps, shared
  // with its views and detach()ed handles; a write through the buffer set_data() moved it into
  // (FlatParameters' values()) counts too. An op that saves a tensor for backward notes it;
  // backward refuses a saved tensor whose count has moved since (engine/autograd.h,
  // SavedTensor): its gradient would come from values the forward never saw.
  std::uint64_t version() const;
  // Counts one in-place write the library does not see: one made through data() or raw_data(),
  // or by a kernel of one's own (PyTorch's torch.autograd.graph.increment_version).
  void increment_version() const;

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);  // float32 tensors only
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  void set_grad_fn(std::shared_ptr<Node> node);
  // The accumulated gradient of a leaf (undefined before the first backward, or after
  // zero_grad()).
  Tensor grad() const;
  // Gives the leaf a gradient buffer to accumulate into, e.g. a view into a flat buffer. The
  // buffer's contents are taken as the current gradient.
  void set_grad(const Tensor& grad);
  // Forgets the gradient without freeing its buffer: the next backward overwrites the buffer
  // (beta = 0) instead of adding to it, so zeroing costs no pass over memory.
  void zero_grad();
  bool has_grad() const;
  // Drops the gradient and its buffer (PyTorch's `p.grad = None`): has_grad() is false, and the
  // next backward writes into a buffer from the grad source below, or a new one.
  void release_grad();
  // Drops the buffer only: the gradient lives on elsewhere (ZeRO-2's shard of the averages), so
  // has_grad() stays as it was (zero_grad() still clears it) while grad() is undefined.
  void drop_grad_buffer();
  // Where a leaf's gradient buffer comes from when it has none: called by autograd just before
  // it writes the leaf's first gradient after release_grad() or drop_grad_buffer() (or ever);
  // returns a tensor of the leaf's shape and device. Its contents are what autograd adds to when
  // has_grad() (zeros, for a gradient that lives elsewhere), else stale. ZeRO-2 hands out
  // gradient memory one bucket at a time this way (comm/reducer.h). Empty: a new buffer.
  using GradSource = std::function<Tensor()>;
  void set_grad_source(GradSource source);
  // Runs after this leaf's gradient for the current backward is complete (all contributions
  // accumulated). The DDP Reducer's entry point. The handle removes the hook (PyTorch's
  // RemovableHandle); dropping the handle keeps it.
  HookHandle register_post_accumulate_grad_hook(Hook hook);
  std::size_t post_accumulate_grad_hook_count() const;
  // A name for timelines: a traced backward marks "grad <name>" when this leaf's gradient is
  // final (nn::FlatParameters names every parameter).
  Tensor& set_name(std::string name);
  const std::string& name() const;
  // A handle to the same data with no autograd history.
  Tensor detach() const;
  // Backpropagates from this one-element tensor (d self / d self = 1).
  void backward() const;

  // For the autograd engine.
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Removes the hook it was returned for (PyTorch's torch.utils.hooks.RemovableHandle). remove()
// is idempotent and does nothing once the tensor is gone; the destructor does not remove. A hook
// cannot remove hooks of the tensor it runs for (an error).
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<TensorImpl> tensor, std::uint64_t id)
      : tensor_(std::move(tensor)), id_(id) {}
  void remove();
  // For destructors: removes if it can and never throws (a hook that outlives its owner
  // must then do nothing by itself, e.g. through a weak handle).
  void remove_quietly() noexcept;

 private:
  std::weak_ptr<TensorImpl> tensor_;
  std::uint64_t id_ = 0;
};

// Autograd state of a tensor; leaves keep their gradient and hooks here.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;   // null for leaves
  Tensor grad;                     // buffer of a leaf's gradient
  bool grad_valid = false;         // false: `grad`'s contents are stale (treated as zero)
  Tensor::GradSource grad_source;  // supplies `grad` when it is undefined (may be empty)
  struct IdentifiedHook {
    std::uint64_t id;
    Tensor::Hook hook;
  };
  std::vector<IdentifiedHook> post_accumulate_grad_hooks;
  std::uint64_t next_hook_id = 1;
  bool running_hooks = false;
  std::string name;  // a leaf's name for traces ("layers.0.weight"); may be empty
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  // Tensor::version(): one counter for a tensor, its views and detached handles. Not per
  // storage: the parameters are views of one flat buffer, and an update of one (the optimizer in
  // backward) must not invalidate another's saved value.
  std::shared_ptr<std::atomic<std::uint64_t>> version;
  // The counter of the buffer set_data moved the tensor into (FlatParameters' flat buffer), or
  // null: a write through that buffer counts for the tensor too, and version() is the sum of
  // both. Writes through the tensor count only for itself.
  std::shared_ptr<std::atomic<std::uint64_t>> base_version;
  std::int64_t offset = 0;  // elements
  Shape shape;
  DType dtype = DType::kF32;
  AutogradMeta autograd;
};

// Gradient recording is on by default; a NoGrad scope turns it off on this thread (evaluation,
// optimizer updates, in-place parameter surgery).
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;
  static bool grad_enabled();

 private:
  bool previous_;
};

}  // namespace nanoddp
