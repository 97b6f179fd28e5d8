#include "benchmarks/sim/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

std::string read_input_file(const std::string& flag, const std::string& path,
                            std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer would block here, before fstat can refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{} {}: cannot open the file: {}", flag, path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) fail("{} {}: cannot read it: {}", flag, path, std::strerror(errno));
  if (!S_ISREG(info.st_mode)) {
    fail("{} {}: not a regular file ({}); give the file the benchmark or trace wrote", flag, path,
         S_ISDIR(info.st_mode)    ? "a folder"
         : S_ISFIFO(info.st_mode) ? "a FIFO"
         : S_ISCHR(info.st_mode)  ? "a character device"
         : S_ISBLK(info.st_mode)  ? "a block device"
                                  : "a socket or other special file");
  }
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
  return text;
}

}  // namespace nanoddp::sim
