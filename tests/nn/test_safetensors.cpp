#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "nanoddp/nn/safetensors.h"
#include "nn/data_test_util.h"

namespace {

using nanoddp::nn::checksum;
using nanoddp::nn::checksum_hex;
using nanoddp::nn::read_safetensors;
using nanoddp::nn::SafetensorsEntry;
using nanoddp::nn::SafetensorsFile;
using nanoddp::nn::SafetensorsMetadata;
using nanoddp::nn::write_safetensors;
using nanoddp::nn::testing::error_message;
using nanoddp::nn::testing::have_python3;
using nanoddp::nn::testing::read_bytes;
using nanoddp::nn::testing::ScratchDir;
using nanoddp::nn::testing::write_bytes;

// A safetensors file from a JSON header and a data buffer, padded like the reference writer.
std::string safetensors_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + data;
}

std::string floats(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), 4);
  return out;
}

struct Sample {
  std::vector<float> weight = {1, 2, 3, 4, 5, 6};
  std::vector<float> bias = {-0.5f, 0.25f};
  std::vector<std::uint16_t> half = {0x3f80, 0xc000, 0x3e80};  // bf16 of 1, -2, 0.25
  std::vector<std::int64_t> step = {42};
  std::vector<std::uint8_t> flags = {1, 0, 1};  // odd size: tests alignment of what follows

  std::vector<SafetensorsEntry> entries() const {
    return {{"layer.weight", "F32", {2, 3}, weight.data()},
            {"flags", "U8", {3}, flags.data()},
            {"layer.bias", "F32", {2}, bias.data()},
            {"half", "BF16", {3}, half.data()},
            {"step", "I64", {}, step.data()},
            {"empty", "F32", {0, 4}, nullptr}};
  }
};

}  // namespace

TEST_CASE("safetensors: write then read round-trips tensors and metadata") {
  ScratchDir dir;
  Sample s;
  const auto entries = s.entries();
  const SafetensorsMetadata metadata = {{"step", "42"}, {"format", "pt"}};
  write_safetensors(dir / "ckpt.safetensors", entries, metadata);

  const SafetensorsFile file = read_safetensors(dir / "ckpt.safetensors");
  CHECK(file.names() ==
        std::vector<std::string>{"empty", "flags", "half", "layer.bias", "layer.weight", "step"});
  CHECK(file.metadata() == metadata);
  CHECK(file.metadata_at("step") == "42");
  const auto& w = file.at("layer.weight");
  CHECK(w.dtype == "F32");
  CHECK(w.shape == std::vector<std::int64_t>{2, 3});
  CHECK(w.numel() == 6);
  CHECK(file.to_f32("layer.weight") == s.weight);
  CHECK(file.to_f32("layer.bias") == s.bias);
  CHECK(file.to_f32("half") == std::vector<float>{1.0f, -2.0f, 0.25f});
  CHECK(file.to_f32("empty").empty());
  const auto& step = file.at("step");
  CHECK(step.shape.empty());
  REQUIRE(step.bytes.size() == 8);
  std::int64_t step_value = 0;
  std::memcpy(&step_value, step.bytes.data(), 8);
  CHECK(step_value == 42);
  CHECK(std::memcmp(file.at("flags").bytes.data(), s.flags.data(), 3) == 0);
  CHECK_FALSE(file.contains("nope"));
  CHECK(file.find("nope") == nullptr);
  error_message([&] { (void)file.at("nope"); }, {"ckpt.safetensors", "nope", "layer.weight"});
  error_message([&] { (void)file.to_f32("step"); }, {"step", "I64", "float32"});
  std::vector<float> wrong(5);
  error_message([&] { file.copy_to_f32("layer.weight", wrong); }, {"6 elements", "5"});
  error_message([&] { (void)file.metadata_at("epoch"); }, {"epoch"});

  // Moving keeps the views valid (they point into the moved buffer).
  SafetensorsFile moved = read_safetensors(dir / "ckpt.safetensors");
  SafetensorsFile target = std::move(moved);
  CHECK(target.to_f32("layer.weight") == s.weight);
}

TEST_CASE("safetensors: layout follows the reference writer (padding, alignment, tiling)") {
  ScratchDir dir;
  Sample s;
  write_safetensors(dir / "a.safetensors", s.entries());
  const std::string bytes = read_bytes(dir / "a.safetensors");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');
  CHECK(bytes.find("__metadata__") == std::string::npos);  // no metadata: no key
  const SafetensorsFile file = read_safetensors(dir / "a.safetensors");
  // Every tensor starts at a multiple of its element size within the buffer.
  const auto offset = [&](const char* name) {
    return file.at(name).bytes.data() - file.at("step").bytes.data();
  };
  CHECK(offset("step") == 0);        // 8-byte dtypes first
  CHECK(offset("empty") == 8);       // then 4-byte ones by name: empty, layer.bias, layer.weight
  CHECK(offset("layer.bias") == 8);  // (empty has no bytes)
  CHECK(offset("layer.weight") == 16);
  CHECK(offset("half") == 40);   // then 2-byte
  CHECK(offset("flags") == 46);  // then 1-byte
}

