#pragma once
// A tmpfs of a given size mounted on a fresh folder for a test's lifetime, to fill a disk for
// real. Mounting needs root (CI runs as root): elsewhere the test says it skipped, visibly.

#include <doctest/doctest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace nanoddp::testing {

struct SmallDisk {
  std::string path;
  bool mounted = false;
  SmallDisk(const std::string& dir, const char* size) : path(dir) {
    std::filesystem::create_directories(path);
    mounted =
        ::mount("tmpfs", path.c_str(), "tmpfs", 0, (std::string("size=") + size).c_str()) == 0;
    if (!mounted) {
      MESSAGE("SKIPPED: cannot mount a tmpfs here (needs root): ", std::strerror(errno));
    }
  }
  ~SmallDisk() {
    if (mounted) ::umount2(path.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
};

}  // namespace nanoddp::testing
