#pragma once
// What this process knows about CUDA, without ever crashing on a machine that has no GPU.

#include <cstddef>
#include <string>

#include "nanoddp/engine/device.h"
#include "nanoddp/engine/stream.h"

namespace nanoddp {

// True when this copy of nanoddp was built with the CUDA path.
bool built_with_cuda();
// Number of usable CUDA devices; 0 (never an exception) when there is no driver, no device or
// no CUDA build.
int cuda_device_count();
// A one-line explanation of the CUDA state, e.g. "no CUDA device: cudaGetDeviceCount returned
// cudaErrorNoDevice (no CUDA-capable device is detected)".
std::string cuda_status();
// Throws an Error saying why `device` cannot be used (no CUDA build, no GPU, index too large).
void require_device(Device device);

// Makes `device` the calling thread's current CUDA device (cudaSetDevice), for a process that
// works on one GPU: called first thing, before any stream, cuBLAS handle or allocation, so that
// none of them (and no CUDA context) lands on cuda:0 by default. A no-op for the CPU; throws an
// Error like require_device for a device that cannot be used.
void set_current_device(Device device);

// The device a process uses when asked for "cuda" without an index: cuda:(local_rank modulo
// the visible device count), as PyTorch users pick with torch.cuda.set_device(local_rank %
// torch.cuda.device_count()). With one visible device per task (srun --gpus-per-task=1, or
// CUDA_VISIBLE_DEVICES set per rank) every rank gets cuda:0; with 8 on a node, local ranks 0-7
// get cuda:0-7. `requested` is "cpu", "cuda" or "cuda:N" (parsed as Device::parse does); an
// explicit index is kept as given. A pure function: `visible_devices` is cuda_device_count()
// in real use; 0 (no GPU) leaves cuda:0, which require_device then explains.
struct DeviceChoice {
  Device device;
  std::string why;  // "local rank 5 modulo 4 visible CUDA devices", "requested"
};
DeviceChoice choose_device(const std::string& requested, int local_rank, int visible_devices);

// The last op this process enqueued on a CUDA device ("gemm", "adamw_step", ...; null before
// the first), for error messages: a kernel fault is reported by whichever CUDA call comes next,
// often the NCCL watchdog's, so the message names the op that was issued last. `op` must live
// for the whole process (a string literal). One relaxed atomic store: cheap enough per op.
void note_device_op(const char* op);
const char* last_device_op();

// Copies between any two devices (host<->device via cudaMemcpy, synchronous for the host).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t nbytes);

// Page-locked ("pinned") host memory: the source of uploads the host does not wait for. A copy
// from pageable memory has to be staged by the driver and makes the host wait; from pinned
// memory it is a DMA that the GPU's copy engine runs while the host goes on. Plain host memory
// in a build without CUDA, or on a machine without a usable GPU.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t nbytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool pinned() const { return pinned_; }

 private:
  void release();
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool pinned_ = false;
};

// Enqueues a copy of `nbytes` from host memory `src` (best a PinnedBuffer's) to `dst` on
// `device`'s compute stream and returns without waiting: kernels enqueued afterwards see the
// data. `src` must stay unchanged until the stream has passed the copy (record an Event after
// this call and wait for it before writing `src` again). On the CPU: a memcpy.
void upload_async(void* dst, Device device, const void* src, std::size_t nbytes);
// The same on `stream` (a stream of the device that owns `dst`, for example a copy stream whose
// uploads overlap the compute stream's work; the caller orders the two with events).
void upload_async_on(const Stream& stream, void* dst, const void* src, std::size_t nbytes);

}  // namespace nanoddp
