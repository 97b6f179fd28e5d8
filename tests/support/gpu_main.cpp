// Entry point of the GPU test executable: without a usable CUDA device it says why and exits
// with 77, which ctest shows as "Skipped" (SKIP_RETURN_CODE), so a CPU-only run is visibly
// not a pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "nanoddp/engine/cuda_device.h"

int main(int argc, char** argv) {
  if (nanoddp::cuda_device_count() == 0) {
    std::printf("SKIPPED: GPU tests need a CUDA device: %s\n", nanoddp::cuda_status().c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
