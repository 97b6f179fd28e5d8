#pragma once
// Every CUDA and cuBLAS call goes through one of these macros: a failure becomes a CudaError that
// names the call, the error and where it happened, instead of a silent wrong answer later.
// Include only from .cu files and host files compiled with the CUDA toolkit on the include path.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "nanoddp/kernels/error.h"

#include <stdexcept>
#include <string>

namespace nanoddp::kernels::cuda {

using ::nanoddp::CudaError;

[[noreturn]] void throw_cuda_error(const char* call, cudaError_t err, const char* file, int line);
[[noreturn]] void throw_cublas_error(const char* call, cublasStatus_t status, const char* file,
                                     int line);
const char* cublas_status_name(cublasStatus_t status);

}  // namespace nanoddp::kernels::cuda

#define NANODDP_CUDA_CHECK(call)                                                           \
  do {                                                                                     \
    const cudaError_t nanoddp_err_ = (call);                                               \
    if (nanoddp_err_ != cudaSuccess)                                                       \
      ::nanoddp::kernels::cuda::throw_cuda_error(#call, nanoddp_err_, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors are reported by cudaGetLastError. A
// cudaErrorNotReady left there by a query elsewhere on this thread (a library polling an event
// or stream, as NCCL's enqueue may) is an answer, not this launch's error: skipped, as PyTorch
// clears it after its own queries.
#define NANODDP_CUDA_CHECK_LAUNCH()                                                          \
  do {                                                                                       \
    const cudaError_t nanoddp_err_ = cudaGetLastError();                                     \
    if (nanoddp_err_ != cudaSuccess && nanoddp_err_ != cudaErrorNotReady)                    \
      ::nanoddp::kernels::cuda::throw_cuda_error("cudaGetLastError() after a kernel launch", \
                                                 nanoddp_err_, __FILE__, __LINE__);          \
  } while (0)

#define NANODDP_CUBLAS_CHECK(call)                                                              \
  do {                                                                                          \
    const cublasStatus_t nanoddp_status_ = (call);                                              \
    if (nanoddp_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::nanoddp::kernels::cuda::throw_cublas_error(#call, nanoddp_status_, __FILE__, __LINE__); \
  } while (0)
