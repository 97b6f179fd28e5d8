#include "nanoddp/nn/npy.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/file_io.h"

static_assert(std::endian::native == std::endian::little,
              "the .npy reader and writer assume a little-endian host");

namespace nanoddp::nn {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kPreludeV1 = 10;  // magic (6) + version (2) + header length (2)
constexpr std::size_t kPreludeV2 = 12;  // magic (6) + version (2) + header length (4)
// numpy aligns the data to 64 bytes so that it can be memory-mapped with any alignment.
constexpr std::size_t kHeaderAlignment = 64;
// numpy itself refuses headers above 10,000 bytes unless told otherwise; 1 MiB leaves room for
// arrays of very high rank and bounds what a corrupted length field can make us read.
constexpr std::size_t kMaxHeaderBytes = 1u << 20;

std::string format_shape(std::span<const std::int64_t> shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// "row 7, column 1" of a matrix, "index (2, 0, 5)" otherwise: the flat index unravelled in C
// order.
std::string describe_element(std::span<const std::int64_t> shape, std::size_t flat) {
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const auto extent = static_cast<std::size_t>(shape[d]);
    index[d] = static_cast<std::int64_t>(flat % extent);
    flat /= extent;
  }
  return index.size() == 2 ? fmt::format("row {}, column {}", index[0], index[1])
                           : fmt::format("index ({})", fmt::join(index, ", "));
}

// The header dict's values: strings, booleans and tuples of non-negative integers. This is the
// subset np.save writes; a tiny recursive-descent parser is safer than searching for substrings.
struct HeaderValue {
  enum class Kind { kString, kBool, kTuple, kOther } kind = Kind::kOther;
  std::string text;
  bool flag = false;
  std::vector<std::int64_t> tuple;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : text_(text), name_(name) {}

  // Returns the three keys np.save writes; unknown keys are an error (a newer format we would
  // misread).
  void parse(std::optional<HeaderValue>& descr, std::optional<HeaderValue>& fortran_order,
             std::optional<HeaderValue>& shape) {
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string();
      expect(':');
      HeaderValue value = parse_value();
      if (key == "descr") {
        descr = std::move(value);
      } else if (key == "fortran_order") {
        fortran_order = std::move(value);
      } else if (key == "shape") {
        shape = std::move(value);
      } else {
        bad(fmt::format("an unknown key '{}'", key));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        bad("a missing ',' or '}'");
      }
    }
  }

 private:
  [[noreturn]] void bad(std::string_view what) const {
    fail(
        "'{}' is not a valid .npy file: its header has {} at character {} (header: {}). "
        "Re-save the array with numpy.save.",
        name_, excerpt(what), pos_, excerpt(text_));
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) bad("an unexpected end");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) bad(fmt::format("'{}' where '{}' was expected", text_[pos_], c));
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("a key that is not a quoted string");
    ++pos_;
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) bad("an unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }
  std::int64_t parse_int() {
    skip_space();
    const std::size_t start = pos_;
    std::int64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      if (value > (INT64_MAX - 9) / 10) bad("a dimension too large");
      value = value * 10 + (text_[pos_] - '0');
      ++pos_;
    }
    // Python 2 era files may write long integers as "3L".
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
    if (pos_ == start) bad("a shape entry that is not a non-negative integer");
    return value;
  }
  HeaderValue parse_value() {
    HeaderValue value;
    const char c = peek();
    if (c == '\'' || c == '"') {
      value.kind = HeaderValue::Kind::kString;
      value.text = parse_string();
    } else if (text_.substr(pos_, 4) == "True") {
      value.kind = HeaderValue::Kind::kBool;
      value.flag = true;
      pos_ += 4;
    } else if (text_.substr(pos_, 5) == "False") {
      value.kind = HeaderValue::Kind::kBool;
      pos_ += 5;
    } else if (c == '(') {
      value.kind = HeaderValue::Kind::kTuple;
      ++pos_;
      while (peek() != ')') {
        value.tuple.push_back(parse_int());
        if (peek() == ',') {
          ++pos_;
        } else if (peek() != ')') {
          bad("a malformed shape tuple");
        }
      }
      ++pos_;
    } else {
      // A structured dtype's list of fields, or something else we do not read: record its text.
      value.kind = HeaderValue::Kind::kOther;
      int depth = 0;
      const std::size_t start = pos_;
      while (pos_ < text_.size()) {
        const char d = text_[pos_];
        if (d == '[' || d == '(' || d == '{') ++depth;
        if (d == ']' || d == ')' || d == '}') {
          if (depth == 0) break;
          --depth;
        }
        if (d == ',' && depth == 0) break;
        ++pos_;
      }
      value.text = std::string(text_.substr(start, pos_ - start));
    }
    return value;
  }

  std::string_view text_;
  std::string_view name_;
  std::size_t pos_ = 0;
};

