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

// The file `path` names, as an absolute path with every symlink followed that can be: the
// existing part resolved by weakly_canonical, then a dangling symlink's target (weakly_canonical
// leaves it as is), so that "x", "./x" and a link to a file not yet written all resolve to one
// path before anything is written.
inline std::filesystem::path resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal();
  for (int hops = 0; hops < 40; ++hops) {  // 40: the kernel's own limit on a chain of links
    const fs::path c = fs::weakly_canonical(p, ec);
    if (ec) return p.lexically_normal();
    if (!fs::is_symlink(fs::symlink_status(c, ec))) return c;
    const fs::path target = fs::read_symlink(c, ec);
    if (ec) return c;
    p = target.is_absolute() ? target : c.parent_path() / target;
  }
  return p.lexically_normal();
}

// True when `a` and `b` name the same file: the same device and inode when both exist (a
// symlink or hard link counts), else the same resolved path (see resolved_path).
inline bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  return resolved_path(a) == resolved_path(b);
}

}  // namespace nanoddp::common
