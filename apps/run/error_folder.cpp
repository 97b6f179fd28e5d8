#include "error_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string_view>
#include <vector>

#include "output.h"

namespace nanoddp::run {

namespace {

constexpr std::string_view kPrefix = "nanoddp-run-errors-";
constexpr std::time_t kStaleAfterS = 60;  // unchanged this long: not a folder being made

// The launcher's pid in "nanoddp-run-errors-<pid>-XXXXXX" (mkdtemp's six characters), or 0.
pid_t folder_owner(std::string_view name) {
  if (!name.starts_with(kPrefix)) return 0;
  name.remove_prefix(kPrefix.size());
  const std::size_t dash = name.find('-');
  if (dash == 0 || dash == std::string_view::npos || name.size() - dash - 1 != 6) return 0;
  if (name[0] == '0') return 0;  // the launcher writes no leading zero: not its folder
  pid_t pid = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + dash, pid);
  return error == std::errc() && end == name.data() + dash && pid > 0 ? pid : 0;
}

// What a worker writes there: "rank-<n>.json" and its staged "rank-<n>.json.<pid>.tmp".
bool is_error_file_name(std::string_view name) {
  if (!name.starts_with("rank-")) return false;
  name.remove_prefix(5);
  const std::size_t digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string_view::npos) return false;
  if (name[0] == '0' && digits > 1) return false;  // "rank-00.json" is no worker's
  name.remove_prefix(digits);
  if (name == ".json") return true;
  if (!name.starts_with(".json.") || !name.ends_with(".tmp")) return false;
  name = name.substr(6, name.size() - 10);
  return !name.empty() && name.find_first_not_of("0123456789") == std::string_view::npos;
}

// Removes the folder open as `fd` (locked by the caller) at `path` if it holds only error files.
bool remove_if_only_error_files(int fd, const std::string& path) {
  DIR* dir = ::fdopendir(::dup(fd));
  if (dir == nullptr) return false;
  std::vector<std::string> files;
  bool only_error_files = true;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (!is_error_file_name(name) || ::fstatat(fd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode)) {
      only_error_files = false;
      break;
    }
    files.emplace_back(name);
  }
  ::closedir(dir);
  if (!only_error_files) return false;
  for (const std::string& file : files) ::unlinkat(fd, file.c_str(), 0);
  return ::rmdir(path.c_str()) == 0;
}

}  // namespace

int remove_stale_error_folders(const std::string& base, std::string* example) {
  DIR* dir = ::opendir(base.c_str());
  if (dir == nullptr) return 0;
  std::vector<std::string> candidates;
  while (const dirent* entry = ::readdir(dir)) {
    if (folder_owner(entry->d_name) > 0) candidates.emplace_back(entry->d_name);
  }
  ::closedir(dir);
  int removed = 0;
  for (const std::string& name : candidates) {
    const pid_t owner = folder_owner(name);
    if (owner == ::getpid() || ::kill(owner, 0) == 0 || errno != ESRCH) continue;  // alive
    const std::string path = fmt::format("{}/{}", base, name);
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;  // gone, or a link
    struct stat st {};
    const bool stale = ::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() &&
                       std::time(nullptr) - st.st_mtim.tv_sec > kStaleAfterS;
    if (stale && ::flock(fd, LOCK_EX | LOCK_NB) == 0 && remove_if_only_error_files(fd, path)) {
      if (removed++ == 0 && example != nullptr) *example = path;
    }
    ::close(fd);
  }
  return removed;
}

ErrorFolder::ErrorFolder() {
  std::string problem;
  for (const char* base : {static_cast<const char*>(std::getenv("TMPDIR")), "/tmp"}) {
    if (base == nullptr || *base == '\0') continue;
    std::string example;
    if (const int removed = remove_stale_error_folders(base, &example); removed > 0) {
      Console::err().write(
          fmt::format("nanoddp-run: removed {} error folder(s) that killed launchers left in "
                      "'{}' (e.g. '{}')\n",
                      removed, base, example),
          false);
    }
    std::string name = fmt::format("{}/{}{}-XXXXXX", base, kPrefix, ::getpid());
    if (::mkdtemp(name.data()) != nullptr) {
      path_ = name;
      // Held while it lives: the clean-up above leaves a locked folder alone.
      lock_fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (lock_fd_ >= 0) ::flock(lock_fd_, LOCK_EX | LOCK_NB);
      return;
    }
    problem += fmt::format("{}'{}': {}", problem.empty() ? "" : "; ", base, std::strerror(errno));
  }
  Console::err().write(
      fmt::format("nanoddp-run: warning: cannot make a folder for the workers' error files "
                  "({}): a failed attempt names the first worker to exit as the one that failed "
                  "first\n",
                  problem),
      false);
}

ErrorFolder::~ErrorFolder() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string ErrorFolder::file(int rank) const {
  return path_.empty() ? std::string() : fmt::format("{}/rank-{}.json", path_, rank);
}

}  // namespace nanoddp::run