std::uint32_t read_le(const std::byte* p, int bytes) {
  std::uint32_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint32_t>(p[i]);
  return value;
}

}  // namespace

std::int64_t NpyArray::numel() const {
  return shape_numel_checked(shape);
}

namespace {

// Where the elements are, from the prelude and header alone.
struct NpyLayout {
  std::vector<std::int64_t> shape;
  std::size_t item_size = 4;    // 4: '<f4' or '<i4', 8: '<f8' or '<i8'
  bool integer = false;         // '<i4' / '<i8' (class labels, read_npy_labels only)
  std::size_t data_offset = 0;  // bytes before the first element
  std::size_t count = 0;        // elements
  std::string descr;            // the dtype as the header spells it
};

// Parses the prelude and header at the start of `head` (the file's first bytes) and checks that
// the file's `total_size` is exactly header + data: nothing past the header is needed, so a huge
// file that is not a .npy (or whose header lies) is refused before its data is read.
NpyLayout parse_npy_layout(std::span<const std::byte> head, std::uint64_t total_size,
                           std::string_view name, bool integers = false) {
  if (head.size() < kMagic.size() || std::memcmp(head.data(), kMagic.data(), kMagic.size()) != 0) {
    fail(
        "'{}' is not a .npy file: it does not start with the magic bytes \\x93NUMPY ({} bytes "
        "long). Write it with numpy.save (not numpy.savez, pickle or text).",
        name, total_size);
  }
  if (head.size() < kPreludeV1) {
    fail("'{}' is truncated: it ends inside the .npy prelude ({} of at least {} bytes)", name,
         total_size, kPreludeV1);
  }
  const int major = std::to_integer<int>(head[6]);
  const int minor = std::to_integer<int>(head[7]);
  if (minor != 0 || major < 1 || major > 3) {
    fail("'{}' has .npy format version {}.{}; versions 1.0, 2.0 and 3.0 are supported", name, major,
         minor);
  }
  const std::size_t prelude = major == 1 ? kPreludeV1 : kPreludeV2;
  if (head.size() < prelude) {
    fail("'{}' is truncated: it ends inside the .npy prelude ({} of {} bytes)", name, total_size,
         prelude);
  }
  const std::size_t header_length = read_le(head.data() + 8, major == 1 ? 2 : 4);
  if (header_length > kMaxHeaderBytes) {
    fail(
        "'{}' is not a .npy file numpy writes: its header length field says {} bytes, more than "
        "the {} allowed",
        name, header_length, kMaxHeaderBytes);
  }
  if (head.size() < prelude + header_length) {
    fail(
        "'{}' is truncated: its header says it is {} bytes long but only {} bytes follow the "
        "prelude",
        name, header_length, total_size - std::min<std::uint64_t>(total_size, prelude));
  }
  const std::string_view header(reinterpret_cast<const char*>(head.data()) + prelude,
                                header_length);

  std::optional<HeaderValue> descr, fortran_order, shape_value;
  HeaderParser(header, name).parse(descr, fortran_order, shape_value);
  if (!descr || !fortran_order || !shape_value) {
    fail("'{}' is not a valid .npy file: its header lacks '{}' (header: {})", name,
         !descr           ? "descr"
         : !fortran_order ? "fortran_order"
                          : "shape",
         excerpt(header));
  }
  if (descr->kind != HeaderValue::Kind::kString) {
    fail(
        "'{}' has the structured dtype {}; only float32 ('<f4') and float64 ('<f8') arrays, "
        "little-endian and in C order, are supported",
        name, excerpt(descr->text));
  }
  if (integers && descr->text != "<i8" && descr->text != "<i4") {
    fail(
        "'{}' has the dtype '{}'; class labels must be little-endian int64 ('<i8') or int32 "
        "('<i4'): convert with arr.astype(numpy.int64)",
        name, excerpt(descr->text));
  }
  if (!integers && descr->text != "<f4" && descr->text != "<f8") {
    std::string hint;
    if (descr->text.size() > 1 && descr->text[0] == '>') {
      hint = " (big-endian; convert with arr.astype('<f4'))";
    } else if (descr->text.size() > 1 && descr->text[1] != 'f') {
      hint = " (not floating point; convert with arr.astype(numpy.float32))";
    }
    fail(
        "'{}' has the unsupported dtype '{}'{}; only little-endian float32 ('<f4') and float64 "
        "('<f8') arrays in C order are supported",
        name, excerpt(descr->text), hint);
  }
  if (fortran_order->kind != HeaderValue::Kind::kBool) {
    fail("'{}' is not a valid .npy file: its fortran_order '{}' is not True or False", name,
         excerpt(fortran_order->text));
  }
  if (fortran_order->flag) {
    fail(
        "'{}' is stored in Fortran (column-major) order; only C order is supported. Save it "
        "with numpy.save(path, numpy.ascontiguousarray(arr)).",
        name);
  }
  if (shape_value->kind != HeaderValue::Kind::kTuple) {
    fail("'{}' is not a valid .npy file: its shape '{}' is not a tuple", name,
         excerpt(shape_value->text));
  }

  NpyLayout layout;
  layout.shape = shape_value->tuple;
  layout.descr = descr->text;
  layout.item_size = descr->text == "<f4" || descr->text == "<i4" ? 4 : 8;
  layout.integer = integers;
  layout.data_offset = prelude + header_length;
  const std::uint64_t available = total_size - layout.data_offset;
  std::size_t count = 1;
  bool overflow = false;
  for (const std::int64_t d : layout.shape) {
    overflow = overflow || __builtin_mul_overflow(count, static_cast<std::size_t>(d), &count);
  }
  std::size_t needed = 0;
  overflow = overflow || __builtin_mul_overflow(count, layout.item_size, &needed);
  if (overflow) {
    fail("'{}' is not a valid .npy file: its shape {} of '{}' needs more than 2^64 data bytes",
         name, format_shape(layout.shape), descr->text);
  }
  if (needed != available) {
    const bool truncated = needed > available;
    fail(
        "'{}' is {}: its shape {} of '{}' needs {} data bytes but the file has {} after the "
        "header{}",
        name, truncated ? "truncated" : "longer than its header says", format_shape(layout.shape),
        descr->text, needed, available, truncated ? " (an interrupted copy or download?)" : "");
  }
  layout.count = count;
  return layout;
}

// `count` elements of `item_size` bytes as float32; `first` is the index of data[0] in the
// array of `shape` (for messages). A finite float64 beyond float32's range would become Inf and
// then be reported as "the file contains inf": refused here, saying what it really is.
void convert_elements(const std::byte* data, std::size_t count, std::size_t item_size, float* out,
                      std::string_view name, std::span<const std::int64_t> shape,
                      std::size_t first) {
  if (count == 0) return;  // (an empty vector's data() may be null, which memcpy must not get)
  if (item_size == 4) {
    std::memcpy(out, data, count * 4);
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    double value;
    std::memcpy(&value, data + i * 8, 8);
    out[i] = static_cast<float>(value);
    if (std::isinf(out[i]) && std::isfinite(value)) {
      fail(
          "'{}' holds {:g} at {} (counting from 0), a finite float64 beyond float32's range "
          "(about 3.4e38): nanoddp trains in float32. Scale or clip the data before saving.",
          name, value, describe_element(shape, first + i));
    }
  }
}

std::vector<float> allocate_elements(std::size_t count, std::string_view name) {
  std::vector<float> data;
  try {
    data.resize(count);
  } catch (const std::bad_alloc&) {
    // (count * 4 fits: the header's data size, count * 4 or * 8, was computed without overflow.)
    fail("'{}' holds {} elements ({} bytes as float32), which do not fit in memory", name, count,
         count * 4);
  } catch (const std::length_error&) {
    fail("'{}' holds {} elements, more than a vector can hold", name, count);
  }
  return data;
}

}  // namespace

