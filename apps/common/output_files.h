#pragma once
// Output files named on a command line: that none is an input (or another output) of the same
// run, by identity rather than by spelling, so that `--json t.json` cannot truncate the
// --profile t.json it was about to read, through a symlink or a hard link as well.
//
// Header-only, like cli.h: a dependency of the executables only.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nanoddp::common {

// The file `path` names, as an absolute path with every symlink followed that can be: the
// existing part resolved by weakly_canonical, then a dangling symlink's target (weakly_canonical
// stops there and leaves the rest as it is), whether it is the last component (a link to a file
// not yet written) or a folder (a folder replaced by a link to one that does not exist), so
// that "x", "./x" and such links all resolve to one path before anything is written.
inline std::filesystem::path resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal();
  for (int hops = 0; hops < 40; ++hops) {  // 40: the kernel's own limit on a chain of links
    const fs::path c = fs::weakly_canonical(p, ec);
    if (ec) return p.lexically_normal();
    // Every link on c's resolved part is followed: a component that is still a link dangles.
    fs::path prefix;
    fs::path rest;
    bool dangling = false;
    for (const fs::path& part : c) {
      if (dangling) {
        rest /= part;
        continue;
      }
      prefix /= part;
      dangling = prefix != prefix.root_path() && fs::is_symlink(fs::symlink_status(prefix, ec));
    }
    if (!dangling) return c;
    const fs::path target = fs::read_symlink(prefix, ec);
    if (ec) return c;
    const fs::path next = target.is_absolute() ? target : prefix.parent_path() / target;
    p = rest.empty() ? next : next / rest;
  }
  return p.lexically_normal();
}

// Opens /dev/null on any of descriptors 0, 1 and 2 that is closed (a program started with
// `>&-`): the next file opened would otherwise get that number, and every line meant for
// stdout would go into it (an outside tester's --metrics file filled with progress lines).
inline void open_closed_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened >= 0 && opened != fd) {
      ::dup2(opened, fd);
      ::close(opened);
    }
  }
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

// The standard stream a path names: 1 for "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", 2 for
// the same of stderr, else 0. Such an output is written through the program's own stream, not
// reopened: reopening truncates a file the shell redirected to, or writes at another position
// than the program's own output (found by an outside tester).
inline int standard_stream(const std::string& path) {
  for (const int fd : {1, 2}) {
    for (const char* form : {"/dev/std", "/dev/fd/", "/proc/self/fd/"}) {
      const std::string name = std::string(form) == "/dev/std"
                                   ? (fd == 1 ? "/dev/stdout" : "/dev/stderr")
                                   : form + std::to_string(fd);
      if (path == name) return fd;
    }
  }
  // Any other name of the same file: "/dev//stdout", a symlink to /dev/stdout, or the very file
  // the shell redirected stdout to (opened again, a second handle would write over the
  // stream's own lines, and a resumed run would rewrite it under the stream).
  struct stat named {
  }, stream{};
  if (path.empty() || ::stat(path.c_str(), &named) != 0) return 0;
  for (const int fd : {1, 2}) {
    if (::fstat(fd, &stream) == 0 && stream.st_dev == named.st_dev &&
        stream.st_ino == named.st_ino) {
      return fd;
    }
  }
  return 0;
}

// Whether `path` names something that exists and is neither a regular file nor a folder (a
// character device such as /dev/null, a FIFO, a socket): appended to, never probed for a folder
// one could write into, read back or replaced. (A file in /dev/shm is a file.)
inline bool names_a_device(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode) && !S_ISDIR(info.st_mode);
}

// The folders a run created for its outputs while it checked them (an --checkpoint-dir, the
// folder of a --save), so that a run whose set-up fails leaves none behind. Only what this object
// itself made is touched, and only while it is still that folder and empty:
// - each folder is made with mkdir, one component of the path as given at a time, and recorded
//   (as spelled, with its device and inode) only when that mkdir made it, so "a/./b/../c" and a
//   path through a symlink record the folders made, not a lexical guess at them;
// - each is removed with rmdir, deepest first, only when statx still finds a folder with that
//   device, inode and birth time: never a file or a symlink put at its name meanwhile (rmdir
//   cannot remove them, and a file removed by path was an outside tester's data loss), never a
//   folder that has gained a file (another run's output: rmdir refuses it), nor one another job
//   holds locked (its --checkpoint-dir).
class CreatedFolders {
 public:
  CreatedFolders() = default;
  CreatedFolders(const CreatedFolders&) = delete;
  CreatedFolders& operator=(const CreatedFolders&) = delete;
  ~CreatedFolders() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      if (identity(it->path) != it->id) continue;  // not the folder made
      // A folder another job took meanwhile and holds locked (its --checkpoint-dir) stays.
      const int fd = ::open(it->path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::rmdir(it->path.c_str());  // fails when not empty
      ::close(fd);
    }
  }
  // As `mkdir -p dir`: sets `ec` to the first failure (a component that is a file: ENOTDIR or
  // EEXIST, found by the caller's folder check).
  void create(const std::string& dir, std::error_code& ec) {
    ec.clear();
    std::filesystem::path prefix;
    for (const std::filesystem::path& part : std::filesystem::path(dir)) {
      prefix /= part;
      if (part == "." || part == ".." || part == prefix.root_path() || part.empty()) continue;
      if (::mkdir(prefix.c_str(), 0777) == 0) {
        if (const std::optional<Identity> made = identity(prefix.string())) {
          made_.push_back({prefix.string(), *made});
        }
      } else if (errno != EEXIST) {
        ec.assign(errno, std::generic_category());
        return;
      }
    }
  }
  // The run has started: what it created is its output now.
  void keep() { made_.clear(); }

 private:
  // A folder's device, inode and birth time: an inode number is reused at once after a removal
  // (an outside adversary's `rm -rf out; mkdir -p out/run1` got the same numbers, and the folders
  // were removed); the birth time tells a folder made again. File systems without one (statx's
  // mask lacks STATX_BTIME) compare device and inode alone.
  struct Identity {
    std::uint64_t dev = 0, ino = 0;
    std::int64_t btime_s = 0;
    std::uint32_t btime_ns = 0;
    bool operator==(const Identity&) const = default;
  };
  static std::optional<Identity> identity(const std::string& path) {
    struct statx info {};
    if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_INO | STATX_BTIME,
                &info) != 0 ||
        !S_ISDIR(info.stx_mode)) {
      return std::nullopt;
    }
    Identity id{.dev = (std::uint64_t{info.stx_dev_major} << 32) | info.stx_dev_minor,
                .ino = info.stx_ino};
    if ((info.stx_mask & STATX_BTIME) != 0) {
      id.btime_s = info.stx_btime.tv_sec;
      id.btime_ns = info.stx_btime.tv_nsec;
    }
    return id;
  }
  struct Made {
    std::string path;
    Identity id;
  };
  std::vector<Made> made_;  // in the order made: shallowest first
};

