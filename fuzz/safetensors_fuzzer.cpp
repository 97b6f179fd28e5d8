// libFuzzer target: the safetensors reader (nn/safetensors.h), which loads checkpoints
// and weights that may come from anywhere. Any input must either parse or throw nanoddp::Error;
// anything else (a crash, an out-of-bounds read, another exception type) is a finding. A file
// that parses is also read back: every tensor's bytes are touched and converted when the dtype
// allows, so a span that points outside the buffer shows up under ASan.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(data[i]);
  try {
    const nanoddp::nn::SafetensorsFile file =
        nanoddp::nn::parse_safetensors(std::move(bytes), "fuzz.safetensors");
    volatile std::uint64_t sink = 0;
    for (const std::string& name : file.names()) {
      const nanoddp::nn::SafetensorsTensor& tensor = file.at(name);
      sink = sink + nanoddp::nn::checksum(tensor.bytes.data(), tensor.bytes.size());
      if (tensor.dtype == "F32" || tensor.dtype == "F64" || tensor.dtype == "F16" ||
          tensor.dtype == "BF16") {
        const std::vector<float> values = file.to_f32(name);
        for (float v : values) sink = sink + static_cast<std::uint64_t>(v != v);
      }
    }
  } catch (const nanoddp::Error&) {
    // A refused file: the expected outcome for most inputs.
  }
  return 0;
}
