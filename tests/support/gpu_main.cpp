// Entry point of the GPU test executable: without a usable CUDA device it says why and exits
// with 77, which ctest shows as "Skipped" (SKIP_RETURN_CODE), so a CPU-only run is visibly
// not a pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "nanoddp/engine/cuda_device.h"

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA
// A test that must see a process die (a kernel fault) runs this executable again as its child,
// with NANODDP_GPU_TEST_CHILD naming what the child does (tests/comm/test_nccl_gpu.cpp).
int nccl_kernel_fault_child();
int fresh_thread_device_child();
#endif

int main(int argc, char** argv) {
#if NANODDP_WITH_CUDA
  if (const char* child = std::getenv("NANODDP_GPU_TEST_CHILD"); child != nullptr) {
    if (std::string_view(child) == "kernel-fault") return nccl_kernel_fault_child();
    if (std::string_view(child) == "fresh-thread-device") return fresh_thread_device_child();
    std::fprintf(stderr, "unknown NANODDP_GPU_TEST_CHILD '%s'\n", child);
    return 2;
  }
#endif
  if (nanoddp::cuda_device_count() == 0) {
    std::printf("SKIPPED: GPU tests need a CUDA device: %s\n", nanoddp::cuda_status().c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
