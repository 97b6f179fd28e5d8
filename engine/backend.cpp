#include "nanoddp/engine/backend.h"

#include "nanoddp/config.h"
#include "nanoddp/engine/cpu_backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"
#if NANODDP_WITH_CUDA
#include "nanoddp/engine/cuda/cuda_backend.h"
#endif

namespace nanoddp {

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu_backend();
  require_device(device);
#if NANODDP_WITH_CUDA
  return cuda_backend(device.index);
#else
  fail("{}: this nanoddp was built without CUDA", device.str());
#endif
}

}  // namespace nanoddp
