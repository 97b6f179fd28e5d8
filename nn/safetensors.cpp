#include "nanoddp/nn/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/file_io.h"

static_assert(std::endian::native == std::endian::little,
              "the safetensors reader and writer assume a little-endian host");

namespace nanoddp::nn {
namespace {

// The reference implementation refuses headers above 100 MB; a corrupted length field would
// otherwise make us trust an absurd size.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
// A valid header nests 3 levels ({name: {"shape": [..]}}). Deeper input is refused before it is
// parsed: printing a value nested 100,000 levels deep (json::dump recurses) overflowed the stack.
constexpr int kMaxHeaderDepth = 16;

// The deepest nesting of arrays and objects in JSON text, skipping strings; stops counting
// once past `limit`.
int json_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

struct DtypeInfo {
  std::string_view name;
  std::size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", 8}, {"F32", 4},     {"F16", 2},         {"BF16", 2},        {"I64", 8},
    {"I32", 4}, {"I16", 2},     {"I8", 1},          {"U64", 8},         {"U32", 4},
    {"U16", 2}, {"U8", 1},      {"BOOL", 1},        {"F8_E4M3", 1},     {"F8_E5M2", 1},
    {"C64", 8}, {"F8_E8M0", 1}, {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string list;
  for (const DtypeInfo& info : kDtypes) {
    if (!list.empty()) list += ", ";
    list += info.name;
  }
  return list;
}

// Element count of a shape, or false on overflow.
bool checked_numel(std::span<const std::int64_t> shape, std::uint64_t* numel) {
  std::uint64_t n = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return false;
  }
  *numel = n;
  return true;
}

// The header text as a JSON object, its nesting bounded before it is parsed.
nlohmann::json parse_header(std::string_view text, const std::string& file) {
  if (text.empty() || text.front() != '{') {
    fail("'{}' is not a valid safetensors file: its header does not start with '{{'", file);
  }
  if (json_depth(text, kMaxHeaderDepth) > kMaxHeaderDepth) {
    fail(
        "'{}' is not a valid safetensors file: its header nests arrays or objects more than {} "
        "levels deep (a valid header nests 3)",
        file, kMaxHeaderDepth);
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number too large for a double ("1E400") is out_of_range.
    fail("'{}' is not a valid safetensors file: its header is not valid JSON: {}", file,
         excerpt(e.what()));
  }
  if (!header.is_object()) {
    fail("'{}' is not a valid safetensors file: its header is not a JSON object", file);
  }
  return header;
}

// The 8-byte little-endian header length at the start of `bytes` (at least 8 of them).
std::uint64_t header_length_field(std::span<const std::byte> bytes) {
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return length;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal half: normalise.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

std::size_t safetensors_dtype_size(std::string_view dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  if (info == nullptr) {
    fail("unknown safetensors dtype '{}'; known dtypes are {}", dtype, known_dtypes());
  }
  return info->size;
}

FileIdentity write_safetensors(const std::filesystem::path& path,
                               std::span<const SafetensorsEntry> entries,
                               const SafetensorsMetadata& metadata) {
  const std::string file = path.string();
  struct Planned {
    const SafetensorsEntry* entry;
    std::size_t dtype_size;
    std::uint64_t bytes;
  };
  std::vector<Planned> planned;
  planned.reserve(entries.size());
  for (const SafetensorsEntry& entry : entries) {
    if (entry.name.empty() || entry.name == kMetadataKey) {
      fail(
          "cannot write '{}': the tensor name '{}' is not allowed (names must be non-empty and "
          "not '{}')",
          file, entry.name, kMetadataKey);
    }
    const DtypeInfo* info = find_dtype(entry.dtype);
    if (info == nullptr) {
      fail("cannot write '{}': tensor '{}' has the unknown dtype '{}'; known dtypes are {}", file,
           entry.name, entry.dtype, known_dtypes());
    }
    std::uint64_t numel = 0, bytes = 0;
    if (!checked_numel(entry.shape, &numel) ||
        __builtin_mul_overflow(numel, static_cast<std::uint64_t>(info->size), &bytes)) {
      fail("cannot write '{}': tensor '{}' has the invalid shape [{}] (negative or overflowing)",
           file, entry.name, fmt::join(entry.shape, ", "));
    }
    if (bytes > 0 && entry.data == nullptr) {
      fail("cannot write '{}': tensor '{}' has {} elements but no data pointer", file, entry.name,
           numel);
    }
    planned.push_back({&entry, info->size, bytes});
  }
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    if (a.dtype_size != b.dtype_size) return a.dtype_size > b.dtype_size;
    return a.entry->name < b.entry->name;
  });
  {
    std::vector<std::string_view> names;
    for (const Planned& p : planned) names.push_back(p.entry->name);
    std::sort(names.begin(), names.end());
    const auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end())
      fail("cannot write '{}': the tensor name '{}' appears twice", file, *dup);
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  std::uint64_t offset = 0;
  for (const Planned& p : planned) {
    header[p.entry->name] = {{"dtype", p.entry->dtype},
                             {"shape", p.entry->shape},
                             {"data_offsets", {offset, offset + p.bytes}}};
    offset += p.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // Invalid UTF-8 in a name or metadata string.
    fail(
        "cannot write '{}': the header cannot be encoded as JSON ({}); names and metadata must "
        "be valid UTF-8",
        file, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::byte length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>(text.size() >> (8 * i));

  std::vector<std::span<const std::byte>> chunks;
  chunks.reserve(planned.size() + 2);
  chunks.emplace_back(length, 8);
  chunks.push_back(std::as_bytes(std::span<const char>(text)));
  for (const Planned& p : planned) {
    chunks.emplace_back(static_cast<const std::byte*>(p.entry->data), p.bytes);
  }
  return write_file_atomically(path, chunks);
}

std::int64_t SafetensorsTensor::numel() const {
  return shape_numel_checked(shape);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(tensors_.size());
  for (const auto& [name, tensor] : tensors_) result.push_back(name);
  return result;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* tensor = find(name);
  if (tensor == nullptr) {
    constexpr std::size_t kListed = 20;
    std::vector<std::string> listed = names();
    const std::size_t total = listed.size();
    if (listed.size() > kListed) listed.resize(kListed);
    fail("'{}' has no tensor named '{}'; it holds {} tensor(s): {}{}", path_.string(),
         excerpt(name), total, fmt::join(listed, ", "), total > kListed ? ", ..." : "");
  }
  return *tensor;
}

const std::string& SafetensorsFile::metadata_at(std::string_view key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) {
    fail(
        "'{}' has no metadata key '{}' (was it written by another program or an older "
        "version?)",
        path_.string(), excerpt(key));
  }
  return it->second;
}

void SafetensorsFile::copy_to_f32(std::string_view name, std::span<float> out) const {
  const SafetensorsTensor& tensor = at(name);
  const auto n = static_cast<std::size_t>(tensor.numel());
  if (out.size() != n) {
    fail("'{}': tensor '{}' has shape [{}] ({} elements) but the destination holds {} elements",
         path_.string(), name, fmt::join(tensor.shape, ", "), n, out.size());
  }
  const std::byte* src = tensor.bytes.data();
  if (tensor.dtype == "F32") {
    if (n > 0) std::memcpy(out.data(), src, n * 4);
  } else if (tensor.dtype == "BF16" || tensor.dtype == "F16") {
    const bool bf16 = tensor.dtype == "BF16";
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = bf16 ? std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16) : half_to_float(h);
    }
  } else if (tensor.dtype == "F64") {
    for (std::size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    fail(
        "'{}': tensor '{}' has dtype {}, which cannot be read as float32 (F32, BF16, F16 and "
        "F64 can)",
        path_.string(), name, tensor.dtype);
  }
}

std::vector<float> SafetensorsFile::to_f32(std::string_view name) const {
  std::vector<float> out(static_cast<std::size_t>(at(name).numel()));
  copy_to_f32(name, out);
  return out;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  // The length field and the header's first byte before the whole file: a large file that is
  // not a safetensors file is refused without being read.
  const FileHead head = read_file_head(path, 9);
  if (head.bytes.size() == 9) {
    const std::uint64_t header_length = header_length_field(head.bytes);
    if (header_length > kMaxHeaderBytes || header_length > head.file_size - 8) {
      fail(
          "'{}' is not a valid safetensors file: its header length field says {} bytes, but the "
          "file has {} bytes after it (and at most {} are allowed). The file is truncated or not "
          "a safetensors file.",
          path.string(), header_length, head.file_size - 8, kMaxHeaderBytes);
    }
    if (head.bytes[8] != std::byte{'{'}) {
      fail("'{}' is not a valid safetensors file: its header does not start with '{{'",
           path.string());
    }
  }
  return parse_safetensors(read_file_bytes(path), path);
}

SafetensorsFile parse_safetensors(std::vector<std::byte> bytes_in,
                                  const std::filesystem::path& source) {
  SafetensorsFile result;
  result.path_ = source;
  result.bytes_ = std::move(bytes_in);
  const std::string file = source.string();
  const std::vector<std::byte>& bytes = result.bytes_;
  constexpr std::string_view kHint = "Was it written completely (check the disk was not full)?";
  if (bytes.size() < 8) {
    fail(
        "'{}' is not a safetensors file: it has {} bytes, fewer than the 8-byte header length. "
        "{}",
        file, bytes.size(), kHint);
  }
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) {
    header_length = (header_length << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  }
  if (header_length > kMaxHeaderBytes || header_length > bytes.size() - 8) {
    fail(
        "'{}' is not a valid safetensors file: its header length field says {} bytes, but the "
        "file has {} bytes after it (and at most {} are allowed). The file is truncated or not a "
        "safetensors file.",
        file, header_length, bytes.size() - 8, kMaxHeaderBytes);
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, header_length);
  const nlohmann::json header = parse_header(text, file);
  const std::uint64_t buffer_size = bytes.size() - 8 - header_length;
  const std::byte* buffer = bytes.data() + 8 + header_length;

  struct Range {
    std::uint64_t begin, end;
    std::string_view name;
  };
  std::vector<Range> ranges;
  for (const auto& item : header.items()) {
    // Plain references, not a structured binding: the lambda below uses them, and clang before
    // 16 cannot capture structured bindings (C++20 allows it).
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        fail("'{}': its '__metadata__' is not a JSON object of strings", file);
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          fail(
              "'{}': metadata key '{}' has a non-string value {}; safetensors metadata maps "
              "strings to strings",
              file, excerpt(key), excerpt(value.dump()));
        }
        result.metadata_.emplace(key, value.get<std::string>());
      }
      continue;
    }
    const auto bad = [&](std::string_view what) {
      fail("'{}' is not a valid safetensors file: tensor '{}' {} (entry: {})", file, excerpt(name),
           what, excerpt(entry.dump()));
    };
    if (!entry.is_object()) bad("is not a JSON object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) bad("has no string 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) bad("has no 'shape' array");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      bad("has no 'data_offsets' pair [begin, end]");
    }
    SafetensorsTensor tensor;
    tensor.dtype = entry["dtype"].get<std::string>();
    const DtypeInfo* info = find_dtype(tensor.dtype);
    if (info == nullptr) {
      bad(fmt::format("has the unknown dtype '{}' (known: {})", excerpt(tensor.dtype),
                      known_dtypes()));
    }
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad("has a shape entry that is not a non-negative integer");
      const auto extent = d.get<std::uint64_t>();
      if (extent > static_cast<std::uint64_t>(INT64_MAX)) bad("has a dimension that is too large");
      tensor.shape.push_back(static_cast<std::int64_t>(extent));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      bad("has data_offsets that are not non-negative integers");
    }
    const auto begin = offsets[0].get<std::uint64_t>();
    const auto end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > buffer_size) {
      bad(fmt::format("has data_offsets [{}, {}] outside the {}-byte data buffer. {}", begin, end,
                      buffer_size, kHint));
    }
    std::uint64_t numel = 0, expected = 0;
    if (!checked_numel(tensor.shape, &numel) ||
        __builtin_mul_overflow(numel, static_cast<std::uint64_t>(info->size), &expected)) {
      bad(fmt::format("has the shape [{}], whose size in bytes does not fit 64 bits",
                      fmt::join(tensor.shape, ", ")));
    }
    if (expected != end - begin) {
      bad(fmt::format("spans {} bytes but its shape and dtype need {}", end - begin, expected));
    }
    tensor.bytes = std::span<const std::byte>(buffer + begin, end - begin);
    const auto [it, inserted] = result.tensors_.emplace(name, std::move(tensor));
    ranges.push_back({begin, end, it->first});
  }
  // The entries must tile the buffer: sorted by offset, each starts where the previous ended,
  // and the last ends at the end of the file. This rules out overlaps (two tensors aliasing the
  // same bytes) and gaps or trailing bytes (a sign of a mangled file).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expected_begin = 0;
  for (const Range& range : ranges) {
    if (range.begin != expected_begin) {
      fail(
          "'{}' is not a valid safetensors file: tensor '{}' starts at byte {} of the data "
          "buffer but the previous tensor ends at {} ({}). Tensors must be contiguous and "
          "non-overlapping.",
          file, excerpt(range.name), range.begin, expected_begin,
          range.begin < expected_begin ? "overlap" : "gap");
    }
    expected_begin = range.end;
  }
  if (expected_begin != buffer_size) {
    fail(
        "'{}' is not a valid safetensors file: its tensors cover {} bytes but the data buffer "
        "has {} bytes",
        file, expected_begin, buffer_size);
  }
  return result;
}

