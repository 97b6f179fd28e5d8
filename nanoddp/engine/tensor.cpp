#include "nanoddp/engine/tensor.h"

#include <cstring>
#include <limits>

#include "nanoddp/engine/allocator.h"
#include "nanoddp/engine/autograd.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/error.h"
#include "nanoddp/engine/host_sync.h"

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

// ---- metadata -----------------------------------------------------------------------------

const Shape& Tensor::shape() const {
  return impl_->shape;
}

std::int64_t Tensor::size(std::int64_t d) const {
  const std::int64_t n = dim();
  if (d < 0) d += n;
  NANODDP_CHECK(d >= 0 && d < n, "dimension {} out of range for a {}-d tensor", d, n);
  return impl_->shape[static_cast<std::size_t>(d)];
}

std::int64_t Tensor::numel() const {
  return shape_numel(impl_->shape);
}
DType Tensor::dtype() const {
  return impl_->dtype;
}
Device Tensor::device() const {
  return impl_->storage->device();
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
  std::vector<float> values(static_cast<std::size_t>(numel()));
  const HostSyncPoint sync("Tensor::to_vector");
  if (device().is_cuda()) backend_for(device()).stream().synchronize();
  copy_bytes(values.data(), Device::cpu(), raw_data(), device(), nbytes());
  return values;
}

float Tensor::item() const {
  if (numel() != 1)
    fail("item(): tensor of shape {} has {} elements, not 1", shape_str(shape()), numel());
  return to_vector()[0];
}

Tensor Tensor::view(std::int64_t offset, const Shape& shape) const {
  const std::int64_t storage_elements =
      static_cast<std::int64_t>(impl_->storage->nbytes() / dtype_size(impl_->dtype));
  const std::int64_t begin = impl_->offset + offset;
  for (std::int64_t d : shape) {
    if (d < 0) fail("cannot view a tensor as shape {}: negative size", shape_str(shape));
  }
  if (offset < 0 || begin > storage_elements || shape_numel(shape) > storage_elements - begin) {
    fail("view of shape {} at offset {} does not fit in a storage of {} elements", shape_str(shape),
         begin, storage_elements);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = begin;
  impl->shape = shape;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel()) {
    fail("cannot reshape a tensor of shape {} ({} elements) to {} ({} elements)",
         shape_str(this->shape()), numel(), shape_str(shape), shape_numel(shape));
  }
  return view(0, shape);
}

Tensor Tensor::to(Device device) const {
  Tensor out = empty(shape(), device, dtype());
  out.copy_from(*this);
  return out;
}

Tensor Tensor::clone() const {
  return to(device());
}

void Tensor::copy_from(const Tensor& source) {
  if (source.shape() != shape() || source.dtype() != dtype()) {
    fail("copy_from: source {} {} does not match destination {} {}", shape_str(source.shape()),
         dtype_name(source.dtype()), shape_str(shape()), dtype_name(dtype()));
  }
  if (device() == source.device()) {
    if (impl_->storage == source.impl_->storage && nbytes() != 0) {
      // Two views of one buffer: a copy onto itself is nothing to do, and a partial overlap has
      // no defined result (memcpy and cudaMemcpy both forbid it).
      if (impl_->offset == source.impl_->offset) return;
      const std::int64_t lo = std::min(impl_->offset, source.impl_->offset);
      const std::int64_t hi = std::max(impl_->offset, source.impl_->offset);
      if (hi < lo + numel()) {
        fail(
            "copy_from: source and destination overlap in one storage (elements {} and {}, {} "
            "each); copy through a clone()",
            source.impl_->offset, impl_->offset, numel());
      }
    }
    backend_for(device()).copy(raw_data(), source.raw_data(), nbytes());
    return;
  }
  // Across devices: finish pending work on the source's stream first.
  const HostSyncPoint sync("Tensor::copy_from across devices");
  if (source.device().is_cuda()) backend_for(source.device()).stream().synchronize();
  copy_bytes(raw_data(), device(), source.raw_data(), source.device(), nbytes());
}

void Tensor::fill(float value) {
  backend_for(device()).fill(data(), numel(), value);
}

void Tensor::set_data(const Tensor& source) {
  if (source.shape() != shape()) {
    fail("set_data: new data has shape {} but the tensor has shape {}", shape_str(source.shape()),
         shape_str(shape()));
  }
  impl_->storage = source.impl_->storage;
  impl_->offset = source.impl_->offset;
  impl_->dtype = source.impl_->dtype;
}

// ---- autograd -----------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  return impl_->autograd.requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  NANODDP_CHECK(is_leaf() || requires_grad, "only leaf tensors can stop requiring a gradient");
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

void Tensor::register_post_accumulate_grad_hook(Hook hook) {
  NANODDP_CHECK(is_leaf() && requires_grad(),
                "post-accumulate-grad hooks are for leaf tensors that require a gradient");
  impl_->autograd.post_accumulate_grad_hooks.push_back(std::move(hook));
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
