#include "nanoddp/engine/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "nanoddp/engine/allocator.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    // A wrapped product would make a huge tensor look small (or empty) while its sizes stay
    // huge, and ops that trust the sizes would run past its storage.
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      fail("shape {} has no valid element count (a negative size, or more than 2^63 elements)",
           shape_str(shape));
    }
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- Storage ------------------------------------------------------------------------------

Storage::Storage(Device device, std::size_t nbytes)
    : device_(device), nbytes_(nbytes), data_(allocator_for(device).allocate(nbytes)) {}

Storage::~Storage() {
  allocator_for(device_).deallocate(data_, nbytes_);
}

// ---- factories ----------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype) {
  for (std::int64_t d : shape) {
    if (d < 0) fail("cannot create a tensor of shape {}: negative size", shape_str(shape));
  }
  const std::int64_t numel = shape_numel(shape);
  if (numel >
      std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(dtype_size(dtype))) {
    fail("cannot create a tensor of shape {}: {} elements do not fit in memory", shape_str(shape),
         numel);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(device, static_cast<std::size_t>(numel) * dtype_size(dtype));
  impl->version = std::make_shared<std::atomic<std::uint64_t>>(0);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, Device device) {
  return full(shape, 0.0f, device);
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor t = empty(shape, device);
  t.fill(value);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, float lo, float hi, RandomStream rng, Device device) {
  Tensor t = empty(shape, device);
  backend_for(device).fill_uniform(t.data(), t.numel(), rng.seed, rng.stream, rng.offset, lo, hi);
  return t;
}

Tensor Tensor::normal(const Shape& shape, float mean, float stddev, RandomStream rng,
                      Device device) {
  Tensor t = empty(shape, device);
  backend_for(device).fill_normal(t.data(), t.numel(), rng.seed, rng.stream, rng.offset, mean,
                                  stddev);
  return t;
}

Tensor Tensor::from_vector(std::span<const float> values, const Shape& shape, Device device) {
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape)) {
    fail("from_vector: {} values do not fill shape {} ({} elements)", values.size(),
         shape_str(shape), shape_numel(shape));
  }
  Tensor t = empty(shape, device);
  const HostSyncPoint sync("Tensor::from_vector");  // a pageable upload: the host waits
  copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}

Tensor Tensor::from_int64(std::span<const std::int64_t> values, const Shape& shape, Device device) {
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape)) {
    fail("from_int64: {} values do not fill shape {} ({} elements)", values.size(),
         shape_str(shape), shape_numel(shape));
  }
  Tensor t = empty(shape, device, DType::kI64);
  const HostSyncPoint sync("Tensor::from_int64");
  copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}

// ---- metadata -----------------------------------------------------------------------------

namespace {
// Metadata of an undefined tensor (a default-constructed Tensor, the grad() of a parameter that
// has none) is an error, not a null dereference: every use of such a tensor reads it first.
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  if (!impl) {
    fail(
        "use of an undefined tensor (a default-constructed Tensor, or a gradient that is not "
        "there: grad() of a parameter without one, or a released gradient buffer)");
  }
  return *impl;
}
}  // namespace

const Shape& Tensor::shape() const {
  return checked(impl_).shape;
}

std::int64_t Tensor::size(std::int64_t d) const {
  const std::int64_t n = dim();
  if (d < 0) d += n;
  NANODDP_CHECK(d >= 0 && d < n, "dimension {} out of range for a {}-d tensor", d, n);
  return impl_->shape[static_cast<std::size_t>(d)];
}

std::int64_t Tensor::numel() const {
  return shape_numel(checked(impl_).shape);
}
DType Tensor::dtype() const {
  return checked(impl_).dtype;
}
Device Tensor::device() const {
  return checked(impl_).storage->device();
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl_->storage;
}
std::int64_t Tensor::storage_offset() const {
  return impl_->offset;
}

// ---- data ---------------------------------------------------------------------------------

void* Tensor::raw_data() const {
  NANODDP_CHECK(defined(), "use of an undefined tensor");
  return static_cast<char*>(impl_->storage->data()) +
         static_cast<std::size_t>(impl_->offset) * dtype_size(impl_->dtype);
}

float* Tensor::data() const {
  NANODDP_CHECK(defined() && dtype() == DType::kF32, "data(): expected a float32 tensor");
  return static_cast<float*>(raw_data());
}

