#include "nanoddp/nn/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

#include "nanoddp/kernels/error.h"

namespace nanoddp::nn {
namespace {

std::string errno_text(int error) {
  return std::strerror(error);
}

// Closes a descriptor on scope exit unless released.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

constexpr std::string_view kTemporaryMark = ".tmp.";

// The temporary name: hidden, next to the target, unique per host, process and call so
// concurrent writers (several ranks saving into one directory by mistake, on one machine or
// several) never share a temporary file.
std::filesystem::path temp_path_for(const std::filesystem::path& path) {
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temp = path;
  temp.replace_filename(fmt::format(".{}{}{}.{}.{}", path.filename().string(), kTemporaryMark,
                                    this_host(), static_cast<long>(::getpid()),
                                    counter.fetch_add(1)));
  return temp;
}

void write_all(int fd, const std::byte* data, std::size_t size, const std::filesystem::path& temp,
               const std::filesystem::path& path) {
  while (size > 0) {
    const ::ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::unlink(temp.c_str());
      fail(
          "cannot write '{}': writing the temporary file '{}' failed: {}. Check free disk space "
          "and permissions of the directory; the previous '{}' (if any) is unchanged.",
          path.string(), temp.string(), errno_text(error), path.filename().string());
    }
    data += written;
    size -= static_cast<std::size_t>(written);
  }
}

}  // namespace

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  // Part of file names: a '/' (which only sethostname() lets in) would make them paths.
  std::string host = name;
  std::replace(host.begin(), host.end(), '/', '_');
  return host;
}

std::optional<TemporaryWriter> temporary_writer(const std::string& filename) {
  // ".<target>.tmp.<host>.<pid>.<k>": the host may hold dots, so pid and k are read from the end,
  // and the target may hold ".tmp." (a --save x.tmp.st; a staged output's own name does), so the
  // mark is the last one.
  const auto mark = filename.rfind(kTemporaryMark);
  if (!filename.starts_with('.') || mark == std::string::npos) return std::nullopt;
  const std::string_view rest = std::string_view(filename).substr(mark + kTemporaryMark.size());
  const auto last_dot = rest.rfind('.');
  if (last_dot == std::string_view::npos || last_dot == 0) return std::nullopt;
  const auto pid_dot = rest.rfind('.', last_dot - 1);
  if (pid_dot == std::string_view::npos || pid_dot == 0) return std::nullopt;
  TemporaryWriter writer{.host = std::string(rest.substr(0, pid_dot))};
  const std::string_view pid = rest.substr(pid_dot + 1, last_dot - pid_dot - 1);
  const auto [end, ec] = std::from_chars(pid.data(), pid.data() + pid.size(), writer.pid);
  if (ec != std::errc() || end != pid.data() + pid.size() || writer.pid <= 0) return std::nullopt;
  return writer;
}

void remove_stale_temporaries(const std::filesystem::path& dir, std::string_view prefix) {
  std::error_code ec;
  const std::string host = this_host();
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::optional<TemporaryWriter> writer = temporary_writer(name);
    if (!writer || writer->host != host || writer->pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(writer->pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

std::int64_t shape_numel_checked(std::span<const std::int64_t> shape) {
  // A zero anywhere makes the product 0, however large the other sizes: the parser accepted
  // such a shape (it holds no data), so multiplying in order could overflow before reaching
  // the zero (found by fuzzing).
  for (const std::int64_t d : shape) {
    if (d == 0) return 0;
  }
  std::int64_t n = 1;
  for (const std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) fail("a shape's element count overflows 64 bits");
  }
  return n;
}

namespace {

// Opens a regular file for reading; throws naming the path.
int open_regular_file(const std::filesystem::path& path, std::uint64_t* size) {
  // O_NONBLOCK: opening a FIFO without a writer would block here, before the check below can
  // refuse it (for a regular file the flag changes nothing).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    fail("cannot open '{}' for reading: {}", path.string(), errno_text(error));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail("cannot read '{}': fstat failed: {}", path.string(), errno_text(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail("cannot read '{}': it is not a regular file", path.string());
  }
  *size = static_cast<std::uint64_t>(info.st_size);
  return fd;
}

// Reads up to `size` bytes at `offset`; returns how many (fewer only at the end of the file).
std::size_t read_at(int fd, const std::filesystem::path& path, std::uint64_t offset, std::byte* out,
                    std::size_t size) {
  std::size_t done = 0;
  while (done < size) {
    const ::ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      fail("cannot read '{}': {}", path.string(), errno_text(error));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

}  // namespace

std::string excerpt(std::string_view text, std::size_t max_chars) {
  if (text.size() <= max_chars) return escape_controls(text);
  // Cut at a character's first byte, never inside a UTF-8 sequence.
  std::size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} characters in all)", escape_controls(text.substr(0, cut)),
                     text.size());
}

