#pragma once
// The raw device-memory pair under the CUDA caching allocator (engine/allocator.h). Both act on
// the *current* device, which the caller sets (cudaSetDevice) before calling. cuda_raw_allocate
// throws (naming the size and the free memory) when cudaMalloc fails, for example when the
// device is out of memory. Without a CUDA build both throw an Error. No CUDA headers needed.

#include <cstddef>

namespace nanoddp {

void* cuda_raw_allocate(std::size_t nbytes);
void cuda_raw_free(void* ptr);

}  // namespace nanoddp