namespace {

// The header of a safetensors file as JSON, reading only the header (checked as read_safetensors
// checks it: length, nesting, a JSON object). `buffer_bytes`, when given, gets the size of the
// data buffer that follows the header in the file.
nlohmann::json read_header_only(const std::filesystem::path& path,
                                std::uint64_t* buffer_bytes = nullptr) {
  const std::string file = path.string();
  const FileHead head = read_file_head(path, 8);
  if (head.bytes.size() < 8) {
    fail("'{}' is not a safetensors file: it has {} bytes, fewer than the 8-byte header length",
         file, head.file_size);
  }
  const std::uint64_t header_length = header_length_field(head.bytes);
  if (header_length > kMaxHeaderBytes || header_length > head.file_size - 8) {
    fail(
        "'{}' is not a valid safetensors file: its header length field says {} bytes, but the "
        "file has {} bytes after it (and at most {} are allowed)",
        file, header_length, head.file_size - 8, kMaxHeaderBytes);
  }
  if (buffer_bytes != nullptr) *buffer_bytes = head.file_size - 8 - header_length;
  const FileHead whole = read_file_head(path, 8 + header_length);
  return parse_header(std::string_view(reinterpret_cast<const char*>(whole.bytes.data()) + 8,
                                       whole.bytes.size() - 8),
                      file);
}

}  // namespace

