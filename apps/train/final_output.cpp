#include "final_output.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/rescue.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/nn/file_io.h"

namespace nanoddp::train {

namespace {

// The signal that arrived while HeldSignals held them (0: none), and how many are alive.
volatile sig_atomic_t g_arrived = 0;
int g_depth = 0;
constexpr int kHeld[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_previous[3] = {};

void note_signal(int signal_number) {
  g_arrived = signal_number;
}

}  // namespace

HeldSignals::HeldSignals() {
  if (g_depth++ > 0) return;
  struct sigaction note {};
  note.sa_handler = note_signal;
  sigemptyset(&note.sa_mask);
  g_arrived = 0;
  for (int i = 0; i < 3; ++i) ::sigaction(kHeld[i], &note, &g_previous[i]);
}

HeldSignals::~HeldSignals() {
  if (--g_depth > 0) return;
  for (int i = 0; i < 3; ++i) ::sigaction(kHeld[i], &g_previous[i], nullptr);
  const int signal_number = g_arrived;
  if (signal_number == 0) return;
  fmt::print(stderr,
             "nanoddp-train: {} arrived while the outputs were written; they were finished (or "
             "rescued) first\n",
             strsignal(signal_number));
  std::fflush(stderr);
  // Acts now as it would have: unless an error is on its way out, whose message and exit code
  // say more.
  if (std::uncaught_exceptions() == 0) ::raise(signal_number);
}

int HeldSignals::arrived() {
  return g_arrived;
}

namespace {

namespace fs = std::filesystem;

// An error's text quoted inside a sentence: without its final full stops.
std::string quoted(std::string text) {
  while (text.ends_with('.')) text.pop_back();
  return text;
}

bool same_inode(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// ---- Staged names and the clean-up of a killed run's ----

// A staged output is ".nanoddp-out.tmp.<host>.<pid>.<k>". Beside it while it is written: its
// writer's temporary, "..nanoddp-out.tmp.<host>.<pid>.<k>.tmp.<host>.<pid>.<k2>"
// (nn::write_file_atomically), or, left by versions before 2026-12-05, the trace writer's own,
// ".nanoddp-out.tmp.<host>.<pid>.<k>.tmp.<pid>.<k2>", both of the same process.
constexpr std::string_view kStagedMark = ".nanoddp-out.tmp.";
constexpr long kPidMax = 4194304;  // the kernel's PID_MAX_LIMIT

// Reads a plain decimal (no sign, no leading zero) from the front of `s`, at most `max`.
bool take_number(std::string_view& s, long max, long* value) {
  if (s.empty() || s[0] < '0' || s[0] > '9' || (s[0] == '0' && s.size() > 1 && s[1] != '.')) {
    return false;
  }
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), *value);
  if (error != std::errc() || *value > max) return false;
  s.remove_prefix(static_cast<std::size_t>(end - s.data()));
  return true;
}

bool take(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// The process and staged name of one of this host's staged outputs, writer temporaries or run
// lock files, named exactly as this program names them (an adversary's look-alikes were
// removed); nullopt else.
struct Staged {
  long pid = 0;
  std::string staged_name;  // the staged output's own name ("" for a run's lock file)
};
std::optional<Staged> parse_staged(std::string_view name, const std::string& host) {
  const bool writer = name.starts_with("..");
  if (writer) name.remove_prefix(1);
  const std::string_view whole = name;
  long pid = 0, k = 0, pid2 = 0, k2 = 0;
  if (!take(name, kStagedMark) || !take(name, host) || !take(name, ".") ||
      !take_number(name, kPidMax, &pid) || pid < 1) {
    return std::nullopt;
  }
  if (!writer && name == ".lock") return Staged{.pid = pid};
  if (!take(name, ".") || !take_number(name, 1'000'000, &k)) return std::nullopt;
  Staged staged{.pid = pid,
                .staged_name = std::string(whole.substr(0, whole.size() - name.size()))};
  if (name.empty()) return writer ? std::nullopt : std::optional(staged);
  if (!take(name, ".tmp.")) return std::nullopt;
  if (writer && (!take(name, host) || !take(name, "."))) return std::nullopt;
  if (!take_number(name, kPidMax, &pid2) || pid2 != pid || !take(name, ".") ||
      !take_number(name, 1'000'000, &k2) || !name.empty()) {
    return std::nullopt;
  }
  return staged;
}

// The file a run holds locked in a folder for the whole of its final write there: a run in
// another pid namespace of this host shows no pid here, but its lock does (a third adversary's
// clean-up removed such a run's output while it was still being written).
std::string run_lock_name(const std::string& host, long pid) {
  return fmt::format("{}{}.{}.lock", kStagedMark, host, pid);
}

bool locked_by_someone(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

// What a run killed during its final write left in `folder` (an outside adversary's SIGKILL
// left two files there for good): this host's staged outputs, writer temporaries and lock files,
// regular files only, whose process is gone and whose run lock (or staged output) no one holds.
// Another host's are left alone (its pids mean nothing here); each removal is said.
void remove_stale_staged(const fs::path& folder) {
  const std::string host = nn::this_host();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    const std::optional<Staged> staged = parse_staged(name, host);
    if (!staged || staged->pid == static_cast<long>(::getpid())) continue;
    std::error_code status;
    if (!entry.is_regular_file(status) || entry.is_symlink(status)) continue;
    if (::kill(static_cast<pid_t>(staged->pid), 0) == 0 || errno != ESRCH) continue;
    bool removed = false;
    if (staged->staged_name.empty()) {
      // A run lock: removed only while this run holds it, so that its owner, between creating
      // and locking it, finds it gone and makes it again (see RunLock).
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) continue;
      struct stat held {};
      struct stat named {};
      removed = ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &held) == 0 &&
                ::lstat(entry.path().c_str(), &named) == 0 && same_inode(held, named) &&
                ::unlink(entry.path().c_str()) == 0;
      ::close(fd);
    } else {
      if (locked_by_someone(folder / run_lock_name(host, staged->pid))) continue;
      if (locked_by_someone(folder / staged->staged_name)) continue;
      std::error_code error;
      removed = fs::remove(entry.path(), error);
    }
    if (removed) {
      fmt::print(stderr,
                 "nanoddp-train: removed '{}', left by process {} of this host (gone) in a final "
                 "write it did not finish\n",
                 entry.path().string(), staged->pid);
    }
  }
  std::fflush(stderr);
}

// Holds this run's lock file in `folder` while it lives (see run_lock_name); best effort: without
// it the clean-up of other runs goes by the pid alone.
class RunLock {
 public:
  explicit RunLock(const fs::path& folder)
      : path_((folder / run_lock_name(nn::this_host(), ::getpid())).string()) {
    // Between its creation and its lock another run's clean-up may remove the file (it looks
    // like a dead run's then): locked, it must still be the one under its name, else again
    // (a fourth adversary's namespaced run locked a removed file and lost its staged output).
    for (int tries = 0; tries < 10; ++tries) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0666);
      if (fd_ < 0) return;
      if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) break;
      struct stat held {};
      struct stat named {};
      if (::fstat(fd_, &held) == 0 && held.st_nlink > 0 && ::lstat(path_.c_str(), &named) == 0 &&
          same_inode(held, named)) {
        return;
      }
      ::close(fd_);
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  ~RunLock() {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());
    ::close(fd_);
  }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// A new empty file of ours beside the target (O_EXCL: never an existing file, link or FIFO) for
