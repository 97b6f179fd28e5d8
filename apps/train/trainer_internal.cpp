#include "trainer_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "common/output_files.h"
#include "common/rescue.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"

namespace nanoddp::train {

namespace {

// The settings of nn::Mlp::describe(), "MLP(in=4, out=2, hidden=8, ...)", as key -> value.
std::map<std::string, std::string> model_settings(const std::string& description) {
  std::map<std::string, std::string> settings;
  const auto open = description.find('('), close = description.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return settings;
  std::string_view rest = std::string_view(description).substr(open + 1, close - open - 1);
  while (!rest.empty()) {
    const auto comma = rest.find(", ");
    const std::string_view item = rest.substr(0, comma);
    if (const auto eq = item.find('='); eq != std::string_view::npos) {
      settings.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
  }
  return settings;
}

}  // namespace

std::int64_t count_nonfinite(const Tensor& t) {
  Tensor count = Tensor::empty({}, t.device());
  backend_for(t.device()).count_nonfinite(t.data(), t.numel(), count.data());
  return static_cast<std::int64_t>(count.item());
}

std::string model_difference(const std::string& recorded, const std::string& current) {
  if (recorded == current) return {};
  static const std::map<std::string, std::string> kFlags = {{"in", "--in, or --data's columns"},
                                                            {"out", "--out, or --targets' columns"},
                                                            {"hidden", "--hidden"},
                                                            {"layers", "--layers"},
                                                            {"activation", "--activation"}};
  const auto then = model_settings(recorded), now = model_settings(current);
  std::vector<std::string> parts;
  for (const auto& [key, value] : now) {
    const auto it = then.find(key);
    if (it == then.end() || it->second == value) continue;  // not recorded, or the same
    const std::string& before = it->second;
    const auto flag = kFlags.find(key);
    parts.push_back(fmt::format("{} {} there, {} in this run ({})", key, before, value,
                                flag == kFlags.end() ? key : flag->second));
  }
  if (parts.empty()) {
    // Every setting this run's description names is recorded, with the same value: the same
    // model (a file of an earlier version describes a --layers 0 model with a hidden width and
    // an activation that take no part, which this version no longer names).
    const bool all_recorded =
        !now.empty() && std::all_of(now.begin(), now.end(),
                                    [&](const auto& kv) { return then.contains(kv.first); });
    if (all_recorded) return {};
    parts.push_back(fmt::format("{} there, {} in this run", recorded, current));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string file_fingerprint(const std::string& path) {
  try {
    return fmt::format("{} bytes, checksum {}", std::filesystem::file_size(path),
                       nn::checksum_hex(nn::file_checksum(path)));
  } catch (const std::exception& e) {
    return fmt::format("unreadable ({})", e.what());
  }
}

namespace {

// An error's text quoted inside a sentence: without its final full stops.
std::string quoted(std::string text) {
  while (text.ends_with('.')) text.pop_back();
  return text;
}

// The staged outputs' names: ".nanoddp-out.tmp.<host>.<pid>.<k>", and the writers' own
// temporaries beside them start with the same name after one more dot.
constexpr std::string_view kStagedMark = ".nanoddp-out.tmp.";

// What a run killed during its final write left in `folder` (an outside adversary's SIGKILL
// left two files there for good): staged outputs of this host whose process is gone, and their
// writers' temporaries. Another host's are left alone (its pids mean nothing here), and so are
// a live process's.
void remove_stale_staged(const std::filesystem::path& folder) {
  const std::string mine = fmt::format("{}{}.", kStagedMark, nn::this_host());
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string filename = entry.path().filename().string();
    std::string_view name = filename;
    if (name.starts_with("..")) name.remove_prefix(1);
    if (!name.starts_with(mine)) continue;
    name.remove_prefix(mine.size());
    long pid = 0;
    const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (error != std::errc() || end == name.data() || *end != '.' || pid <= 0 ||
        pid == static_cast<long>(::getpid())) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

// A new empty file of ours beside the target (O_EXCL: never an existing file, link or FIFO) for
// the writer to replace with the output. A short name, so that the writer's own temporary
// beside it stays within the file system's name limit however long the target's name is.
std::string stage(const std::filesystem::path& folder, std::string* problem) {
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
// the first second. A lock held longer (a job stalled inside its install, a foreign `flock`)
// leaves the file to its holder: the caller rescues this run's output (an outside tester's job
// waited 30 s without a word, then replaced the file the holder went on to replace too, and one
// of the two outputs was lost though both jobs said "saved"). "" or why not.
std::string take_lock(int fd, const std::string& target, const char* flag) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return {};
  using Clock = std::chrono::steady_clock;
  const auto bound = std::min<Clock::duration>(std::chrono::seconds(30), comm::default_timeout());
  const double bound_s = std::chrono::duration<double>(bound).count();
  const auto start = Clock::now();
  bool said = false;
  struct stat st {};
  ::fstat(fd, &st);
  const auto holder = [&] {
    const pid_t pid = lock_holder(st);
    return pid > 0 ? fmt::format("process {}", pid) : std::string("another process");
  };
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const auto waited = Clock::now() - start;
    if (waited >= bound) {
      return fmt::format(
          "'{}' is locked by {} (another job writing the same {}?), still after {:g} s; it is "
          "left as it is",
          target, holder(), flag, bound_s);
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
  return {};
}

// Replaces `target` by `staged` in one step that also hands back what it replaced
// (RENAME_EXCHANGE), so that a file another process put at the name after our check is found
// and swapped back rather than lost (the window a plain rename() leaves). `held` is the file
// checked under its lock. "" or why not.
std::string replace_checked(const std::string& staged, const std::string& target,
                            const struct stat& held, const std::string& taken) {
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno == ENOENT && ::access(staged.c_str(), F_OK) == 0) {
      // The file went since the check (removed, renamed away): nobody's file is in the way, as
      // for a file removed earlier in the run; one that appears meanwhile is not replaced.
      if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
        return {};
      }
      if (errno == EEXIST) return taken;
    } else if (errno == EINVAL || errno == ENOSYS) {
      // A file system without RENAME_EXCHANGE: the plain rename, its window and all.
      if (::rename(staged.c_str(), target.c_str()) == 0) return {};
    }
    return fmt::format("cannot rename '{}' to '{}': {}", staged, target, std::strerror(errno));
  }
  // What the exchange handed back must be the file checked, unchanged: the same inode, and no
  // write, touch or chmod since (its change time moved with the rename itself, so the other
  // fields say it; an adversary's append in this window was lost).
  struct stat replaced {};
  if (::lstat(staged.c_str(), &replaced) == 0 && replaced.st_ino == held.st_ino &&
      replaced.st_dev == held.st_dev && replaced.st_size == held.st_size &&
      replaced.st_mode == held.st_mode && replaced.st_uid == held.st_uid &&
      replaced.st_gid == held.st_gid && replaced.st_mtim.tv_sec == held.st_mtim.tv_sec &&
      replaced.st_mtim.tv_nsec == held.st_mtim.tv_nsec) {
    ::unlink(staged.c_str());  // the old output, now under the staged name
    return {};
  }
  // Another process's file, or one changed since the check: give it its place back.
  ::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE);
  return taken;
}

// Puts `staged` at `target` unless another process wrote `target` since `checked` (what it was
// at the check before step 1), in one step that cannot replace such a file: two jobs given one
// --save that ended together both said "saved", one job's parameters gone. "" or why not.
std::string install(const std::string& staged, const std::string& target,
                    const common::FileState& checked, const char* flag) {
  const std::string taken = fmt::format(
      "'{}' was written by another process during this run (another job given the same {}?) and "
      "is left as it is",
      target, flag);
  if (checked.exists) {
    // Replacing the file that was there: under its lock, so that two jobs replacing it at once
    // take turns, and the second finds the first's file.
    const int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
      std::string result = take_lock(fd, target, flag);
      struct stat held {};
      const common::FileState now = common::file_state(target);
      if (!result.empty()) {
        // left as it is
      } else if (::fstat(fd, &held) != 0 || held.st_ino != now.ino || held.st_dev != now.dev ||
                 now != checked) {
        result = taken;
      } else {
        result = replace_checked(staged, target, held, taken);
      }
      ::close(fd);
      return result;
    }
    if (errno != ENOENT) return fmt::format("cannot open '{}': {}", target, std::strerror(errno));
    // The file that was there is gone (removed during the run): nobody's file is in the way.
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
    return {};
  }
  if (errno == EEXIST) return taken;
  if (errno != EINVAL && errno != ENOSYS) {
    return fmt::format("cannot rename '{}' to '{}': {}", staged, target, std::strerror(errno));
  }
  // A file system without RENAME_NOREPLACE: link() refuses an existing name too.
  if (::link(staged.c_str(), target.c_str()) == 0) {
    ::unlink(staged.c_str());
    return {};
  }
  if (errno == EEXIST) return taken;
  return fmt::format("cannot link '{}' to '{}': {}", staged, target, std::strerror(errno));
}

}  // namespace

std::string write_final_output(const char* flag, const std::string& path,
                               const std::function<void(const std::string&)>& write,
                               const common::FileState& checked) {
  namespace fs = std::filesystem;
  const fs::path target = common::resolved_path(path);  // a symlink's target; the link stays
  const fs::path folder = target.parent_path();
  std::error_code ec;
  // Checked writable before step 1, so a missing folder was removed since. Made again as a
  // user's `mkdir -p` would; a component that is now a file makes this fail, and the rescue
  // below takes over.
  if (!folder.empty() && !fs::exists(folder, ec) && fs::create_directories(folder, ec)) {
    fmt::print(stderr,
               "nanoddp-train: warning: the folder '{}' of {} '{}' was removed during the run; "
               "made it again\n",
               folder.string(), flag, path);
    std::fflush(stderr);
  }
  std::string problem;
  const std::string staged = stage(folder.empty() ? fs::path(".") : folder, &problem);
  bool staged_whole = false;  // `staged` holds the whole output, not installed
  if (!staged.empty()) {
    try {
      write(staged);
      staged_whole = true;
      // The name as the user gave it must still lead where this run writes: a symlink
      // re-pointed (or replaced) since is another party's, as a file written there would be.
      problem = common::resolved_path(path) == target
                    ? install(staged, target.string(), checked, flag)
                    : fmt::format(
                          "'{}' was changed during this run to lead elsewhere than '{}' "
                          "and is left as it is",
                          path, target.string());
    } catch (const std::exception& e) {
      problem = quoted(e.what());
    }
    if (problem.empty()) {
      // ... and still after the install: re-pointed in the moment before it, the name no longer
      // shows the output, which is not to be called saved there.
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
  // Named as the user named it: a --save replaced by a symlink during the run is rescued as
  // m.st, not under the name of whatever the link points at.
  const std::string name = fs::path(path).filename().string();
  std::string again;
  const std::string where = common::rescue(
      [&](const std::string& dir) { write((fs::path(dir) / name).string()); }, &again);
  if (where.empty() && staged_whole) {
    // No rescue folder could be written, but the whole output sits beside the target: keep it
    // under a plain name there rather than lose it (an adversary's, with $TMPDIR and /tmp both
    // read-only). Not under the staged name, which the next run removes.
    const std::string kept = ((folder.empty() ? fs::path(".") : folder) /
                              fmt::format("{}.nanoddp-rescued.{}", name, ::getpid()))
                                 .string();
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, kept.c_str(), RENAME_NOREPLACE) == 0) {
      return fmt::format(
          "{} '{}' could not be written ({}), nor rescued to a temporary folder ({}). It was kept "
          "as '{}' instead: move it where it belongs",
          flag, path, problem, again, kept);
    }
  }
  if (staged_whole) ::unlink(staged.c_str());
  if (where.empty()) {
    return fmt::format("{} '{}' could not be written ({}), nor rescued ({})", flag, path, problem,
                       again);
  }
  return fmt::format(
      "{} '{}' could not be written ({}). It was written to '{}' instead: move it where it "
      "belongs",
      flag, path, problem, (fs::path(where) / name).string());
}

}  // namespace nanoddp::train