// An exclusive advisory lock (flock) on a file, held while the object lives: two runs that
// write one file (a --metrics shared by mistake) would otherwise interleave or replace each
// other's lines without a word. Empty when the file could not be opened or was locked already.
class FileLock {
 public:
  FileLock() = default;
  // `created`: the path of the file lock_file created for the lock, else empty.
  FileLock(int fd, std::string created) : fd_(fd), created_(std::move(created)) {}
  FileLock(FileLock&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), created_(std::move(other.created_)) {}
  FileLock& operator=(FileLock&& other) noexcept {
    if (this != &other) {
      release();
      fd_ = std::exchange(other.fd_, -1);
      created_ = std::move(other.created_);
    }
    return *this;
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { release(); }
  bool held() const { return fd_ >= 0; }
  int fd() const { return fd_; }  // open on the locked file, even after its name is removed
  // The file is the run's output from now on: kept even when nothing was written to it. Until
  // then a file the lock created is removed with the lock while still empty (a run that failed
  // in its set-up left an empty output file behind).
  void keep() { created_.clear(); }

 private:
  void release() {
    if (fd_ < 0) return;
    struct stat mine {
    }, named{};
    if (!created_.empty() && ::fstat(fd_, &mine) == 0 && mine.st_size == 0 &&
        ::stat(created_.c_str(), &named) == 0 && named.st_dev == mine.st_dev &&
        named.st_ino == mine.st_ino) {
      ::unlink(created_.c_str());
    }
    ::close(fd_);  // closing the last descriptor releases the lock
    fd_ = -1;
  }
  int fd_ = -1;
  std::string created_;
};

// Locks the regular file `path`, creating it (empty) when missing: two runs starting together
// on a file that does not exist yet must not both go unlocked. Never a device or FIFO
// (O_NONBLOCK and the check). Opened for writing: NFS emulates flock with fcntl locks, whose
// exclusive kind needs it. `busy` is set when another process holds the lock; `problem` when
// the lock could not be taken for another reason (then nothing is held).
inline FileLock lock_file(const std::string& path, bool* busy = nullptr,
                          std::string* problem = nullptr) {
  if (busy != nullptr) *busy = false;
  // The file may be replaced (a resumed run renames its rewrite into place) between the open
  // and the lock: the lock must be on the file the path names now, so that is checked after.
  for (int attempt = 0; attempt < 8; ++attempt) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK, 0666);
    const bool created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      if (problem != nullptr) *problem = std::strerror(errno);
      return {};
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      return {};
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      if (busy != nullptr) *busy = error == EWOULDBLOCK;
      if (problem != nullptr && error != EWOULDBLOCK) *problem = std::strerror(error);
      ::close(fd);
      return {};
    }
    struct stat now {};
    if (::stat(path.c_str(), &now) == 0 && now.st_dev == info.st_dev && now.st_ino == info.st_ino) {
      return FileLock(fd, created ? path : std::string());
    }
    ::close(fd);  // replaced meanwhile: lock the new one
  }
  if (problem != nullptr) *problem = "the file kept being replaced";
  return {};
}

// Locks the folder `dir` itself (flock on its descriptor; nothing is created in it): two runs
// writing one --checkpoint-dir would resume from each other's checkpoints. As lock_file:
// `busy` when another process holds it, `problem` when it cannot be taken at all (some network
// file systems), then nothing is held.
inline FileLock lock_folder(const std::string& dir, bool* busy, std::string* problem) {
  *busy = false;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *problem = std::strerror(errno);
    return {};
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    *busy = error == EWOULDBLOCK;
    if (!*busy) *problem = std::strerror(error);
    ::close(fd);
    return {};
  }
  return FileLock(fd, {});
}

// What a path named when a run checked it, to tell before the run replaces it whether another
// process wrote it meanwhile: two jobs given the same --save both said "parameters saved", and
// the second to end had replaced the first's without a word.
struct FileState {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;  // no one can set it back: a rewrite in place that restores the
                              // size and mtime still changes it
  friend bool operator==(const FileState&, const FileState&) = default;
};

inline FileState file_state(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {};
  return {.exists = true,
          .dev = info.st_dev,
          .ino = info.st_ino,
          .size = info.st_size,
          .mtime_ns = std::int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec,
          .ctime_ns = std::int64_t{info.st_ctim.tv_sec} * 1'000'000'000 + info.st_ctim.tv_nsec};
}

}  // namespace nanoddp::common