// the writer to replace with the output. A short name, so that the writer's own temporary
// beside it stays within the file system's name limit however long the target's name is.
std::string stage(const fs::path& folder, std::string* problem) {
  remove_stale_staged(folder);
  for (int k = 0; k < 100; ++k) {
    const std::string name =
        (folder / fmt::format("{}{}.{}.{}", kStagedMark, nn::this_host(), ::getpid(), k)).string();
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      return name;
    }
    if (errno != EEXIST) {
      *problem = fmt::format("cannot create '{}': {}", name, std::strerror(errno));
      return {};
    }
  }
  *problem = fmt::format("no free name for a file in '{}'", folder.string());
  return {};
}

// ---- The lock on the file that was there ----

// The process holding a lock on the file `st` describes, from /proc/locks ("1: FLOCK  ADVISORY
// WRITE 4242 08:01:131 0 EOF"; a waiter's line has "->"); 0 when none is found.
pid_t lock_holder(const struct stat& st) {
  std::FILE* locks = std::fopen("/proc/locks", "re");
  if (locks == nullptr) return 0;
  const std::string file =
      fmt::format("{:02x}:{:02x}:{}", major(st.st_dev), minor(st.st_dev), st.st_ino);
  pid_t holder = 0;
  char line[256];
  while (holder == 0 && std::fgets(line, sizeof line, locks) != nullptr) {
    char kind[16], mode[16], access[16], where[64];
    long pid = 0;
    if (std::strstr(line, "->") == nullptr &&
        std::sscanf(line, "%*d: %15s %15s %15s %ld %63s", kind, mode, access, &pid, where) == 5 &&
        file == where) {
      holder = static_cast<pid_t>(pid);
    }
  }
  std::fclose(locks);
  return holder;
}

