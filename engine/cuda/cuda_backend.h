#pragma once
// The Backend (engine/backend.h) of CUDA device `index`: every kernel of kernels/cuda,
// enqueued on the device's compute stream, with a cuBLAS handle bound to that stream. Created on
// first use, one per device, and kept for the life of the process. Throws an Error (see
// require_device) when the device cannot be used. This header needs no CUDA headers.

#include "nanoddp/engine/backend.h"

namespace nanoddp {

Backend& cuda_backend(int index);

}  // namespace nanoddp
