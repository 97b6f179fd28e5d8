// What this process knows about CUDA (engine/cuda_device.h), for the CUDA build. Nothing here
// may throw or abort on a machine without a GPU: cudaGetDeviceCount then returns an error code
// (cudaErrorNoDevice, or cudaErrorInsufficientDriver without a driver), which becomes "0
// devices" plus an explanation that the caller can show.

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "nanoddp/engine/cuda/device_guard.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/stream_cpu.h"
#include "nanoddp/kernels/cuda/check.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {
namespace {

struct CudaProbe {
  int count = 0;
  cudaError_t error = cudaSuccess;
};

// The device count cannot change while the process runs, so ask once.
const CudaProbe& probe() {
  static const CudaProbe result = [] {
    CudaProbe p;
    p.error = cudaGetDeviceCount(&p.count);
    if (p.error != cudaSuccess) {
      p.count = 0;
      // The failed call leaves its error in the runtime's last-error slot, where a later, unrelated
      // NANODDP_CUDA_CHECK_LAUNCH() would pick it up. Clear it.
      (void)cudaGetLastError();
    }
    return p;
  }();
  return result;
}

// CUDA_VISIBLE_DEVICES, when set, decides what the runtime sees: "-1" or "" hides every device,
// and the runtime's own error then names the driver or "no device", not the variable.
std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return "";
  return fmt::format(
      " (CUDA_VISIBLE_DEVICES='{}' is set: the runtime sees only the devices it "
      "lists; unset it or list a device)",
      visible);
}

std::string probe_failure() {
  const CudaProbe& p = probe();
  if (p.error != cudaSuccess) {
    return fmt::format("cudaGetDeviceCount returned {} ({}){}", cudaGetErrorName(p.error),
                       cudaGetErrorString(p.error), visible_devices_note());
  }
  return "cudaGetDeviceCount found 0 devices" + visible_devices_note();
}

}  // namespace

namespace detail {

bool cuda_primary_context_active(int index) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  // Looked up once; the runtime hands out the driver's entry point without linking libcuda.
  static const GetState get_state = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetState>(fn);
  }();
  if (get_state == nullptr) return true;
  unsigned int flags = 0;
  int active = 0;
  // A runtime device index is the driver's device ordinal (both count the visible devices).
  if (get_state(static_cast<CUdevice>(index), &flags, &active) != CUDA_SUCCESS) return true;
  return active != 0;
}

}  // namespace detail

bool built_with_cuda() {
  return true;
}

int cuda_device_count() {
  return probe().count;
}

std::string cuda_status() {
  const int count = cuda_device_count();
  if (count == 0) return "no CUDA device: " + probe_failure();
  std::string text = fmt::format("{} CUDA device{}:", count, count == 1 ? "" : "s");
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    std::memset(&prop, 0, sizeof(prop));
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      text += fmt::format(" cuda:{} (properties unavailable)", i);
      continue;
    }
    text += fmt::format("{} cuda:{} {} (sm_{}{}, {:.0f} GiB)", i == 0 ? "" : ",", i, prop.name,
                        prop.major, prop.minor,
                        static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  }
  return text;
}

void require_device(Device device) {
  if (device.is_cpu()) return;
  const std::string name = detail::device_name(device);
  const int count = cuda_device_count();
  if (count == 0) {
    fail("device {} needs a CUDA device, but {}. Use the CPU device instead.", name,
         probe_failure());
  }
  if (device.index < 0 || device.index >= count) {
    fail(
        "device {} does not exist: this machine has {} CUDA device{} (cuda:0{}). Pick one of "
        "those or the CPU.{}",
        name, count, count == 1 ? "" : "s",
        count == 1 ? std::string() : fmt::format(" .. cuda:{}", count - 1), visible_devices_note());
  }
}

void set_current_device(Device device) {
  require_device(device);
  if (device.is_cpu()) return;
  NANODDP_CUDA_CHECK(cudaSetDevice(device.index));
}

// Copies are ordered after the work already enqueued on the devices' compute streams (which are
// non-blocking streams: a plain cudaMemcpy on the legacy default stream would NOT wait for
// them), and the host waits for the copy to finish.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  require_device(dst_device);
  require_device(src_device);
  const HostSyncPoint sync("copy_bytes");
  note_device_op("copy_bytes");
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    // Across GPUs: first let the destination device finish what it is doing with dst, then copy
    // on the source device's stream (NVLink/PCIe peer copy, staged by the driver when peer
    // access is off).
    Stream::compute(dst_device).synchronize();
    const Stream src_stream = Stream::compute(src_device);
    detail::CudaDeviceGuard guard(src_device.index);
    auto* stream = static_cast<cudaStream_t>(src_stream.native());
    NANODDP_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream));
    NANODDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  const cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                              : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToDevice;
  const Stream stream_handle = Stream::compute(gpu);
  detail::CudaDeviceGuard guard(gpu.index);
  auto* stream = static_cast<cudaStream_t>(stream_handle.native());
  NANODDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
  NANODDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace nanoddp

namespace nanoddp {

PinnedBuffer::PinnedBuffer(std::size_t nbytes) : size_(nbytes) {
  if (nbytes == 0) return;
  // Portable: usable by every device's context, whichever is current when it is made.
  if (cuda_device_count() > 0 &&
      cudaHostAlloc(&data_, nbytes, cudaHostAllocPortable) == cudaSuccess) {
    pinned_ = true;
    return;
  }
  (void)cudaGetLastError();
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
  other.pinned_ = false;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    pinned_ = other.pinned_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.pinned_ = false;
  }
  return *this;
}

void PinnedBuffer::release() {
  if (data_ == nullptr) return;
  if (pinned_) {
    if (cudaFreeHost(data_) != cudaSuccess) (void)cudaGetLastError();
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

void upload_async(void* dst, Device device, const void* src, std::size_t nbytes) {
  if (device.is_cpu()) {
    if (nbytes != 0) std::memcpy(dst, src, nbytes);
    return;
  }
  upload_async_on(Stream::compute(device), dst, src, nbytes);
}

void upload_async_on(const Stream& stream, void* dst, const void* src, std::size_t nbytes) {
  if (nbytes == 0) return;
  const Device device = stream.device();
  if (device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  require_device(device);
  note_device_op("upload_async");
  detail::CudaDeviceGuard guard(device.index);
  NANODDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice,
                                     static_cast<cudaStream_t>(stream.native())));
}

}  // namespace nanoddp