// Takes the lock on `fd`, the output file `target` that was there before step 1, waiting for
// another job's install (moments) but not for ever: NANODDP_TIMEOUT_S, at most 30 s, said after
// the first second. A lock held longer (a job stalled inside its install, a foreign `flock`), or
// a SIGINT, SIGTERM or SIGHUP meanwhile, leaves the file to its holder: the caller rescues this
// run's output (an outside tester's job waited 30 s without a word, then replaced the file the
// holder went on to replace too, and one of the two outputs was lost though both jobs said
// "saved"). "" or why not.
std::string take_lock(int fd, const std::string& target, const char* flag,
                      std::chrono::milliseconds lock_wait) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return {};
  using Clock = std::chrono::steady_clock;
  const auto bound =
      lock_wait > std::chrono::milliseconds(0)
          ? Clock::duration(lock_wait)
          : std::min<Clock::duration>(std::chrono::seconds(30), comm::default_timeout());
  const double bound_s = std::chrono::duration<double>(bound).count();
  struct stat st {};
  ::fstat(fd, &st);
  const auto holder = [&] {
    const pid_t pid = lock_holder(st);
    if (pid <= 0) return std::string("another process");
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      return fmt::format("a process that inherited it from process {} (now gone)", pid);
    }
    return fmt::format("process {}", pid);
  };
  const HeldSignals held;  // a signal ends the wait, not the process
  std::string result;
  bool said = false;
  for (const auto start = Clock::now(); ::flock(fd, LOCK_EX | LOCK_NB) != 0;) {
    const auto waited = Clock::now() - start;
    if (const int signal_number = HeldSignals::arrived(); signal_number != 0) {
      result = fmt::format("the wait for the lock on '{}' was stopped by {}; it is left as it is",
                           target, strsignal(signal_number));
      break;
    }
    if (waited >= bound) {
      result = fmt::format(
          "'{}' is locked by {} (another job writing the same {}?), still after {:g} s; it is "
          "left as it is",
          target, holder(), flag, bound_s);
      break;
    }
    if (!said && waited >= std::min<Clock::duration>(bound / 2, std::chrono::seconds(1))) {
      said = true;
      fmt::print(stderr,
                 "nanoddp-train: waiting for the lock on {} '{}', held by {} (another job writing "
                 "it?): at most {:g} s, then this run's output goes to a rescue folder\n",
                 flag, target, holder(), bound_s);
      std::fflush(stderr);
    }
    ::usleep(10'000);
  }
  return result;
}

// ---- Putting the staged output in place ----