namespace {

void check_matrix_shape(std::span<const std::int64_t> shape, const std::filesystem::path& path) {
  if (shape.size() != 2) {
    fail(
        "'{}' holds a {}-D array of shape {}; a 2-D array (samples x features) is expected. "
        "Reshape it with arr.reshape(len(arr), -1) before saving.",
        path.string(), shape.size(), format_shape(shape));
  }
}

// The prelude and exactly the header it announces (a short or bad prelude is left to
// parse_npy_layout's messages).
FileHead read_npy_head(const std::filesystem::path& path) {
  FileHead head = read_file_head(path, kPreludeV2);
  if (head.bytes.size() >= kPreludeV2) {
    const int major = std::to_integer<int>(head.bytes[6]);
    const std::size_t prelude = major == 1 ? kPreludeV1 : kPreludeV2;
    const std::size_t header_length = read_le(head.bytes.data() + 8, major == 1 ? 2 : 4);
    if (std::memcmp(head.bytes.data(), kMagic.data(), kMagic.size()) == 0 &&
        header_length <= kMaxHeaderBytes) {
      head = read_file_head(path, prelude + header_length);
    }
  }
  return head;
}

}  // namespace

namespace {

NpyLayout labels_layout(const std::filesystem::path& path) {
  const std::string name = path.string();
  const FileHead head = read_npy_head(path);
  NpyLayout layout = parse_npy_layout(head.bytes, head.file_size, name, true);
  if (layout.shape.size() != 1) {
    fail("'{}' has shape {}; class labels must be a 1-D array (one class index per sample)", name,
         format_shape(layout.shape));
  }
  return layout;
}

NpyLayout matrix_layout(const std::filesystem::path& path) {
  const FileHead head = read_npy_head(path);
  NpyLayout layout = parse_npy_layout(head.bytes, head.file_size, path.string());
  check_matrix_shape(layout.shape, path);
  return layout;
}

}  // namespace

