#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "nanoddp/nn/npy.h"
#include "nn/data_test_util.h"

namespace {

using nanoddp::nn::check_finite;
using nanoddp::nn::NpyArray;
using nanoddp::nn::read_npy;
using nanoddp::nn::read_npy_matrix;
using nanoddp::nn::write_npy;
using nanoddp::nn::testing::error_message;
using nanoddp::nn::testing::read_bytes;
using nanoddp::nn::testing::ScratchDir;
using nanoddp::nn::testing::write_bytes;

// A .npy file byte for byte as numpy.save writes it (numpy is not needed to run the tests): the
// dict literal padded with spaces so that the data starts at a multiple of 64, then '\n'.
std::string npy_file(int major, const std::string& dict, const std::string& data) {
  const std::size_t prelude = major == 1 ? 10 : 12;
  std::string header = dict;
  const std::size_t unpadded = prelude + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (std::size_t i = 0; i < prelude - 8; ++i)
    out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

}  // namespace

TEST_CASE("npy: write then read round-trips float32 arrays of any rank") {
  ScratchDir dir;
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{3, 4}, {5}, {}, {2, 3, 4}, {0, 7}, {1, 1}}) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> data(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = 0.25f * static_cast<float>(i) - 1.0f;
    const auto path = dir / "a.npy";
    write_npy(path, shape, data.data());
    const NpyArray back = read_npy(path);
    CHECK(back.shape == shape);
    CHECK(back.data == data);
    CHECK(back.numel() == n);
  }
}

TEST_CASE("npy: the writer's bytes are exactly numpy's (version 1.0, 64-byte aligned header)") {
  ScratchDir dir;
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  const std::int64_t shape[] = {2, 3};
  write_npy(dir / "m.npy", shape, data.data());
  // What numpy.save(np.arange(1, 7, dtype='<f4').reshape(2, 3)) writes.
  CHECK(read_bytes(dir / "m.npy") == npy_file(1, dict("<f4", "(2, 3)"), raw(data)));
  const std::int64_t shape1[] = {6};
  write_npy(dir / "v.npy", shape1, data.data());
  CHECK(read_bytes(dir / "v.npy") == npy_file(1, dict("<f4", "(6,)"), raw(data)));
  CHECK(read_bytes(dir / "v.npy").size() == 128 + 24);  // numpy pads the header to 128
}

TEST_CASE("npy: reads numpy's files: versions 1.0, 2.0, 3.0, float32 and float64") {
  ScratchDir dir;
  const std::vector<double> f8 = {0.5, -1.25, 3.0, 1e-3, 2.0, 7.0};
  const std::vector<float> f4 = {0.5f, -1.25f, 3.0f, 1e-3f, 2.0f, 7.0f};
  for (int major : {1, 2, 3}) {
    CAPTURE(major);
    write_bytes(dir / "f4.npy", npy_file(major, dict("<f4", "(3, 2)"), raw(f4)));
    NpyArray a = read_npy_matrix(dir / "f4.npy");
    CHECK(a.shape == std::vector<std::int64_t>{3, 2});
    CHECK(a.data == f4);
    write_bytes(dir / "f8.npy", npy_file(major, dict("<f8", "(3, 2)"), raw(f8)));
    NpyArray b = read_npy(dir / "f8.npy");
    CHECK(b.shape == std::vector<std::int64_t>{3, 2});
    CHECK(b.data == f4);  // converted to float32
  }
  // Key order and spacing vary between numpy versions and hand-written files.
  write_bytes(dir / "odd.npy",
              npy_file(1, "{\"shape\":(2,3),\"fortran_order\":False,\"descr\":\"<f4\"}", raw(f4)));
  CHECK(read_npy(dir / "odd.npy").shape == std::vector<std::int64_t>{2, 3});
}