std::map<std::string, std::vector<std::int64_t>> read_safetensors_shapes(
    const std::filesystem::path& path) {
  std::uint64_t buffer_bytes = 0;
  const nlohmann::json header = read_header_only(path, &buffer_bytes);
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::uint64_t data_end = 0;  // where the last tensor's bytes end, by the header
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) continue;
    if (const auto offsets = entry.is_object() ? entry.find("data_offsets") : entry.end();
        offsets != entry.end() && offsets->is_array() && offsets->size() == 2 &&
        (*offsets)[1].is_number_unsigned()) {
      data_end = std::max(data_end, (*offsets)[1].get<std::uint64_t>());
    }
    const auto shape = entry.is_object() ? entry.find("shape") : entry.end();
    if (shape == entry.end() || !shape->is_array()) {
      fail("'{}': tensor '{}' has no shape list", path.string(), excerpt(name));
    }
    std::vector<std::int64_t>& dims = shapes[name];
    for (const auto& d : *shape) {
      if (!d.is_number_integer()) {
        fail("'{}': tensor '{}' has a shape that is not a list of integers", path.string(),
             excerpt(name));
      }
      dims.push_back(d.get<std::int64_t>());
    }
  }
  // A truncated file (an interrupted copy) shows here already: its header promises more bytes
  // than follow it.
  if (data_end > buffer_bytes) {
    fail(
        "'{}' is truncated: its header places tensor data up to byte {} of the data buffer, but "
        "the file has only {} bytes after the header (an interrupted copy?)",
        path.string(), data_end, buffer_bytes);
  }
  return shapes;
}

SafetensorsMetadata read_safetensors_metadata(const std::filesystem::path& path) {
  const std::string file = path.string();
  const nlohmann::json header = read_header_only(path);
  SafetensorsMetadata metadata;
  const auto it = header.find(kMetadataKey);
  if (it == header.end()) return metadata;
  if (!it->is_object()) fail("'{}': its '__metadata__' is not a JSON object of strings", file);
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string()) {
      fail(
          "'{}': metadata key '{}' has a non-string value; safetensors metadata maps strings to "
          "strings",
          file, excerpt(key));
    }
    metadata.emplace(key, value.get<std::string>());
  }
  return metadata;
}

std::uint64_t checksum(const void* data, std::size_t size, std::uint64_t state) {
  constexpr std::uint64_t kPrime = 0x100000001b3ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    state ^= p[i];
    state *= kPrime;
  }
  return state;
}

std::string checksum_hex(std::uint64_t value) {
  return fmt::format("{:016x}", value);
}

}  // namespace nanoddp::nn
