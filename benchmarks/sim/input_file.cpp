#include "benchmarks/sim/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

namespace {

const char* file_kind(mode_t mode) {
  return S_ISDIR(mode)    ? "a folder"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "a special file";
}

[[noreturn]] void fail_not_regular(const std::string& flag, const std::string& path, mode_t mode) {
  fail("{} {}: not a regular file ({}); give the file the benchmark or trace wrote", flag, path,
       file_kind(mode));
}

}  // namespace

std::string read_input_file(const std::string& flag, const std::string& path,
                            std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer would block here, before fstat can refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    // A UNIX socket cannot be opened at all (ENXIO, "No such device or address"): say what the
    // path is rather than what open() says.
    struct stat info {};
    if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      fail_not_regular(flag, path, info.st_mode);
    }
    fail("{} {}: cannot open the file: {}", flag, path, std::strerror(error));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) fail("{} {}: cannot read it: {}", flag, path, std::strerror(errno));
  if (!S_ISREG(info.st_mode)) fail_not_regular(flag, path, info.st_mode);
  const auto size = static_cast<std::uint64_t>(info.st_size);
  if (size > max_bytes) {
    fail(
        "{} {}: {} bytes, more than the {} bytes nanoddp-sim reads; a few traced steps are "
        "enough (nanoddp-train --trace-steps), or keep the rows of the sizes you fit",
        flag, path, size, max_bytes);
  }
  std::string text(size, '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{} {}: reading it failed: {}", flag, path, std::strerror(errno));
    if (n == 0) break;  // shortened while read: what is there
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  // Every input is JSON text, where a NUL byte cannot appear (not even inside a string): one is
  // a binary file or a damaged one (a file whose end a crash left as zeros), which the parser
  // would report as "unexpected end of input" or a bad literal.
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    fail(
        "{} {}: holds a NUL byte at offset {}: a binary or damaged file, not the JSON text the "
        "benchmark or trace wrote; give that file",
        flag, path, nul);
  }
  return text;
}

}  // namespace nanoddp::sim
