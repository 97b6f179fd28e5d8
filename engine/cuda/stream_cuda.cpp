// Streams and events (engine/stream.h) for the CUDA build: CUDA devices use cudaStream_t and
// cudaEvent_t; the CPU keeps its thread-and-timestamp meaning (engine/stream_cpu.h).

#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "nanoddp/engine/cuda/device_guard.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/stream_cpu.h"
#include "nanoddp/kernels/cuda/check.h"

namespace nanoddp {
namespace {

cudaStream_t native_stream(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native());
}

cudaEvent_t native_event(void* handle) {
  return static_cast<cudaEvent_t>(handle);
}

}  // namespace

// ---- Stream --------------------------------------------------------------------------------

Stream Stream::compute(Device device) {
  if (device.is_cpu()) return Stream(Device::cpu(), nullptr);
  require_device(device);
  // One compute stream per device, created on first use and never destroyed: it lives as long as
  // the process, and destroying streams during static destruction (after the CUDA runtime may
  // already have shut down) would be a crash waiting to happen.
  //
  // It is a *non-blocking* stream: it does not synchronize with the legacy default stream, so a
  // library that uses stream 0 behind our back cannot serialize our kernels (and copies must be
  // enqueued on this stream explicitly, see copy_bytes).
  static std::mutex mutex;
  static auto* streams = new std::unordered_map<int, std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams->find(device.index);
  if (it == streams->end()) {
    detail::CudaDeviceGuard guard(device.index);
    cudaStream_t stream = nullptr;
    NANODDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // A no-op deleter: the stream is intentionally kept until the process ends.
    it = streams->emplace(device.index, std::shared_ptr<void>(stream, [](void*) {})).first;
  }
  return Stream(device, it->second);
}

Stream Stream::create(Device device, StreamPriority priority) {
  if (device.is_cpu()) return Stream(Device::cpu(), nullptr);
  require_device(device);
  detail::CudaDeviceGuard guard(device.index);
  // Priorities are "lower number = higher priority"; the range is [greatest, least], e.g.
  // [-5, 0] on Hopper. A high-priority communication stream gets its kernels (NCCL's) scheduled
  // ahead of queued compute kernels, so an all-reduce is not starved by the backward pass.
  int least = 0, greatest = 0;
  NANODDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int value = priority == StreamPriority::kHigh ? greatest : least;
  cudaStream_t stream = nullptr;
  NANODDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, value));
  const int index = device.index;
  return Stream(
      device, std::shared_ptr<void>(stream, [index](void* handle) {
        // Deleters must not throw (CudaDeviceGuard does, on a broken context, which
        // would end the program in std::terminate and hide the error being reported):
        // every return code here is read and dropped. cudaStreamDestroy returns at
        // once and the driver frees the stream after its pending work completes.
        int previous = -1;
        if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
        if (previous != index) (void)cudaSetDevice(index);
        if (cudaStreamDestroy(static_cast<cudaStream_t>(handle)) != cudaSuccess) {
          (void)cudaGetLastError();
        }
        // As CudaDeviceGuard: never open a context on the device restored.
        if (previous >= 0 && previous != index && detail::cuda_primary_context_active(previous)) {
          (void)cudaSetDevice(previous);
        }
        (void)cudaGetLastError();  // no failure here is the next launch's error
      }));
}

void Stream::synchronize() const {
  if (device_.is_cpu()) return;  // CPU work is already done when the call returns
  const HostSyncPoint sync("Stream::synchronize");
  detail::CudaDeviceGuard guard(device_.index);
  NANODDP_CUDA_CHECK(cudaStreamSynchronize(native_stream(*this)));
}

// ---- Event ---------------------------------------------------------------------------------

Event::Event(Device device) : device_(device) {
  if (device_.is_cpu()) return;
  require_device(device_);
  detail::CudaDeviceGuard guard(device_.index);
  // Default flags keep timing enabled, which elapsed_ms needs.
  cudaEvent_t event = nullptr;
  NANODDP_CUDA_CHECK(cudaEventCreate(&event));
  handle_ = event;
}

Event::~Event() {
  if (handle_ != nullptr) {
    if (cudaEventDestroy(native_event(handle_)) != cudaSuccess) (void)cudaGetLastError();
  }
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), handle_(other.handle_), cpu_time_(other.cpu_time_) {
  other.handle_ = nullptr;
  other.device_ = Device::cpu();
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) {
      if (cudaEventDestroy(native_event(handle_)) != cudaSuccess) (void)cudaGetLastError();
    }
    device_ = other.device_;
    handle_ = other.handle_;
    cpu_time_ = other.cpu_time_;
    other.handle_ = nullptr;
    other.device_ = Device::cpu();
  }
  return *this;
}

void Event::record(const Stream& stream) {
  NANODDP_CHECK(stream.device() == device_, "an event of {} cannot be recorded on a stream of {}",
                detail::device_name(device_), detail::device_name(stream.device()));
  if (device_.is_cpu()) {
    cpu_time_ = detail::cpu_event_now();
    return;
  }
  detail::CudaDeviceGuard guard(device_.index);
  NANODDP_CUDA_CHECK(cudaEventRecord(native_event(handle_), native_stream(stream)));
}

void Event::block(const Stream& stream) const {
  // A CPU event has already happened when record() returned: nothing to wait for.
  if (device_.is_cpu()) return;
  if (stream.device().is_cpu()) {
    // The CPU "stream" is the calling thread: waiting there means the host waits.
    synchronize();
    return;
  }
  // The GPU waits, the host does not. Works across devices too (the stream's device waits for
  // an event of another device).
  detail::CudaDeviceGuard guard(stream.device().index);
  NANODDP_CUDA_CHECK(cudaStreamWaitEvent(native_stream(stream), native_event(handle_), 0));
}

void Event::synchronize() const {
  if (device_.is_cpu()) return;
  const HostSyncPoint sync("Event::synchronize");
  NANODDP_CUDA_CHECK(cudaEventSynchronize(native_event(handle_)));
}

bool Event::query() const {
  if (device_.is_cpu()) return true;
  const cudaError_t err = cudaEventQuery(native_event(handle_));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  kernels::cuda::throw_cuda_error("cudaEventQuery", err, __FILE__, __LINE__);
}

double Event::elapsed_ms(const Event& later) const {
  NANODDP_CHECK(later.device_ == device_, "elapsed_ms between events of {} and {}",
                detail::device_name(device_), detail::device_name(later.device_));
  if (device_.is_cpu()) return detail::cpu_elapsed_ms(cpu_time_, later.cpu_time_);
  float ms = 0.0f;
  NANODDP_CUDA_CHECK(cudaEventElapsedTime(&ms, native_event(handle_), native_event(later.handle_)));
  return ms;
}

}  // namespace nanoddp