TEST_CASE("safetensors: reads a file laid out by another writer") {
  ScratchDir dir;
  // As safetensors' Python package writes it: metadata first, compact JSON, space padding.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  double a = 2.5;
  std::string data(reinterpret_cast<const char*>(&a), 8);
  data += floats({3.0f, -4.0f});
  write_bytes(dir / "x.safetensors", safetensors_file(header, data));
  const SafetensorsFile file = read_safetensors(dir / "x.safetensors");
  CHECK(file.to_f32("a") == std::vector<float>{2.5f});
  CHECK(file.to_f32("b") == std::vector<float>{3.0f, -4.0f});
  CHECK(file.metadata().at("format") == "pt");
}

TEST_CASE("safetensors: python's json and struct parse our files") {
  if (!have_python3()) {
    MESSAGE("python3 not found: skipping the cross-check with Python");
    return;
  }
  ScratchDir dir;
  Sample s;
  const auto path = dir / "py.safetensors";
  const std::uint64_t sum = checksum(s.weight.data(), s.weight.size() * 4);
  write_safetensors(path, s.entries(), {{"weight_fnv1a64", checksum_hex(sum)}});
  // Checks the header the way safetensors' reader does, the tensor values, and recomputes the
  // FNV-1a checksum, so the algorithm documented in safetensors.h is what the code does.
  const std::string script = R"PY(
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
assert n % 8 == 0 and 8 + n <= len(raw)
h = json.loads(raw[8:8 + n])
buf = raw[8 + n:]
meta = h.pop('__metadata__')
ranges = sorted(v['data_offsets'] for v in h.values())
pos = 0
for b, e in ranges:
    assert b == pos, (b, pos)
    pos = e
assert pos == len(buf)
w = h['layer.weight']
assert w['dtype'] == 'F32' and w['shape'] == [2, 3]
b, e = w['data_offsets']
vals = struct.unpack('<6f', buf[b:e])
assert vals == (1, 2, 3, 4, 5, 6), vals
x = 0xcbf29ce484222325
for c in buf[b:e]:
    x = ((x ^ c) * 0x100000001b3) % 2**64
assert meta['weight_fnv1a64'] == '%016x' % x, (meta, '%016x' % x)
assert h['step']['shape'] == [] and struct.unpack('<q', buf[slice(*h['step']['data_offsets'])]) == (42,)
)PY";
  const auto script_path = dir / "check.py";
  nanoddp::nn::testing::write_bytes(script_path, script);
  const std::string command = "python3 " + script_path.string() + " " + path.string();
  CHECK(std::system(command.c_str()) == 0);
}

TEST_CASE("safetensors: corrupted files are refused with clear messages") {
  ScratchDir dir;
  Sample s;
  const auto good_path = dir / "good.safetensors";
  write_safetensors(good_path, s.entries(), {{"k", "v"}});
  const std::string good = read_bytes(good_path);
  const auto path = dir / "bad.safetensors";
  const std::string file = path.string();

  write_bytes(path, good.substr(0, good.size() - 1));  // truncated data
  error_message([&] { read_safetensors(path); }, {file, "outside"});

  write_bytes(path, good.substr(0, 5));
  error_message([&] { read_safetensors(path); }, {file, "fewer than the 8-byte"});

  write_bytes(path, good.substr(0, 40));  // truncated header
  error_message([&] { read_safetensors(path); }, {file, "header length", "truncated"});

  std::string flipped = good;
  flipped[7] = '\x40';  // header length's top byte flipped: absurd length
  write_bytes(path, flipped);
  error_message([&] { read_safetensors(path); }, {file, "header length"});

  std::string extra = good + "trailing";
  write_bytes(path, extra);
  error_message([&] { read_safetensors(path); }, {file, "cover", "data buffer"});

  write_bytes(path, safetensors_file("{\"a\": {\"dtype\": \"F32\", ", floats({1})));
  error_message([&] { read_safetensors(path); }, {file, "not valid JSON"});

  write_bytes(path, safetensors_file("[1, 2]", ""));
  error_message([&] { read_safetensors(path); }, {file, "start with '{'"});

  // Overlapping: b reuses a's bytes.
  write_bytes(path, safetensors_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     floats({1, 2})));
  error_message([&] { read_safetensors(path); }, {file, "overlap", "contiguous"});

  // A gap between tensors.
  write_bytes(path, safetensors_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                     floats({1, 2, 3})));
  error_message([&] { read_safetensors(path); }, {file, "'b'", "gap"});

  // Size does not match shape * dtype.
  write_bytes(path, safetensors_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                     floats({1, 2})));
  error_message([&] { read_safetensors(path); }, {file, "'a'", "8 bytes", "need 12"});

  write_bytes(path, safetensors_file(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})",
                                     floats({1, 2})));
  error_message([&] { read_safetensors(path); }, {file, "unknown dtype 'Q7'", "F32"});

  write_bytes(path, safetensors_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                                     floats({1, 2})));
  error_message([&] { read_safetensors(path); }, {file, "shape"});

  // A shape whose byte size overflows 64 bits is named as such (it said "spans 8 bytes but its
  // shape and dtype need 0").
  write_bytes(path, safetensors_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                                     R"("data_offsets":[0,8]}})",
                                     floats({1, 2})));
  error_message([&] { read_safetensors(path); }, {file, "'a'", "4294967296", "64 bits"});

  write_bytes(path, safetensors_file(R"({"a":{"dtype":"F32","shape":[2]}})", floats({1, 2})));
  error_message([&] { read_safetensors(path); }, {file, "data_offsets"});

  write_bytes(path, safetensors_file(R"({"__metadata__":{"step":3}})", ""));
  error_message([&] { read_safetensors(path); }, {file, "step", "non-string"});
}