std::vector<float> Tensor::to_vector() const {
  NANODDP_CHECK(dtype() == DType::kF32, "to_vector(): expected a float32 tensor");
  notify_tensor_access(*this, /*before=*/true);
  std::vector<float> values(static_cast<std::size_t>(numel()));
  const HostSyncPoint sync("Tensor::to_vector");
  if (device().is_cuda()) backend_for(device()).stream().synchronize();
  copy_bytes(values.data(), Device::cpu(), raw_data(), device(), nbytes());
  return values;
}

std::int64_t* Tensor::data_i64() const {
  NANODDP_CHECK(defined() && dtype() == DType::kI64, "data_i64(): expected an int64 tensor");
  return static_cast<std::int64_t*>(raw_data());
}

std::vector<std::int64_t> Tensor::to_int64_vector() const {
  NANODDP_CHECK(dtype() == DType::kI64, "to_int64_vector(): expected an int64 tensor");
  std::vector<std::int64_t> values(static_cast<std::size_t>(numel()));
  const HostSyncPoint sync("Tensor::to_int64_vector");
  if (device().is_cuda()) backend_for(device()).stream().synchronize();
  copy_bytes(values.data(), Device::cpu(), raw_data(), device(), nbytes());
  return values;
}

float Tensor::item() const {
  if (numel() != 1)
    fail("item(): tensor of shape {} has {} elements, not 1", shape_str(shape()), numel());
  return to_vector()[0];
}

namespace {

// Whether an op on `t` is recorded by autograd (the same test as `record`'s).
bool records_grad(const Tensor& t) {
  return NoGrad::grad_enabled() && t.requires_grad();
}

// `shape` elements of `t`'s storage from `offset` elements after its start, checked against the
// storage; no autograd history (the views that ops and backward functions make of buffers).
Tensor alias(const Tensor& t, std::int64_t offset, const Shape& shape) {
  const TensorImpl& in = *t.impl();
  const std::int64_t storage_elements =
      static_cast<std::int64_t>(in.storage->nbytes() / dtype_size(in.dtype));
  const std::int64_t begin = in.offset + offset;
  for (std::int64_t d : shape) {
    if (d < 0) fail("cannot view a tensor as shape {}: negative size", shape_str(shape));
  }
  if (offset < 0 || begin > storage_elements || shape_numel(shape) > storage_elements - begin) {
    fail("view of shape {} at offset {} does not fit in a storage of {} elements", shape_str(shape),
         begin, storage_elements);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = in.storage;
  impl->version = in.version;  // a view's writes are its base's, and the other way round
  impl->base_version = in.base_version;
  impl->offset = begin;
  impl->shape = shape;
  impl->dtype = in.dtype;
  return Tensor(std::move(impl));
}

// dst = src (same shape and dtype, any devices), with no autograd checks.
void copy_values(const Tensor& dst, const Tensor& source) {
  if (source.shape() != dst.shape() || source.dtype() != dst.dtype()) {
    fail("copy_from: source {} {} does not match destination {} {}", shape_str(source.shape()),
         dtype_name(source.dtype()), shape_str(dst.shape()), dtype_name(dst.dtype()));
  }
  notify_tensor_access(source, /*before=*/true);
  notify_tensor_access(dst, /*before=*/true);
  if (dst.device() == source.device()) {
    if (dst.storage() == source.storage() && dst.nbytes() != 0) {
      // Two views of one buffer: a copy onto itself is nothing to do, and a partial overlap has
      // no defined result (memcpy and cudaMemcpy both forbid it).
      if (dst.storage_offset() == source.storage_offset()) return;
      const std::int64_t lo = std::min(dst.storage_offset(), source.storage_offset());
      const std::int64_t hi = std::max(dst.storage_offset(), source.storage_offset());
      if (hi < lo + dst.numel()) {
        fail(
            "copy_from: source and destination overlap in one storage (elements {} and {}, {} "
            "each); copy through a clone()",
            source.storage_offset(), dst.storage_offset(), dst.numel());
      }
    }
    backend_for(dst.device()).copy(dst.raw_data(), source.raw_data(), dst.nbytes());
    return;
  }
  // Across devices: finish pending work on the source's stream first.
  const HostSyncPoint sync("Tensor::copy_from across devices");
  if (source.device().is_cuda()) backend_for(source.device()).stream().synchronize();
  copy_bytes(dst.raw_data(), dst.device(), source.raw_data(), source.device(), dst.nbytes());
}

// An in-place write has no backward here (it is not an op autograd records; the version
// counters only notice that a saved tensor changed), so, like PyTorch for a leaf, it is refused
// while autograd records.
void check_not_recorded(const char* op, const Tensor& dst) {
  if (!records_grad(dst)) return;
  fail(
      "{}: in-place write into a tensor that requires a gradient ({}); this write is not "
      "differentiable. Do it under NoGrad (as loading parameters or an optimizer step does), "
      "or compute a new tensor with the differentiable ops instead",
      op, dst.is_leaf() ? "a leaf, e.g. a parameter" : "it was computed by differentiable ops");
}

}  // namespace

Tensor Tensor::view(std::int64_t offset, const Shape& shape) const {
  Tensor out = alias(*this, offset, shape);
  if (!records_grad(*this)) return out;
  const std::int64_t n = out.numel();
  if (offset + n > numel()) {
    fail(
        "view: elements [{}, {}) of a tensor of {} elements reach outside it; such a view is "
        "not differentiable (its gradient would belong to storage outside the tensor). Take it "
        "from detach() or under NoGrad",
        offset, offset + n, numel());
  }
  // The gradient is g on the viewed elements and zero elsewhere.
  return record("view", out, {*this}, [offset, n](const Tensor& g, GradSink& sink) {
    sink.accumulate(0, [&](Tensor& dx, float beta) {
      Backend& be = backend_for(g.device());
      if (beta == 0.0f) be.fill(dx.data(), dx.numel(), 0.0f);
      be.axpy(n, 1.0f, g.data(), dx.data() + offset);
    });
  });
}

Tensor Tensor::reshape(const Shape& requested) const {
  // One -1 stands for whatever the other dimensions leave (PyTorch's reshape(-1, n)).
  Shape shape = requested;
  const auto unknown = std::find(shape.begin(), shape.end(), std::int64_t{-1});
  if (unknown != shape.end() &&
      std::find(unknown + 1, shape.end(), std::int64_t{-1}) == shape.end()) {
    *unknown = 1;
    const std::int64_t known = shape_numel(shape);
    *unknown = known != 0 && numel() % known == 0 ? numel() / known : -1;
  }
  const bool negative =
      std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; });
  if (negative || shape_numel(shape) != numel()) {
    fail("cannot reshape a tensor of shape {} ({} elements) to {}{}", shape_str(this->shape()),
         numel(), shape_str(requested),
         negative ? "" : fmt::format(" ({} elements)", shape_numel(shape)));
  }
  return record("reshape", alias(*this, 0, shape), {*this},
                [in_shape = this->shape()](const Tensor& g, GradSink& sink) {
                  sink.emit(0, alias(g, 0, in_shape));
                });
}

