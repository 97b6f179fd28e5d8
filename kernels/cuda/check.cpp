// The slow path of the check macros: build one message that names the failed call, the error's
// enum name and description, and the source location, then throw.

#include "nanoddp/kernels/cuda/check.h"

#include <string>

namespace nanoddp::kernels::cuda {

void throw_cuda_error(const char* call, cudaError_t err, const char* file, int line) {
  // Kernel launch errors are "sticky" only for device faults; a plain API error stays in the
  // last-error slot. Clear it so that a caller who catches this sees clean state afterwards.
  (void)cudaGetLastError();
  throw CudaError(std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_<unknown>";
}

void throw_cublas_error(const char* call, cublasStatus_t status, const char* file, int line) {
  throw CudaError(std::string(call) + " failed: " + cublas_status_name(status) + " (" +
                  std::to_string(static_cast<int>(status)) + ") at " + file + ":" +
                  std::to_string(line));
}

}  // namespace nanoddp::kernels::cuda
