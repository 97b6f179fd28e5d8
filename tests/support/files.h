#pragma once
// A file's whole contents, for tests that check what a program wrote.

#include <fstream>
#include <iterator>
#include <string>

namespace nanoddp::testing {

// "" when the file cannot be read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace nanoddp::testing