// The whole output (or, after a failed install, the file that was there before) sitting at
// `staged`, kept beside the target under a plain name rather than lost: "<name>.nanoddp-<what>.
// PID" (an adversary's, with $TMPDIR and /tmp both read-only). Not under the staged name, which
// the next run would remove. "" when it could not.
std::string keep_beside(const std::string& staged, const fs::path& folder, const std::string& name,
                        const char* what = "rescued") {
  for (int k = 0; k < 100; ++k) {
    const std::string kept =
        (folder / (k == 0 ? fmt::format("{}.nanoddp-{}.{}", name, what, ::getpid())
                          : fmt::format("{}.nanoddp-{}.{}.{}", name, what, ::getpid(), k)))
            .string();
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, kept.c_str(), RENAME_NOREPLACE) == 0) {
      return kept;
    }
    if (errno != EEXIST) return {};
  }
  return {};
}

// After `staged` was put at `target`: whether what is there is this run's output (`ours`).
// Another process may have put its own file at the staged name in the moment before (an
// adversary's was installed as the output, and the run's parameters deleted).
bool ours_in_place(const std::string& target, const struct stat& ours) {
  struct stat now {};
  return ::lstat(target.c_str(), &now) == 0 && same_inode(now, ours);
}

std::string not_ours(const std::string& staged, const std::string& target) {
  return fmt::format(
      "the output staged as '{}' was replaced by another process before it was installed; '{}' "
      "is left as it was",
      staged, target);
}

// After the install `target` holds neither this run's output nor the file that was there:
// another process put its own there, at the target or at the staged name, in that moment. Which
// cannot be told, so it stays at the target (moved back to the staged name, an outside tester's
// file was removed by the next run's clean-up); the file that was there before, handed back by
// the exchange (`staged`, when it is not this run's output), is kept beside it and named.
std::string replaced_in_install(const std::string& staged, const std::string& target,
                                const struct stat& ours, bool exchanged = false) {
  std::string previous;
  struct stat now {};
  if (exchanged && ::lstat(staged.c_str(), &now) == 0 && !same_inode(now, ours)) {
    const fs::path path(target);
    const std::string kept =
        keep_beside(staged, path.parent_path(), path.filename().string(), "previous");
    previous = kept.empty() ? fmt::format("; the file that was there before is at '{}'", staged)
                            : fmt::format("; the file that was there before is kept as '{}'", kept);
  }
  return fmt::format(
      "'{}' was replaced by another process while this run's output was installed (at it, or "
      "at the staged name '{}'), and is left as it is{}",
      target, staged, previous);
}

// Replaces the file `held` (checked, locked) at `target` by `staged` in one step that also hands
// back what it replaced (RENAME_EXCHANGE): a file another process put at the name after the
// check, or the old one written, touched or chmod-ed since, is swapped back rather than lost
// (the window a plain rename() leaves). "" or why not.
std::string replace_checked(const std::string& staged, const std::string& target,
                            const struct stat& held, const struct stat& ours,
                            const std::string& taken) {
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno == ENOENT && ::access(staged.c_str(), F_OK) == 0) {
      // The file went since the check (removed, renamed away): nobody's file is in the way, as
      // for a file removed earlier in the run; one that appears meanwhile is not replaced.
      if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
        return ours_in_place(target, ours) ? std::string()
                                           : replaced_in_install(staged, target, ours);
      }
      if (errno == EEXIST) return taken;
    } else if (errno == EINVAL || errno == ENOSYS) {
      // A file system without RENAME_EXCHANGE: the plain rename, its window and all.
      if (::rename(staged.c_str(), target.c_str()) == 0) {
        return ours_in_place(target, ours) ? std::string()
                                           : replaced_in_install(staged, target, ours);
      }
    }
    return fmt::format("cannot rename '{}' to '{}': {}", staged, target, std::strerror(errno));
  }
  // What the exchange put in place must be ours, and what it handed back the file checked,
  // unchanged: the same inode, and no write, touch or chmod since (its change time moved with the
  // rename itself, so the other fields say it; an adversary's append in this window was lost).
  struct stat replaced {};
  const bool old_unchanged = ::lstat(staged.c_str(), &replaced) == 0 &&
                             same_inode(replaced, held) && replaced.st_size == held.st_size &&
                             replaced.st_mode == held.st_mode && replaced.st_uid == held.st_uid &&
                             replaced.st_gid == held.st_gid &&
                             replaced.st_mtim.tv_sec == held.st_mtim.tv_sec &&
                             replaced.st_mtim.tv_nsec == held.st_mtim.tv_nsec;
  const bool placed = ours_in_place(target, ours);
  if (old_unchanged && placed) {
    // The old output, now under the staged name (checked again: not a file moved there since).
    struct stat again {};
    if (::lstat(staged.c_str(), &again) == 0 && same_inode(again, held)) ::unlink(staged.c_str());
    return {};
  }
  if (!placed) return replaced_in_install(staged, target, ours, /*exchanged=*/true);
  // The old file was written, touched or chmod-ed just before: give it its place back.
  ::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE);
  return taken;
}