TEST_CASE("npy: malformed files are refused with a message that names the file and the problem") {
  ScratchDir dir;
  const auto path = dir / "bad.npy";
  const std::string file = path.string();
  const std::vector<float> six(6, 1.0f);

  write_bytes(path, "PK\x03\x04 this is a zip (npz) file");
  error_message([&] { read_npy(path); }, {file, "magic", "numpy.save"});

  write_bytes(path, "\x93NUMPY\x01");
  error_message([&] { read_npy(path); }, {file, "truncated"});

  const std::string good = npy_file(1, dict("<f4", "(3, 2)"), raw(six));
  write_bytes(path, good.substr(0, 40));  // ends inside the header
  error_message([&] { read_npy(path); }, {file, "truncated", "header"});

  write_bytes(path, good.substr(0, good.size() - 4));  // one element short
  error_message([&] { read_npy(path); }, {file, "truncated", "(3, 2)", "24", "20"});

  write_bytes(path, good + "xxxx");
  error_message([&] { read_npy(path); }, {file, "longer than its header says"});

  write_bytes(path, npy_file(1, dict("<f4", "(3, 2)", /*fortran=*/true), raw(six)));
  error_message([&] { read_npy(path); }, {file, "Fortran", "C order"});

  write_bytes(path, npy_file(1, dict("<i8", "(3, 2)"), raw(std::vector<std::int64_t>(6, 1))));
  error_message([&] { read_npy(path); }, {file, "'<i8'", "float32", "little-endian", "C order"});

  write_bytes(path, npy_file(1, dict(">f4", "(3, 2)"), raw(six)));
  error_message([&] { read_npy(path); }, {file, "'>f4'", "big-endian", "float32"});

  write_bytes(path, npy_file(1, dict("<f2", "(3, 2)"), std::string(12, '\0')));
  error_message([&] { read_npy(path); }, {file, "'<f2'"});

  write_bytes(
      path,
      npy_file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", raw(six)));
  error_message([&] { read_npy(path); }, {file, "structured dtype"});

  std::string v4 = good;
  v4[6] = 4;
  write_bytes(path, v4);
  error_message([&] { read_npy(path); }, {file, "version 4.0"});

  write_bytes(path, npy_file(1, "{'descr': '<f4', 'shape': (6,), }", raw(six)));
  error_message([&] { read_npy(path); }, {file, "fortran_order"});

  write_bytes(path, npy_file(1, dict("<f4", "(-1, 6)"), raw(six)));
  error_message([&] { read_npy(path); }, {file, "shape"});

  // Shape whose element count overflows: said so, not "truncated", a crash or a huge alloc.
  write_bytes(path, npy_file(1, dict("<f4", "(4294967296, 4294967296, 16)"), raw(six)));
  error_message([&] { read_npy(path); }, {file, "(4294967296, 4294967296, 16)", "2^64"});

  // fortran_order as the string 'False' (found by an outside tester): not "Fortran order".
  write_bytes(
      path, npy_file(1, "{'descr': '<f4', 'fortran_order': 'False', 'shape': (3, 2), }", raw(six)));
  error_message([&] { read_npy(path); }, {file, "fortran_order", "not True or False"});

  error_message([&] { read_npy(dir / "missing.npy"); }, {"missing.npy", "No such file"});
}

TEST_CASE("npy: the matrix reader requires 2-D") {
  ScratchDir dir;
  const std::vector<float> data(24, 0.5f);
  const std::int64_t cube[] = {2, 3, 4};
  write_npy(dir / "cube.npy", cube, data.data());
  error_message([&] { read_npy_matrix(dir / "cube.npy"); },
                {(dir / "cube.npy").string(), "3-D", "(2, 3, 4)", "2-D"});
  const std::int64_t line[] = {24};
  write_npy(dir / "line.npy", line, data.data());
  error_message([&] { read_npy_matrix(dir / "line.npy"); }, {"1-D", "(24,)", "reshape"});
}

TEST_CASE("npy: check_finite names the first NaN or Inf by row and column") {
  NpyArray a{{4, 3}, std::vector<float>(12, 1.0f)};
  CHECK_NOTHROW(check_finite(a, "x.npy"));
  a.data[2 * 3 + 1] = std::numeric_limits<float>::quiet_NaN();
  a.data[3 * 3 + 0] = std::numeric_limits<float>::infinity();
  error_message([&] { check_finite(a, "x.npy"); },
                {"x.npy", "2 non-finite", "nan", "row 2, column 1"});
  NpyArray b{{2, 2, 2}, std::vector<float>(8, 0.0f)};
  b.data[5] = -std::numeric_limits<float>::infinity();
  error_message([&] { check_finite(b, "y.npy"); }, {"y.npy", "-inf", "index (1, 0, 1)"});
}

TEST_CASE("npy: writes are atomic and report I/O errors with the path") {
  ScratchDir dir;
  const std::vector<float> a(10, 1.0f), b(20, 2.0f);
  const std::int64_t sa[] = {10}, sb[] = {4, 5};
  write_npy(dir / "x.npy", sa, a.data());
  write_npy(dir / "x.npy", sb, b.data());  // replaces the old file
  CHECK(read_npy(dir / "x.npy").data == b);
  // No temporary file is left behind.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
  error_message([&] { write_npy(dir / "no-such-dir" / "x.npy", sa, a.data()); },
                {"no-such-dir/x.npy", "No such file or directory"});
}

TEST_CASE("npy: the header is checked before the data is read, and messages stay short") {
  ScratchDir dir;
  const auto path = dir / "big.npy";
  // 64 GiB, sparse, not a .npy: refused from its first bytes (it used to be read whole first).
  write_bytes(path, "PK\x03\x04 a zip file, say");
  std::filesystem::resize_file(path, std::uintmax_t{64} << 30);
  error_message([&] { nanoddp::nn::read_npy(path); }, {path.string(), "magic bytes"});
  // A valid header for 4 floats followed by 64 GiB: refused from the header and the file size.
  write_bytes(path, npy_file(1, dict("<f4", "(2, 2)"), raw(std::vector<float>{1, 2, 3, 4})));
  std::filesystem::resize_file(path, std::uintmax_t{64} << 30);
  error_message([&] { nanoddp::nn::read_npy(path); }, {"longer than its header says"});
  // A header whose unknown key is a megabyte long: an excerpt, not the whole header.
  const std::string key(1 << 19, 'k');
  write_bytes(path, npy_file(2, "{'" + key + "': 1, }", ""));
  const std::string message =
      error_message([&] { nanoddp::nn::read_npy(path); }, {"unknown key", "characters in all"});
  CHECK(message.size() < 2000);
  // float64 is converted block by block: the values survive.
  std::vector<double> values(300000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i) * 0.5;
  write_bytes(path, npy_file(1, dict("<f8", "(1000, 300)"), raw(values)));
  const nanoddp::nn::NpyArray array = nanoddp::nn::read_npy(path);
  REQUIRE(array.data.size() == values.size());
  CHECK(array.data[0] == 0.0f);
  CHECK(array.data[299999] == 149999.5f);
}