TEST_CASE("safetensors: writer argument and I/O errors") {
  ScratchDir dir;
  const std::vector<float> v(4, 1.0f);
  const std::vector<SafetensorsEntry> duplicate = {{"a", "F32", {4}, v.data()},
                                                   {"a", "BF16", {2}, v.data()}};
  error_message([&] { write_safetensors(dir / "d.safetensors", duplicate); }, {"'a'", "twice"});
  const std::vector<SafetensorsEntry> bad_dtype = {{"a", "float", {4}, v.data()}};
  error_message([&] { write_safetensors(dir / "d.safetensors", bad_dtype); },
                {"d.safetensors", "'float'", "F32"});
  const std::vector<SafetensorsEntry> null_data = {{"a", "F32", {4}, nullptr}};
  error_message([&] { write_safetensors(dir / "d.safetensors", null_data); }, {"no data"});
  const std::vector<SafetensorsEntry> ok = {{"a", "F32", {4}, v.data()}};
  error_message([&] { write_safetensors(dir / "missing" / "d.safetensors", ok); },
                {"missing/d.safetensors", "No such file or directory"});
  if (::geteuid() != 0) {  // root ignores directory permissions
    std::filesystem::create_directory(dir / "ro");
    std::filesystem::permissions(
        dir / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    error_message([&] { write_safetensors(dir / "ro" / "d.safetensors", ok); },
                  {"ro/d.safetensors", "Permission denied"});
    std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_all);
  }
  // Overwriting keeps no temporary files around.
  write_safetensors(dir / "d.safetensors", ok);
  write_safetensors(dir / "d.safetensors", ok, {{"x", "y"}});
  CHECK(read_safetensors(dir / "d.safetensors").metadata().at("x") == "y");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    files += entry.path().filename().string().find(".tmp") != std::string::npos;
  }
  CHECK(files == 0);
}

TEST_CASE("safetensors: a failing write names the path and keeps the old file") {
  // A full disk cannot be simulated without mounting a small file system, but a file-size limit
  // makes write() fail (EFBIG) on the same code path as ENOSPC.
  ScratchDir dir;
  const std::vector<float> small(1, 1.0f), big(4096, 2.0f);
  const std::vector<SafetensorsEntry> old_entries = {{"w", "F32", {1}, small.data()}};
  const std::vector<SafetensorsEntry> new_entries = {{"w", "F32", {4096}, big.data()}};
  const auto path = dir / "c.safetensors";
  write_safetensors(path, old_entries);
  const std::string before = read_bytes(path);

  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  const auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 1024;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  std::string message;
  try {
    write_safetensors(path, new_entries);
  } catch (const nanoddp::Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, saved_handler);
  INFO(message);
  CHECK(message.find(path.string()) != std::string::npos);
  CHECK(message.find("File too large") != std::string::npos);
  CHECK(message.find("unchanged") != std::string::npos);
  CHECK(read_bytes(path) == before);
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++entries;
  }
  CHECK(entries == 1);  // the temporary file was removed
}

TEST_CASE("checksum: FNV-1a 64 test vectors and streaming") {
  CHECK(checksum("", 0) == 0xcbf29ce484222325ull);
  CHECK(checksum("a", 1) == 0xaf63dc4c8601ec8cull);
  CHECK(checksum("foobar", 6) == 0x85944171f73967e8ull);
  CHECK(checksum("bar", 3, checksum("foo", 3)) == checksum("foobar", 6));
  CHECK(checksum_hex(0xaf63dc4c8601ec8cull) == "af63dc4c8601ec8c");
  CHECK(checksum_hex(1) == "0000000000000001");
  // A single flipped bit changes it.
  std::vector<float> v(1000, 1.0f);
  const auto before = checksum(v.data(), v.size() * 4);
  v[500] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v[500]) ^ 1u);
  CHECK(checksum(v.data(), v.size() * 4) != before);
}

