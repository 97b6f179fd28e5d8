#pragma once
// Every NCCL call goes through NANODDP_NCCL_CHECK: a failure becomes a CommError naming the
// call, NCCL's error string, NCCL's last detailed message and where it happened.
// Internal to comm/cuda (needs nccl.h, a private include directory of the library).

#include <nccl.h>

#include "nanoddp/comm/process_group.h"

namespace nanoddp::comm {

[[noreturn]] void throw_nccl_error(const char* call, ncclResult_t result, const char* file,
                                   int line);

}  // namespace nanoddp::comm

// For blocking calls: anything but ncclSuccess is an error.
#define NANODDP_NCCL_CHECK(call)                                                          \
  do {                                                                                    \
    const ncclResult_t nanoddp_nccl_result_ = (call);                                     \
    if (nanoddp_nccl_result_ != ncclSuccess)                                              \
      ::nanoddp::comm::throw_nccl_error(#call, nanoddp_nccl_result_, __FILE__, __LINE__); \
  } while (0)

// For calls on a non-blocking communicator: ncclInProgress means "accepted, still working";
// the caller then polls ncclCommGetAsyncError (NcclProcessGroup::wait_ready).
#define NANODDP_NCCL_CHECK_ASYNC(call)                                                    \
  do {                                                                                    \
    const ncclResult_t nanoddp_nccl_result_ = (call);                                     \
    if (nanoddp_nccl_result_ != ncclSuccess && nanoddp_nccl_result_ != ncclInProgress)    \
      ::nanoddp::comm::throw_nccl_error(#call, nanoddp_nccl_result_, __FILE__, __LINE__); \
  } while (0)