// Puts `staged` (`ours`) at `target` unless another process wrote `target` since `checked` (what
// it was at the check before step 1), in one step that cannot replace such a file: two jobs
// given one --save that ended together both said "saved", one job's parameters gone. "" or why
// not.
std::string install(const std::string& staged, const std::string& target,
                    const common::FileState& checked, const struct stat& ours, const char* flag,
                    std::chrono::milliseconds lock_wait) {
  // A file made append-only, immutable or mounted over during the run changes too (its ctime),
  // but no other job wrote it: said as it is (an outside tester's).
  const auto unreplaceable = not_replaceable(target);
  std::string taken = fmt::format(
      "'{}' was written or changed by another process during this run (another job given the "
      "same {}?) and is left as it is",
      target, flag);
  if (unreplaceable && checked.exists) {
    taken = fmt::format(
        "'{}' {} since its check before step 1, which a rename over it cannot replace, and is "
        "left as it is",
        target, unreplaceable->what);
  } else if (unreplaceable) {
    taken = fmt::format(
        "'{}' was created by another process during this run (another job given the same {}?) "
        "and {}, which a rename over it cannot replace; it is left as it is",
        target, flag, unreplaceable->what);
  }
  if (checked.exists) {
    // Replacing the file that was there: under its lock, so that two jobs replacing it at once
    // take turns, and the second finds the first's file. Opened for writing when it cannot be
    // read (mode 0200): a lock needs a descriptor, not the file's contents.
    int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == EACCES) fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
      std::string result = take_lock(fd, target, flag, lock_wait);
      struct stat held {};
      const common::FileState now = common::file_state(target);
      if (!result.empty()) {
        // left as it is
      } else if (::fstat(fd, &held) != 0 || held.st_ino != now.ino || held.st_dev != now.dev ||
                 now != checked) {
        result = taken;
      } else {
        result = replace_checked(staged, target, held, ours, taken);
      }
      ::close(fd);
      return result;
    }
    if (errno != ENOENT) return fmt::format("cannot open '{}': {}", target, std::strerror(errno));
    // The file that was there is gone (removed during the run): nobody's file is in the way.
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
    return ours_in_place(target, ours) ? std::string() : replaced_in_install(staged, target, ours);
  }
  if (errno == EEXIST) return taken;
  if (errno != EINVAL && errno != ENOSYS) {
    return fmt::format("cannot rename '{}' to '{}': {}", staged, target, std::strerror(errno));
  }
  // A file system without RENAME_NOREPLACE: link() refuses an existing name too.
  if (::link(staged.c_str(), target.c_str()) == 0) {
    ::unlink(staged.c_str());
    return ours_in_place(target, ours) ? std::string() : replaced_in_install(staged, target, ours);
  }
  if (errno == EEXIST) return taken;
  return fmt::format("cannot link '{}' to '{}': {}", staged, target, std::strerror(errno));
}

// This run's own files in `folder` (staged outputs, writer temporaries, its run lock), sorted.
std::vector<std::string> own_files(const fs::path& folder) {
  const std::string host = nn::this_host();
  std::vector<std::string> own;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const auto staged = parse_staged(entry.path().filename().string(), host);
    if (staged && staged->pid == static_cast<long>(::getpid())) own.push_back(entry.path());
  }
  std::sort(own.begin(), own.end());
  return own;
}

}  // namespace

bool is_staged_name(const std::string& filename) {
  return filename.starts_with(kStagedMark) || filename.starts_with(fmt::format(".{}", kStagedMark));
}