namespace {

// The length of the well-formed UTF-8 character at text[i] (2 to 4 bytes; RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto at = [&](std::size_t k) {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u;
  };
  const unsigned c = at(0);
  const auto tail = [&](std::size_t k) { return (at(k) & 0xC0u) == 0x80u; };
  if (c >= 0xC2 && c <= 0xDF) return tail(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return at(1) >= lo && at(1) <= hi && tail(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return at(1) >= lo && at(1) <= hi && tail(2) && tail(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string escape_controls(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0u;
    if (c >= 0x80) {
      // A byte of a well-formed UTF-8 character passes (but not the C1 controls, U+0080-U+009F);
      // any other (a lone 0x9b is the 8-bit CSI to a terminal not in UTF-8) is escaped.
      // The line and paragraph separators and the bidirectional overrides (U+2028-U+202E,
      // U+2066-U+2069: a line that reads in another order than it is) are escaped too.
      const std::size_t length = utf8_length(text, i);
      const unsigned point = length == 3 ? (c & 0x0Fu) << 12 | (next & 0x3Fu) << 6 |
                                               (static_cast<unsigned char>(text[i + 2]) & 0x3Fu)
                                         : 0u;
      if (length == 0) {
        out += fmt::format("\\x{:02x}", c);
      } else if (c == 0xC2 && next <= 0x9F) {
        out += fmt::format("\\u{:04x}", next);
      } else if ((point >= 0x2028 && point <= 0x202E) || (point >= 0x2066 && point <= 0x2069)) {
        out += fmt::format("\\u{:04x}", point);
      } else {
        out.append(text.substr(i, length));
      }
      if (length > 0) i += length - 1;
    } else if (c == '\n' && keep_newlines) {
      out += '\n';
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

FileHead read_file_head(const std::filesystem::path& path, std::size_t max_bytes) {
  FileHead head;
  FdGuard guard(open_regular_file(path, &head.file_size));
  head.bytes.resize(static_cast<std::size_t>(std::min<std::uint64_t>(max_bytes, head.file_size)));
  head.bytes.resize(read_at(guard.get(), path, 0, head.bytes.data(), head.bytes.size()));
  return head;
}

void read_file_range(const std::filesystem::path& path, std::uint64_t offset, std::byte* out,
                     std::size_t size) {
  std::uint64_t file_size = 0;
  FdGuard guard(open_regular_file(path, &file_size));
  const std::size_t got = read_at(guard.get(), path, offset, out, size);
  if (got != size) {
    fail(
        "cannot read '{}': it ended after {} of the {} bytes expected at offset {} (is another "
        "process writing it?)",
        path.string(), offset + got, offset + size, offset);
  }
}

std::uint64_t file_checksum(const std::filesystem::path& path) {
  std::uint64_t file_size = 0;
  FdGuard guard(open_regular_file(path, &file_size));
  // Four independent lanes of xxHash64's round (multiply, rotate, multiply) over 8-byte words,
  // so the multiplies overlap; the tail and the size are folded in at the end.
  constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full;
  const auto round = [](std::uint64_t acc, std::uint64_t word) {
    acc += word * kP2;
    acc = (acc << 31) | (acc >> 33);
    return acc * kP1;
  };
  std::uint64_t lanes[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  std::vector<std::byte> block(1u << 20);
  std::uint64_t offset = 0, tail = 0;
  while (true) {
    const std::size_t got = read_at(guard.get(), path, offset, block.data(), block.size());
    std::size_t i = 0;
    for (; i + 32 <= got; i += 32) {
      for (int lane = 0; lane < 4; ++lane) {
        std::uint64_t word;
        std::memcpy(&word, block.data() + i + 8 * lane, 8);
        lanes[lane] = round(lanes[lane], word);
      }
    }
    for (; i < got; ++i)
      tail = (tail ^ std::to_integer<std::uint64_t>(block[i])) * 0x100000001b3ull;
    offset += got;
    if (got < block.size()) break;
  }
  std::uint64_t h = offset * kP1;
  for (const std::uint64_t lane : lanes) h = round(h ^ lane, lane);
  h = round(h, tail);
  h ^= h >> 33;
  h *= kP2;
  return h ^ (h >> 29);
}

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: no block
  if (fd < 0) {
    const int error = errno;
    fail("cannot open '{}' for reading: {}", path.string(), errno_text(error));
  }
  FdGuard guard(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    fail("cannot read '{}': fstat failed: {}", path.string(), errno_text(error));
  }
  if (!S_ISREG(info.st_mode)) fail("cannot read '{}': it is not a regular file", path.string());
  std::vector<std::byte> bytes;
  try {
    bytes.resize(static_cast<std::size_t>(info.st_size));
  } catch (const std::bad_alloc&) {
    fail("cannot read '{}': its {} bytes do not fit in memory", path.string(),
         static_cast<long long>(info.st_size));
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      fail("cannot read '{}': {}", path.string(), errno_text(error));
    }
    if (got == 0) {
      fail(
          "cannot read '{}': the file shrank from {} to {} bytes while being read (is another "
          "process writing it?)",
          path.string(), bytes.size(), done);
    }
    done += static_cast<std::size_t>(got);
  }
  return bytes;
}

FileIdentity write_file_atomically(const std::filesystem::path& requested,
                                   std::span<const std::span<const std::byte>> chunks) {
  if (requested.filename().empty()) {
    fail("cannot write '{}': the path names no file", requested.string());
  }
  // The new file is renamed over the name. Through a symlink, the file it points to is the one
  // replaced (the link stays). A device (/dev/null, as root), a FIFO or a folder would itself be
  // replaced instead of written to: refused.
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::is_symlink(requested, ec)
                                         ? std::filesystem::weakly_canonical(requested, ec)
                                         : requested;
  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    fail(
        "cannot write '{}': it exists and is not a regular file (a device, FIFO or folder), which "
        "writing by rename would replace; name a regular file",
        requested.string());
  }
  std::filesystem::path temp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temp = temp_path_for(path);
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int error = errno;
    fail(
        "cannot write '{}': creating the temporary file '{}' failed: {}. The directory must "
        "exist and be writable.",
        path.string(), temp.string(), errno_text(error));
  }
  FdGuard guard(fd);
  for (const std::span<const std::byte> chunk : chunks) {
    write_all(fd, chunk.data(), chunk.size(), temp, path);
  }
  struct stat written {};
  ::fstat(fd, &written);  // on an open descriptor: cannot fail
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    fail("cannot write '{}': fsync of the temporary file '{}' failed: {}", path.string(),
         temp.string(), errno_text(error));
  }
  // close() can report a deferred write error (NFS, some full-disk cases): check it.
  if (::close(guard.release()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    fail("cannot write '{}': closing the temporary file '{}' failed: {}", path.string(),
         temp.string(), errno_text(error));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    fail("cannot write '{}': renaming the temporary file '{}' over it failed: {}", path.string(),
         temp.string(), errno_text(error));
  }
  // Make the rename durable. The data is already safe under the new name in the page cache, so
  // a directory that cannot be opened or fsynced (some network file systems) is reported.
  std::filesystem::path directory = path.parent_path();
  if (directory.empty()) directory = ".";
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int error = errno;
    fail("wrote '{}' but cannot open its directory to fsync it: {}", path.string(),
         errno_text(error));
  }
  FdGuard dir_guard(dir_fd);
  if (::fsync(dir_fd) != 0 && errno != EINVAL) {
    const int error = errno;
    fail("wrote '{}' but fsync of its directory '{}' failed: {}", path.string(), directory.string(),
         errno_text(error));
  }
  return {.device = written.st_dev, .inode = written.st_ino};
}

}  // namespace nanoddp::nn