NpyHeader read_npy_header(const std::filesystem::path& path, NpyContents contents) {
  const NpyLayout layout =
      contents == NpyContents::kLabels ? labels_layout(path) : matrix_layout(path);
  return NpyHeader{.shape = layout.shape, .dtype = layout.descr};
}

std::vector<std::int64_t> read_npy_labels(const std::filesystem::path& path) {
  const NpyLayout layout = labels_layout(path);
  std::vector<std::int64_t> labels(layout.count);
  if (layout.item_size == 8) {
    if (layout.count > 0) {
      read_file_range(path, layout.data_offset, reinterpret_cast<std::byte*>(labels.data()),
                      layout.count * 8);
    }
    return labels;
  }
  // int32, widened block by block: the file's bytes are never held whole beside the labels.
  constexpr std::size_t kBlock = 1u << 18;  // elements
  std::vector<std::int32_t> block(std::min(layout.count, kBlock));
  for (std::size_t done = 0; done < layout.count; done += kBlock) {
    const std::size_t n = std::min(kBlock, layout.count - done);
    read_file_range(path, layout.data_offset + done * 4, reinterpret_cast<std::byte*>(block.data()),
                    n * 4);
    std::copy_n(block.begin(), n, labels.begin() + static_cast<std::ptrdiff_t>(done));
  }
  return labels;
}

