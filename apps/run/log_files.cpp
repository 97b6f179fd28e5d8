#include "log_files.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "common/rescue.h"
#include "output.h"

namespace nanoddp::run {

namespace fs = std::filesystem;

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

std::string not_regular(mode_t mode) {
  const std::string kind = kind_of(mode);
  return kind.starts_with("not ") ? kind : kind + ", not a regular file";
}

// Copies the whole file `fd` holds (it may have no name left: read through /proc/self/fd) to
// `target`, which must not exist: written to a temporary name, then renamed without replacing.
// 0 or the errno of the failure (EEXIST: `target` exists).
int copy_to_new_file(int fd, const std::string& target) {
  const comm::UniqueFd in(
      ::open(fmt::format("/proc/self/fd/{}", fd).c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return errno;
  const std::string temp = fmt::format("{}.nanoddp-run-{}.tmp", target, ::getpid());
  comm::UniqueFd out(
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK, 0644));
  if (!out) return errno;
  int error = 0;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(in.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n <= 0) break;
    if ((error = write_all(out.get(), std::string_view(buffer, static_cast<std::size_t>(n))))) {
      break;
    }
  }
  if (error == 0 && ::fsync(out.get()) != 0) error = errno;
  out.reset();
  if (error == 0 &&
      ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
    error = errno;
    if (error == EINVAL) {  // a file system without RENAME_NOREPLACE: link() does not replace
      error = ::link(temp.c_str(), target.c_str()) == 0 ? 0 : errno;
    }
  }
  ::unlink(temp.c_str());  // after a rename: already gone
  return error;
}

}  // namespace

std::string log_path(const std::string& dir, int rank) {
  return fmt::format("{}/rank_{}.log", dir, rank);
}

std::optional<std::string> unusable_log_entry(const std::string& dir) {
  static const std::regex kLogName(R"(rank_[0-9]+\.log)");
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!std::regex_match(it->path().filename().string(), kLogName)) continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0 || S_ISREG(st.st_mode)) continue;  // dangling: made
    return fmt::format(
        "--log-dir: '{}' is {}: nanoddp-run appends each rank's lines to its rank_R.log there, "
        "and a FIFO or a device could stall the whole job; remove it, or choose another "
        "--log-dir",
        it->path().string(), not_regular(st.st_mode));
  }
  return std::nullopt;
}

OpenedLog open_log(const std::string& path) {
  OpenedLog log;
  // stat first: opening a device can act on it (a tape rewinds), even with O_NONBLOCK.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    log.error = "is " + not_regular(st.st_mode);
    return log;
  }
  log.fd.reset(::open(path.c_str(),
                      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0644));
  if (!log.fd) {
    // ENXIO: a FIFO without a reader (made since the stat) or a socket.
    log.error = errno == ENXIO ? "is a FIFO or a socket, not a regular file" : std::strerror(errno);
    return log;
  }
  if (::fstat(log.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    log.fd.reset();
    log.error = "is " + not_regular(st.st_mode);
  }
  return log;
}

std::optional<std::string> keep_log_reachable(int fd, const std::string& path, int rank) {
  struct stat held {};
  struct stat named {};
  if (::fstat(fd, &held) != 0) return std::nullopt;
  const bool has_name = ::stat(path.c_str(), &named) == 0;
  if (has_name && named.st_dev == held.st_dev && named.st_ino == held.st_ino) return std::nullopt;

  if (held.st_nlink > 0) {  // renamed (or linked elsewhere and then unlinked here)
    std::error_code ec;
    const fs::path now = fs::read_symlink(fmt::format("/proc/self/fd/{}", fd), ec);
    return fmt::format(
        "warning: --log-dir: '{}' was renamed during the attempt: rank {}'s lines went on into "
        "it under its new name, '{}'{}",
        path, rank, ec ? std::string("(unknown)") : now.string(),
        has_name ? fmt::format("; '{}' now names another file, left as it is", path) : "");
  }

  // Removed: its lines went on into a file no name reaches. Write it back under its name,
  // unless that name now holds another file, which is not the launcher's to overwrite.
  std::error_code ec;
  const fs::path folder = fs::path(path).parent_path();
  const bool folder_gone = !fs::exists(folder, ec);
  fs::create_directories(folder, ec);
  const int error = copy_to_new_file(fd, path);
  if (error == 0) {
    return fmt::format(
        "warning: --log-dir: '{}' was removed during the attempt{}: written again, whole, from "
        "the file the launcher held open",
        path, folder_gone ? " with its folder, made again" : "");
  }
  const std::string why = error == EEXIST
                              ? "its name now holds another file, left as it is"
                              : fmt::format("it cannot be written again: {}", std::strerror(error));
  const std::string name = fmt::format("rank_{}.log", rank);
  std::string problem;
  const std::string rescued = common::rescue(
      [&](const std::string& dir) {
        if (const int failed = copy_to_new_file(fd, dir + "/" + name)) {
          throw std::runtime_error(std::strerror(failed));
        }
      },
      &problem);
  if (rescued.empty()) {
    return fmt::format(
        "warning: --log-dir: '{}' was removed during the attempt and {}; rescuing rank {}'s log "
        "failed too ({}): its lines of this attempt are lost",
        path, why, rank, problem);
  }
  return fmt::format(
      "warning: --log-dir: '{}' was removed during the attempt and {}: rank {}'s whole log is in "
      "'{}/{}'",
      path, why, rank, rescued, name);
}

}  // namespace nanoddp::run
