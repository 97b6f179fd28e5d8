#pragma once
// What identifies an input file in nanoddp-sim's JSON: its size and SHA-256, beside its path, so
// a result can be matched to the very measurement or trace it was computed from (a path alone
// can be overwritten by a later run).

#include <cstdint>
#include <string>

namespace nanoddp::sim {

struct FileDigest {
  std::uintmax_t bytes = 0;
  std::string sha256;  // lowercase hex, as sha256sum prints it
};

// Throws SimError naming `flag` and the path when the file cannot be read.
FileDigest digest_file(const std::string& path, const std::string& flag);

// SHA-256 (FIPS 180-4) of `data`, lowercase hex.
std::string sha256_hex(const std::string& data);

}  // namespace nanoddp::sim
