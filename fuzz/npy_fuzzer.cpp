// libFuzzer target: the .npy reader (nn/npy.h), which loads training data given on the
// command line (--data X.npy). Any input must either parse or throw nanoddp::Error; anything
// else (a crash, an out-of-bounds read, another exception type) is a finding. A parsed array
// must hold exactly product(shape) elements.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const nanoddp::nn::NpyArray array = nanoddp::nn::parse_npy(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz.npy");
    if (static_cast<std::size_t>(array.numel()) != array.data.size()) {
      std::fprintf(stderr, "npy_fuzzer: shape and element count disagree\n");
      std::abort();
    }
    try {
      nanoddp::nn::check_finite(array, "fuzz.npy");
    } catch (const nanoddp::Error&) {
    }
  } catch (const nanoddp::Error&) {
    // A refused file: the expected outcome for most inputs.
  }
  return 0;
}