std::optional<NotReplaceable> not_replaceable(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) {
    int attributes = 0;
    const bool got = ::ioctl(fd, FS_IOC_GETFLAGS, &attributes) == 0;
    ::close(fd);
    if (got && (attributes & (FS_APPEND_FL | FS_IMMUTABLE_FL)) != 0) {
      const char flag = (attributes & FS_APPEND_FL) != 0 ? 'a' : 'i';
      return NotReplaceable{
          .what =
              fmt::format("is {} (chattr +{})", flag == 'a' ? "append-only" : "immutable", flag),
          .fix = fmt::format("Remove the attribute (chattr -{} '{}') or give another name", flag,
                             file),
          .attribute = flag};
    }
  }
  struct statx info {};
  if (::statx(AT_FDCWD, file.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &info) == 0 &&
      (info.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0 &&
      (info.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0) {
    return NotReplaceable{.what = "is a mount point (a file mounted there, e.g. a bind mount)",
                          .fix = "Give a name nothing is mounted on",
                          .mount_point = true};
  }
  return std::nullopt;
}

std::string write_final_output(const char* flag, const std::string& path,
                               const std::function<nn::FileIdentity(const std::string&)>& write,
                               const common::FileState& checked, const std::string& checked_target,
                               std::chrono::milliseconds lock_wait) {
  const fs::path target = common::resolved_path(path);  // a symlink's target; the link stays
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const HeldSignals held;  // a signal waits until the output is in place or rescued
  std::optional<RunLock> run_lock;
  std::string problem;
  std::string staged;
  bool staged_whole = false;  // `staged` held the whole output, not installed
  int lock_fd = -1;           // ours, locked: the clean-up of other runs leaves it alone
  struct stat ours {};
  // Whether the staged name still holds this run's output: after another process put its own
  // file there, that file is not this run's to keep, move or remove.
  const auto staged_is_ours = [&] {
    struct stat now {};
    return lock_fd >= 0 && ::lstat(staged.c_str(), &now) == 0 && same_inode(now, ours);
  };
  if (!checked_target.empty() && target != checked_target) {
    // The name leads elsewhere than at its check: a symlink put there or re-pointed (even to a
    // folder that does not exist) is another party's, as a file written there would be.
    problem = fmt::format(
        "'{}' was changed during this run to lead to '{}', not '{}', and is left "
        "as it is",
        path, target.string(), checked_target);
  } else {
    std::error_code ec;
    // Checked writable before step 1, so a missing folder was removed (or renamed) since. Made
    // again as a user's `mkdir -p` would; a component that is now a file makes this fail, and
    // the rescue below takes over.
    if (!fs::exists(folder, ec) && fs::create_directories(folder, ec)) {
      fmt::print(stderr,
                 "nanoddp-train: warning: the folder '{}' of {} '{}' was removed or renamed during "
                 "the run; made it again\n",
                 folder.string(), flag, path);
      std::fflush(stderr);
    }
    run_lock.emplace(folder);
    staged = stage(folder, &problem);
  }
  if (!staged.empty()) {
    try {
      const nn::FileIdentity written = write(staged);
      staged_whole = true;
      lock_fd = ::open(staged.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (lock_fd < 0 || ::fstat(lock_fd, &ours) != 0) {
        problem = fmt::format("cannot open '{}': {}", staged, std::strerror(errno));
        if (lock_fd >= 0) ::close(lock_fd);
        lock_fd = -1;
      } else if (written != nn::FileIdentity{.device = ours.st_dev, .inode = ours.st_ino}) {
        // Another process put its own file at the staged name between the writer's rename and
        // the open above (under load, a test's replacement was installed as the output and the
        // run said "saved"): not this run's to install; the output is written to a rescue
        // folder below. The other file is moved off the staged name, which the next run's
        // clean-up would remove, to a plain one beside the target, and named.
        problem = not_ours(staged, target.string());
        ::close(lock_fd);
        lock_fd = -1;
        if (const std::string kept =
                keep_beside(staged, folder, fs::path(path).filename().string(), "other");
            !kept.empty()) {
          problem += fmt::format("; the file put at the staged name is kept as '{}'", kept);
        }
      } else {
        ::flock(lock_fd, LOCK_EX | LOCK_NB);
        problem = install(staged, target.string(), checked, ours, flag, lock_wait);
      }
    } catch (const std::exception& e) {
      problem = fmt::format("{}; '{}' is left as it was", quoted(e.what()), path);
    }
    if (problem.empty()) {
      if (lock_fd >= 0) ::close(lock_fd);
      // The install is a rename: durable once the folder is synced, as the writer's own rename.
      if (const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
        if (::fsync(dir) != 0 && errno != EINVAL) {
          fmt::print(stderr, "nanoddp-train: warning: fsync of '{}' after writing {} failed: {}\n",
                     folder.string(), flag, std::strerror(errno));
        }
        ::close(dir);
      }
      // Still leading to it after the install: re-pointed in the moment before, the name no
      // longer shows the output, which is not to be called saved there.
      if (common::resolved_path(path) != target) {
        return fmt::format(
            "{} '{}' was changed while the output was installed and no longer "
            "leads to it: the output is in '{}'",
            flag, path, target.string());
      }
      return {};
    }
    if (!staged_whole) ::unlink(staged.c_str());
  }
  // A folder made append-only or immutable during the run (it was refused so before step 1): a
  // file can be created there but not renamed or removed, which is why the write failed; said
  // so rather than the writer's rename error, and this run's files that stay there are named
  // (an outside tester's).
  std::optional<NotReplaceable> folder_locked;
  if (!problem.empty()) {
    folder_locked = not_replaceable(folder.string());
    if (folder_locked && folder_locked->attribute == 0) folder_locked.reset();
  }
  if (folder_locked) {
    problem = fmt::format(
        "its folder '{}' {} since the check before step 1: a file can be created there but not "
        "renamed or removed, so '{}' is left as it was",
        folder.string(), folder_locked->what, target.string());
  }
  // Named as the user named it: a --save replaced by a symlink during the run is rescued as
  // m.st, not under the name of whatever the link points at.
  const std::string name = fs::path(path).filename().string();
  std::string again;
  const std::string where = common::rescue(
      [&](const std::string& dir) { write((fs::path(dir) / name).string()); }, &again);
  std::string result;
  if (!where.empty()) {
    result = fmt::format(
        "{} '{}' could not be written ({}). It was written to '{}' instead: move it where it "
        "belongs",
        flag, path, problem, (fs::path(where) / name).string());
  } else if (const std::string kept =
                 staged_whole && staged_is_ours() ? keep_beside(staged, folder, name) : "";
             !kept.empty()) {
    result = fmt::format(
        "{} '{}' could not be written ({}), nor rescued to a temporary folder ({}). It was kept "
        "as '{}' instead: move it where it belongs",
        flag, path, problem, again, kept);
  } else if (staged_whole && staged_is_ours()) {
    result = fmt::format(
        "{} '{}' could not be written ({}), nor rescued ({}). The output is in '{}' (a hidden "
        "file beside it): move it now, the next run that writes there removes it",
        flag, path, problem, again, staged);
    staged_whole = false;  // left where it is, named
  } else {
    result = fmt::format("{} '{}' could not be written ({}), nor rescued ({}): the output is lost",
                         flag, path, problem, again);
  }
  if (staged_whole && staged_is_ours() && ::unlink(staged.c_str()) != 0 && !folder_locked) {
    result += fmt::format(" (a copy also stays as '{}': {})", staged, std::strerror(errno));
  }
  if (folder_locked) {
    if (const std::vector<std::string> left = own_files(folder); !left.empty()) {
      result += fmt::format(
          ". This run's own files stay in '{}', as none can be removed: '{}' (after chattr -{} the "
          "next run there removes them)",
          folder.string(), fmt::join(left, "', '"), folder_locked->attribute);
    }
  }
  if (lock_fd >= 0) ::close(lock_fd);
  return result;
}

}  // namespace nanoddp::train