TEST_CASE("safetensors: deep nesting and huge entries give a short error, not a crash") {
  // 100,000 nested arrays inside a tensor's shape: valid JSON, parsed without recursion, but
  // printing it into the error recursed once per level and overflowed the stack (issue #13).
  ScratchDir dir;
  const auto path = dir / "deep.safetensors";
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_bytes(path,
              safetensors_file(
                  R"({"t":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", ""));
  std::string message =
      error_message([&] { read_safetensors(path); }, {path.string(), "levels deep"});
  CHECK(message.size() < 1000);
  message = error_message([&] { nanoddp::nn::read_safetensors_metadata(path); }, {"levels deep"});
  CHECK(message.size() < 1000);

  // A megabyte-long dtype and metadata value: the message quotes an excerpt, not all of it.
  const std::string huge(1 << 20, 'x');
  write_bytes(path, safetensors_file(
                        R"({"t":{"dtype":")" + huge + R"(","shape":[1],"data_offsets":[0,4]}})",
                        floats({1})));
  message = error_message([&] { read_safetensors(path); }, {"unknown dtype", "characters in all"});
  CHECK(message.size() < 2000);
  write_bytes(path, safetensors_file(R"({"__metadata__":{"k":[")" + huge + R"("]}})", ""));
  message = error_message([&] { read_safetensors(path); }, {"non-string value"});
  CHECK(message.size() < 2000);
}

TEST_CASE("safetensors: a large file that is not safetensors is refused before it is read") {
  // 64 GiB, sparse: reading it whole took minutes and all the memory; the first 9 bytes suffice.
  ScratchDir dir;
  const auto path = dir / "big.bin";
  write_bytes(path, "not a safetensors file");
  std::filesystem::resize_file(path, std::uintmax_t{64} << 30);
  error_message([&] { read_safetensors(path); }, {path.string(), "header length"});
  error_message([&] { nanoddp::nn::read_safetensors_metadata(path); }, {"header length"});
}

TEST_CASE("safetensors: read_safetensors_metadata reads the header only") {
  ScratchDir dir;
  Sample s;
  const auto path = dir / "m.safetensors";
  write_safetensors(path, s.entries(), {{"run_id", "abc"}, {"step", "7"}});
  const SafetensorsMetadata md = nanoddp::nn::read_safetensors_metadata(path);
  CHECK(md == SafetensorsMetadata{{"run_id", "abc"}, {"step", "7"}});
  // The data are not read: a truncated data buffer does not matter here (read_safetensors
  // refuses the file).
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 4));
  CHECK(nanoddp::nn::read_safetensors_metadata(path) == md);
  error_message([&] { read_safetensors(path); }, {"outside"});
}

TEST_CASE("excerpt and escape_controls: a file's text cannot steer the terminal or add a line") {
  using nanoddp::nn::escape_controls;
  using nanoddp::nn::excerpt;
  CHECK(escape_controls("plain, ünïcode ✓") == "plain, ünïcode ✓");
  CHECK(escape_controls("a\x1b[2Jb\x07\x7f\t\r\n") == "a\\x1b[2Jb\\x07\\x7f\\t\\r\\n");
  CHECK(escape_controls("one\ntwo", true) == "one\ntwo");
  CHECK(escape_controls("csi \xc2\x9b"
                        "2J, nbsp \xc2\xa0") == "csi \\u009b2J, nbsp \xc2\xa0");
  CHECK(excerpt("x\ny") == "x\\ny");
  // Bytes that are not well-formed UTF-8 (a lone 8-bit CSI, an overlong form, a cut character,
  // a surrogate), line separators and bidirectional overrides.
  CHECK(escape_controls("a\x9b"
                        "2J \xc0\xaf \xe2\x82 \xed\xa0\x80 \xff") ==
        "a\\x9b2J \\xc0\\xaf \\xe2\\x82 \\xed\\xa0\\x80 \\xff");
  CHECK(escape_controls("ab\u202ecd\u2028\u2066 \u20ac \U0001F600") ==
        "ab\\u202ecd\\u2028\\u2066 \u20ac \U0001F600");
  // Cut before a character, not inside its UTF-8 bytes ("é" is 2 bytes).
  CHECK(excerpt("aé", 2) == "a... (3 characters in all)");
  CHECK(excerpt("\x1b\x1b\x1b", 2) == "\\x1b\\x1b... (3 characters in all)");
}
