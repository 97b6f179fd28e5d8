#pragma once
// Helpers for the data and file-format tests: a scratch directory per test, raw file writes,
// and an assertion that an Error's message mentions given words.

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>

#include "nanoddp/kernels/error.h"

namespace nanoddp::nn::testing {

// A fresh directory under the system temp directory, removed with its contents at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ =
        std::filesystem::temp_directory_path() / ("nanoddp-nn-test-" + std::to_string(::getpid()) +
                                                  "-" + std::to_string(counter.fetch_add(1)));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `f`, requires it to throw nanoddp::Error, and requires the message to contain every one
// of `words`. Returns the message for further checks.
template <typename F>
std::string error_message(F&& f, std::initializer_list<std::string_view> words) {
  std::string message;
  try {
    f();
  } catch (const nanoddp::Error& e) {
    message = e.what();
  }
  INFO("message: " << message);
  REQUIRE_FALSE(message.empty());
  for (const std::string_view word : words) {
    INFO("expected the message to mention: " << word);
    CHECK(message.find(word) != std::string::npos);
  }
  return message;
}

inline bool have_python3() {
  return std::system("python3 -c 'import json, struct' 2>/dev/null") == 0;
}

}  // namespace nanoddp::nn::testing