Tensor Tensor::to(Device device) const {
  Tensor out = empty(shape(), device, dtype());
  copy_values(out, *this);
  // The gradient goes back to the input's device.
  return record(device == this->device() ? "clone" : "to", out, {*this},
                [from = this->device()](const Tensor& g, GradSink& sink) {
                  if (g.device() == from) {
                    sink.emit(0, g);
                    return;
                  }
                  Tensor dx = Tensor::empty(g.shape(), from, g.dtype());
                  copy_values(dx, g);
                  sink.emit(0, dx);
                });
}

Tensor Tensor::clone() const {
  return to(device());
}

void Tensor::copy_from(const Tensor& source) {
  check_not_recorded("copy_from", *this);
  if (records_grad(source)) {
    fail(
        "copy_from: the source requires a gradient, but a copy into an existing tensor is not "
        "recorded by autograd; use source.clone() or source.to(device) (both differentiable), "
        "or copy from source.detach()");
  }
  copy_values(*this, source);
  increment_version();
}

void Tensor::fill(float value) {
  check_not_recorded("fill", *this);
  notify_tensor_access(*this, /*before=*/true);
  backend_for(device()).fill(data(), numel(), value);
  increment_version();
}

void Tensor::zero() {
  check_not_recorded("zero", *this);
  notify_tensor_access(*this, /*before=*/true);
  backend_for(device()).fill(data(), numel(), 0.0f);
  increment_version();
}

std::uint64_t Tensor::version() const {
  // Both counters only grow, so the sum moves exactly when one of them does.
  const std::uint64_t own = impl_->version->load(std::memory_order_relaxed);
  return impl_->base_version ? own + impl_->base_version->load(std::memory_order_relaxed) : own;
}

void Tensor::increment_version() const {
  impl_->version->fetch_add(1, std::memory_order_relaxed);
}

