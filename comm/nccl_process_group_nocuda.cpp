// The NCCL process group without CUDA: the factory exists so that code selecting a backend at
// run time links everywhere, and says plainly why it cannot help.

#include "nanoddp/comm/process_group.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> /*store*/,
                                                      int /*rank*/, int /*size*/,
                                                      const ProcessGroupOptions& /*options*/) {
  fail(
      "the NCCL backend is not available: nanoddp was built without CUDA (configure with "
      "-DNANODDP_CUDA=ON on a machine with nvcc, or use the Gloo backend)");
}

}  // namespace nanoddp::comm
