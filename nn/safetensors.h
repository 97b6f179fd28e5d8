#pragma once
// The safetensors format (https://github.com/huggingface/safetensors), nanoddp's checkpoint
// format:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object {name: {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {string: string}},
//             padded with spaces to a multiple of 8 bytes
//   rest      the byte buffer; offsets are relative to its start
// Files written here load with safetensors.torch.load_file / safetensors.numpy.load_file.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nanoddp/nn/file_io.h"

namespace nanoddp::nn {

// One tensor to write. `data` holds product(shape) elements of `dtype`, little-endian.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL", ...
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
};

using SafetensorsMetadata = std::map<std::string, std::string, std::less<>>;

// Bytes per element of a safetensors dtype name; throws nanoddp::Error for an unknown name.
std::size_t safetensors_dtype_size(std::string_view dtype);

// Writes the tensors and metadata atomically (temporary file in the same directory, write,
// fsync, rename, fsync the directory). The data are laid out like the reference writer does:
// by decreasing element size, then by name (the reference writer sorts by dtype, then name), so
// that every tensor is aligned to its element size (the buffer starts at a multiple of 8). Throws
// nanoddp::Error for duplicate or empty names, an unknown dtype, a negative dimension, and for I/O
// errors (naming the path and the system's reason, e.g. "No space left on device"). Returns
// which file it made (write_file_atomically).
FileIdentity write_safetensors(const std::filesystem::path& path,
                               std::span<const SafetensorsEntry> entries,
                               const SafetensorsMetadata& metadata = {});

// A tensor inside a loaded file: a view into the file's bytes.
struct SafetensorsTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;

  std::int64_t numel() const;
};

// A whole safetensors file in memory. The tensors' byte spans point into this object's buffer:
// they stay valid while it lives and across moves; copying is disabled so they cannot dangle.
class SafetensorsFile {
 public:
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // Tensor names in lexicographic order.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // nullptr when absent.
  const SafetensorsTensor* find(std::string_view name) const;
  // Throws nanoddp::Error naming the file and the tensors it does hold when `name` is absent.
  const SafetensorsTensor& at(std::string_view name) const;
  // Copies tensor `name` into `out` as float32, converting from F32, BF16, F16 or F64. Throws
  // when the tensor is absent, has another dtype, or out.size() differs from its element count.
  void copy_to_f32(std::string_view name, std::span<float> out) const;
  std::vector<float> to_f32(std::string_view name) const;
  // The metadata value for `key`; throws naming the file and the key when absent.
  const std::string& metadata_at(std::string_view key) const;

 private:
  friend SafetensorsFile parse_safetensors(std::vector<std::byte> bytes,
                                           const std::filesystem::path& name);
  SafetensorsFile() = default;

  std::filesystem::path path_;
  std::vector<std::byte> bytes_;
  std::map<std::string, SafetensorsTensor, std::less<>> tensors_;
  SafetensorsMetadata metadata_;
};

// Reads and validates a whole file: the header length is bounded (100 MB, like the reference
// reader) and fits the file, the header is a JSON object, each entry has a known dtype,
// non-negative shape and offsets inside the buffer with end - begin == numel * dtype size, the
// entries tile the buffer exactly (contiguous, non-overlapping, no trailing bytes), and
// "__metadata__" maps strings to strings. Any violation throws nanoddp::Error naming the file.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

// The same validation over bytes already in memory (read_safetensors reads the file and calls
// this); `name` stands for the file in messages and is what path() returns. The fuzz target
// (fuzz/safetensors_fuzzer.cpp) drives this entry point.
SafetensorsFile parse_safetensors(std::vector<std::byte> bytes, const std::filesystem::path& name);

// The "__metadata__" of a file, reading only its header (not the tensors): the header is checked
// as read_safetensors checks it (length, nesting, JSON, string values); the tensors are not.
SafetensorsMetadata read_safetensors_metadata(const std::filesystem::path& path);

// Each tensor's shape, reading only the header: what a file holds can be checked before its
// body (which may be gigabytes) is read. A file shorter than its header's offsets say is refused
// (truncated); the entries are not otherwise validated.
std::map<std::string, std::vector<std::int64_t>> read_safetensors_shapes(
    const std::filesystem::path& path);

// ---- checksums ----------------------------------------------------------------------------
// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3), over bytes in order.
// Chosen because it is tiny, specified in a few lines, and reproducible anywhere (in Python:
//   h = 0xcbf29ce484222325; for b in data: h = ((h ^ b) * 0x100000001b3) % 2**64).
// It detects corruption (truncation, flipped bits), not tampering. It streams: passing the
// previous result as `state` continues the hash, so checksum(b, nb, checksum(a, na)) equals the
// checksum of a followed by b. Speed is about 1 GB/s (one multiply per byte).
inline constexpr std::uint64_t kChecksumInit = 0xcbf29ce484222325ull;
std::uint64_t checksum(const void* data, std::size_t size, std::uint64_t state = kChecksumInit);
// 16 lower-case hex digits, the form to store in metadata.
std::string checksum_hex(std::uint64_t value);

}  // namespace nanoddp::nn