void Tensor::set_data(const Tensor& source) {
  if (source.shape() != shape()) {
    fail("set_data: new data has shape {} but the tensor has shape {}", shape_str(source.shape()),
         shape_str(shape()));
  }
  if (requires_grad() && source.dtype() != DType::kF32) {
    fail("set_data: new data is {}, but a tensor that requires a gradient must be float32",
         dtype_name(source.dtype()));
  }
  impl_->storage = source.impl_->storage;
  impl_->offset = source.impl_->offset;
  impl_->dtype = source.impl_->dtype;
  // Writes through `source`'s buffer now reach this tensor: counted for it too. Its own counter
  // stays its own, so that a write into one parameter of a flat buffer (the optimizer in
  // backward) does not count for the others.
  impl_->base_version = source.impl_->version;
}

// ---- autograd -----------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  return impl_->autograd.requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  NANODDP_CHECK(is_leaf() || requires_grad, "only leaf tensors can stop requiring a gradient");
  if (requires_grad && dtype() != DType::kF32) {
    fail("set_requires_grad: the tensor is {}, but gradients are computed in float32 only",
         dtype_name(dtype()));
  }
  impl_->autograd.requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  return impl_->autograd.grad_fn == nullptr;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const {
  return impl_->autograd.grad_fn;
}

void Tensor::set_grad_fn(std::shared_ptr<Node> node) {
  impl_->autograd.grad_fn = std::move(node);
  impl_->autograd.requires_grad = true;
}

Tensor Tensor::grad() const {
  const AutogradMeta& meta = impl_->autograd;
  return meta.grad_valid ? meta.grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.shape() != shape() || grad.device() != device()) {
    fail("set_grad: gradient {} on {} does not match tensor {} on {}", shape_str(grad.shape()),
         grad.device().str(), shape_str(shape()), device().str());
  }
  impl_->autograd.grad = grad;
  impl_->autograd.grad_valid = true;
}

void Tensor::zero_grad() {
  impl_->autograd.grad_valid = false;
}
bool Tensor::has_grad() const {
  return impl_->autograd.grad_valid;
}

void Tensor::release_grad() {
  impl_->autograd.grad = Tensor();
  impl_->autograd.grad_valid = false;
}

void Tensor::drop_grad_buffer() {
  impl_->autograd.grad = Tensor();
}

void Tensor::set_grad_source(GradSource source) {
  NANODDP_CHECK(is_leaf(), "a grad source is for leaf tensors");
  impl_->autograd.grad_source = std::move(source);
}

HookHandle Tensor::register_post_accumulate_grad_hook(Hook hook) {
  NANODDP_CHECK(is_leaf() && requires_grad(),
                "post-accumulate-grad hooks are for leaf tensors that require a gradient");
  AutogradMeta& meta = impl_->autograd;
  NANODDP_CHECK(!meta.running_hooks,
                "a post-accumulate-grad hook cannot register hooks on the tensor it runs for");
  const std::uint64_t id = meta.next_hook_id++;
  meta.post_accumulate_grad_hooks.push_back({id, std::move(hook)});
  return HookHandle(impl_, id);
}

std::size_t Tensor::post_accumulate_grad_hook_count() const {
  return impl_->autograd.post_accumulate_grad_hooks.size();
}

void HookHandle::remove() {
  const std::shared_ptr<TensorImpl> tensor = tensor_.lock();
  if (!tensor) return;
  NANODDP_CHECK(!tensor->autograd.running_hooks,
                "a post-accumulate-grad hook cannot remove hooks of the tensor it runs for");
  std::erase_if(tensor->autograd.post_accumulate_grad_hooks,
                [this](const AutogradMeta::IdentifiedHook& h) { return h.id == id_; });
  tensor_.reset();
}

void HookHandle::remove_quietly() noexcept {
  try {
    remove();
  } catch (...) {
  }
}

Tensor& Tensor::set_name(std::string name) {
  impl_->autograd.name = std::move(name);
  return *this;
}

const std::string& Tensor::name() const {
  return impl_->autograd.name;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->version = impl_->version;
  impl->base_version = impl_->base_version;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

void Tensor::backward() const {
  run_backward(*this);
}

// ---- grad mode ----------------------------------------------------------------------------

namespace {
thread_local bool tls_grad_enabled = true;
}

NoGrad::NoGrad() : previous_(tls_grad_enabled) {
  tls_grad_enabled = false;
}
NoGrad::~NoGrad() {
  tls_grad_enabled = previous_;
}
bool NoGrad::grad_enabled() {
  return tls_grad_enabled;
}

}  // namespace nanoddp
