// engine/cuda_device.h for a build without CUDA (NANODDP_CUDA=OFF): there are no CUDA devices,
// and asking for one says how to get them.

#include <cstdlib>
#include <cstring>
#include <string>

#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/stream_cpu.h"

namespace nanoddp {

bool built_with_cuda() {
  return false;
}

int cuda_device_count() {
  return 0;
}

std::string cuda_status() {
  return "this nanoddp was built without CUDA (NANODDP_CUDA=OFF)";
}

void require_device(Device device) {
  if (device.is_cpu()) return;
  fail(
      "device {} needs a CUDA device, but {}. Rebuild with -DNANODDP_CUDA=ON on a machine with "
      "the CUDA toolkit, or use the CPU device.",
      detail::device_name(device), cuda_status());
}

void set_current_device(Device device) {
  require_device(device);  // throws for CUDA devices
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t nbytes) {
  require_device(dst_device);
  require_device(src_device);
  if (nbytes != 0) std::memcpy(dst, src, nbytes);
}

}  // namespace nanoddp

namespace nanoddp {

PinnedBuffer::PinnedBuffer(std::size_t nbytes) : size_(nbytes) {
  if (nbytes == 0) return;
  data_ = std::malloc(nbytes);
  if (data_ == nullptr) fail("cannot allocate {} bytes of host memory", nbytes);
}

PinnedBuffer::~PinnedBuffer() {
  release();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), pinned_(other.pinned_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    pinned_ = other.pinned_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void PinnedBuffer::release() {
  std::free(data_);
  data_ = nullptr;
}

void upload_async(void* dst, Device device, const void* src, std::size_t nbytes) {
  require_device(device);  // throws for CUDA devices
  if (nbytes != 0) std::memcpy(dst, src, nbytes);
}

void upload_async_on(const Stream& stream, void* dst, const void* src, std::size_t nbytes) {
  upload_async(dst, stream.device(), src, nbytes);
}

}  // namespace nanoddp
