// The fuzzers' inputs through the plain library (no libFuzzer needed): every file in
// fuzz/corpus/<target>/ and fuzz/regressions/<target>/ (inputs that once crashed a fuzz target,
// see scripts/fuzz.sh) must either parse or be refused with nanoddp::Error, never crash. Under
// scripts/test-sanitizers.sh this also checks them for out-of-bounds reads and UB.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nanoddp/comm/store_protocol.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/npy.h"
#include "nanoddp/nn/safetensors.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> fuzz_inputs(const std::string& target) {
  const char* source = std::getenv("NANODDP_SOURCE_DIR");
  REQUIRE_MESSAGE(source != nullptr, "NANODDP_SOURCE_DIR is not set (run the tests with ctest)");
  std::vector<fs::path> files;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(source) / "fuzz" / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  return files;
}

std::vector<std::byte> bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) bytes[i] = static_cast<std::byte>(chars[i]);
  return bytes;
}

}  // namespace

TEST_CASE("fuzz inputs: .npy files parse or fail with nanoddp::Error") {
  const auto files = fuzz_inputs("npy");
  CHECK(!files.empty());
  for (const fs::path& file : files) {
    CAPTURE(file.string());
    try {
      const auto array = nanoddp::nn::parse_npy(bytes_of(file), file.string());
      CHECK(static_cast<std::size_t>(array.numel()) == array.data.size());
    } catch (const nanoddp::Error&) {
    }
  }
}

TEST_CASE("fuzz inputs: safetensors files parse or fail with nanoddp::Error") {
  const auto files = fuzz_inputs("safetensors");
  CHECK(!files.empty());
  for (const fs::path& file : files) {
    CAPTURE(file.string());
    try {
      const auto st = nanoddp::nn::parse_safetensors(bytes_of(file), file);
      for (const std::string& name : st.names()) {
        const auto& tensor = st.at(name);
        (void)nanoddp::nn::checksum(tensor.bytes.data(), tensor.bytes.size());
        if (tensor.dtype == "F32" || tensor.dtype == "F64" || tensor.dtype == "F16" ||
            tensor.dtype == "BF16") {
          CHECK(st.to_f32(name).size() == static_cast<std::size_t>(tensor.numel()));
        }
      }
    } catch (const nanoddp::Error&) {
    }
  }
}

TEST_CASE("fuzz inputs: store protocol messages decode without crashing") {
  namespace proto = nanoddp::comm::protocol;
  const auto files = fuzz_inputs("store_protocol");
  CHECK(!files.empty());
  for (const fs::path& file : files) {
    CAPTURE(file.string());
    const std::vector<std::byte> raw = bytes_of(file);
    std::vector<std::uint8_t> bytes(raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i) bytes[i] = std::to_integer<std::uint8_t>(raw[i]);
    // As in fuzz/store_protocol_fuzzer.cpp, the first byte picks the decoder; here every decoder
    // sees the rest, with the default limits.
    const std::span<const std::uint8_t> rest =
        bytes.empty() ? std::span<const std::uint8_t>() : std::span(bytes).subspan(1);
    const auto request = proto::decode_request(rest);
    CHECK(request.consumed <= rest.size());
    CHECK(proto::decode_hello(rest).consumed <= rest.size());
    CHECK(proto::decode_hello_reply(rest).consumed <= rest.size());
    for (int op = 1; op <= 7; ++op) {
      CHECK(proto::decode_response(static_cast<proto::Opcode>(op), rest).consumed <= rest.size());
    }
  }
}
