// engine/cuda_device.h for a build without CUDA (NANODDP_CUDA=OFF): there are no CUDA devices,
// and asking for one says how to get them.

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
      "--device {} needs a CUDA device, but {}. Rebuild with -DNANODDP_CUDA=ON on a machine with "
      "the CUDA toolkit, or use --device cpu.",
      detail::device_name(device), cuda_status());
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t nbytes) {
  require_device(dst_device);
  require_device(src_device);
  if (nbytes != 0) std::memcpy(dst, src, nbytes);
}

}  // namespace nanoddp
