#pragma once
// Output files named on a command line: that none is an input (or another output) of the same
// run, by identity rather than by spelling, so that `--json t.json` cannot truncate the
// --profile t.json it was about to read, through a symlink or a hard link as well.
//
// Header-only, like cli.h: a dependency of the executables only.

#include <sys/stat.h>

#include <filesystem>
#include <string>

namespace nanoddp::common {

// True when `a` and `b` name the same file: the same device and inode when both exist (a
// symlink or hard link counts), else the same absolute, normalised path.
inline bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  std::error_code ec;
  const auto pa = std::filesystem::weakly_canonical(a, ec);
  if (ec) return false;
  const auto pb = std::filesystem::weakly_canonical(b, ec);
  return !ec && pa == pb;
}

}  // namespace nanoddp::common