NpyArray read_npy(const std::filesystem::path& path) {
  const std::string name = path.string();
  // The prelude first, then exactly the header it announces, then exactly the data the header
  // describes: nothing is read or allocated on the word of bytes not yet checked.
  const FileHead head = read_npy_head(path);
  const NpyLayout layout = parse_npy_layout(head.bytes, head.file_size, name);
  NpyArray array;
  array.shape = layout.shape;
  array.data = allocate_elements(layout.count, name);
  if (layout.item_size == 4) {
    read_file_range(path, layout.data_offset, reinterpret_cast<std::byte*>(array.data.data()),
                    layout.count * 4);
  } else {
    // float64: converted block by block, so the file's bytes are never held whole.
    constexpr std::size_t kBlock = 1u << 17;  // elements
    std::vector<std::byte> block(std::min(layout.count, kBlock) * 8);
    for (std::size_t done = 0; done < layout.count; done += kBlock) {
      const std::size_t n = std::min(kBlock, layout.count - done);
      read_file_range(path, layout.data_offset + done * 8, block.data(), n * 8);
      convert_elements(block.data(), n, 8, array.data.data() + done, name, array.shape, done);
    }
  }
  return array;
}

NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view name) {
  const NpyLayout layout = parse_npy_layout(bytes, bytes.size(), name);
  NpyArray array;
  array.shape = layout.shape;
  array.data = allocate_elements(layout.count, name);
  convert_elements(bytes.data() + layout.data_offset, layout.count, layout.item_size,
                   array.data.data(), name, array.shape, 0);
  return array;
}

NpyArray read_npy_matrix(const std::filesystem::path& path) {
  matrix_layout(path);  // the shape is refused before the data is read
  return read_npy(path);
}

void check_finite(const NpyArray& array, const std::filesystem::path& path) {
  std::size_t first = array.data.size();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < array.data.size(); ++i) {
    if (!std::isfinite(array.data[i])) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return;
  const std::string where = describe_element(array.shape, first);
  fail(
      "'{}' contains {} non-finite value(s): the first is {} at {} (counting from 0). Clean the "
      "data (e.g. numpy.nan_to_num or drop those rows) before training.",
      path.string(), bad, array.data[first], where);
}

void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               const float* data) {
  std::size_t count = 1;
  for (const std::int64_t d : shape) {
    if (d < 0)
      fail("cannot write '{}': the shape {} has a negative dimension", path.string(),
           format_shape(shape));
    count *= static_cast<std::size_t>(d);
  }
  if (count > 0 && data == nullptr) {
    fail("cannot write '{}': no data pointer for {} elements", path.string(), count);
  }
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}", format_shape(shape));
  // Pad with spaces so that prelude + header (ending in '\n') is a multiple of 64.
  const std::size_t prelude = header.size() + 1 + kPreludeV1 > 65535 ? kPreludeV2 : kPreludeV1;
  const std::size_t unpadded = prelude + header.size() + 1;
  header.append((kHeaderAlignment - unpadded % kHeaderAlignment) % kHeaderAlignment, ' ');
  header.push_back('\n');

  std::string head(kMagic);
  head.push_back(static_cast<char>(prelude == kPreludeV1 ? 1 : 2));
  head.push_back(0);
  const std::size_t length = header.size();
  for (std::size_t i = 0; i < prelude - 8; ++i)
    head.push_back(static_cast<char>(length >> (8 * i)));
  head += header;

  const std::span<const std::byte> chunks[] = {std::as_bytes(std::span<const char>(head)),
                                               std::as_bytes(std::span<const float>(data, count))};
  write_file_atomically(path, chunks);
}

}  // namespace nanoddp::nn
