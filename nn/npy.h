#pragma once
// numpy's .npy format (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
// the magic "\x93NUMPY", a version byte pair (1.0, 2.0 or 3.0), the header length (2 bytes
// little-endian in 1.0, 4 bytes in 2.0/3.0), a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (128, 16), }
// padded with spaces and a newline, then the raw elements.
//
// nanoddp trains in float32, so the reader accepts little-endian float32 ('<f4') and float64
// ('<f8', converted to float32) in C order, which covers what np.save writes for float arrays
// on every common machine. Everything else is refused with a message that says what to change.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nanoddp::nn {

struct NpyArray {
  std::vector<std::int64_t> shape;  // empty for a 0-d array (one element)
  std::vector<float> data;          // row-major (C order), product(shape) elements

  std::int64_t numel() const;
};

// Reads an array of any rank. Throws nanoddp::Error naming the file and the problem: wrong
// magic, unknown version, truncated header or data, extra bytes after the data, Fortran order,
// or an unsupported dtype.
NpyArray read_npy(const std::filesystem::path& path);

// The same over bytes already in memory (read_npy reads the file and calls this); `name` stands
// for the file in messages. The fuzz target (fuzz/npy_fuzzer.cpp) drives this entry point.
NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view name);

// As read_npy, but the array must be 2-D (samples x features).
NpyArray read_npy_matrix(const std::filesystem::path& path);

// A 1-D array of class labels: little-endian int64 ('<i8') or int32 ('<i4'), widened to int64.
// Throws nanoddp::Error naming the file for any other dtype or rank. (The values are the
// caller's to check: only it knows the number of classes.)
std::vector<std::int64_t> read_npy_labels(const std::filesystem::path& path);

// What a .npy file's header says, read and checked (magic, version, dtype, shape, and that the
// file's size is exactly header + data) without reading the data: a wrong file is refused in
// milliseconds instead of after gigabytes. kMatrix: a 2-D float32/float64 array (as
// read_npy_matrix); kLabels: a 1-D int64/int32 array (as read_npy_labels).
enum class NpyContents { kMatrix, kLabels };
struct NpyHeader {
  std::vector<std::int64_t> shape;
  std::string dtype;  // as the header spells it: '<f4', '<f8', '<i8', '<i4'
};
NpyHeader read_npy_header(const std::filesystem::path& path, NpyContents contents);

// Throws nanoddp::Error naming `path` and the first NaN or infinite element (its row and column
// for a 2-D array, its index tuple otherwise) and how many such elements there are.
void check_finite(const NpyArray& array, const std::filesystem::path& path);

// Writes a float32 array ('<f4', C order, format version 1.0; 2.0 when the header needs more
// than 65535 bytes) atomically: temporary file in the same directory, fsync, rename.
// `data` holds product(shape) elements (may be null when that product is 0).
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               const float* data);

}  // namespace nanoddp::nn
