#pragma once
// What this process knows about CUDA, without ever crashing on a machine that has no GPU.

#include <string>

#include "nanoddp/engine/device.h"

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

// Copies between any two devices (host<->device via cudaMemcpy, synchronous for the host).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t nbytes);

}  // namespace nanoddp
