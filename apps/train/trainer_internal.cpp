#include "trainer_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>

#include "common/output_files.h"
#include "common/rescue.h"
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

// A new empty file of ours beside the target (O_EXCL: never an existing file, link or FIFO) for
// the writer to replace with the output. A short name, so that the writer's own temporary
// beside it stays within the file system's name limit however long the target's name is.
std::string stage(const std::filesystem::path& folder, std::string* problem) {
  for (int k = 0; k < 100; ++k) {
    const std::string name = (folder / fmt::format(".nanoddp-out.{}.{}", ::getpid(), k)).string();
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
      for (int tries = 0; ::flock(fd, LOCK_EX | LOCK_NB) != 0 && tries < 3000; ++tries) {
        ::usleep(10'000);  // another job's rename: moments (30 s at most, then it goes on)
      }
      struct stat held {};
      const common::FileState now = common::file_state(target);
      std::string result;
      if (::fstat(fd, &held) != 0 || held.st_ino != now.ino || held.st_dev != now.dev ||
          now != checked) {
        result = taken;
      } else if (::rename(staged.c_str(), target.c_str()) != 0) {
        result =
            fmt::format("cannot rename '{}' to '{}': {}", staged, target, std::strerror(errno));
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
  if (!staged.empty()) {
    try {
      write(staged);
      problem = install(staged, target.string(), checked, flag);
    } catch (const std::exception& e) {
      problem = quoted(e.what());
    }
    if (problem.empty()) return {};
    ::unlink(staged.c_str());
  }
  const std::string name = target.filename().string();
  std::string again;
  const std::string where = common::rescue(
      [&](const std::string& dir) { write((fs::path(dir) / name).string()); }, &again);
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
