#include "shm_cleanup.h"

#include <dirent.h>
#include <sys/mman.h>

#include <charconv>

namespace nanoddp::run {

std::optional<pid_t> shm_segment_creator(std::string_view name) {
  // The format of random_segment_name() in comm/shm_allreduce.cpp, without its '/'.
  constexpr std::string_view kPrefix = "nanoddp-";
  constexpr std::size_t kHexDigits = 16;
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  const std::size_t dash = name.find('-');
  if (dash == 0 || dash == std::string_view::npos || name[0] == '0') return std::nullopt;
  const std::string_view digits = name.substr(0, dash);
  const std::string_view hex = name.substr(dash + 1);
  if (hex.size() != kHexDigits || hex.find_first_not_of("0123456789abcdef") != hex.npos) {
    return std::nullopt;
  }
  pid_t pid = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (error != std::errc() || end != digits.data() + digits.size() || pid <= 0) {
    return std::nullopt;
  }
  return pid;
}

std::vector<RemovedSegment> remove_shm_segments_of(const std::set<pid_t>& pids) {
  std::vector<RemovedSegment> found;
  if (pids.empty()) return found;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return found;  // no /dev/shm: nothing can have been left there
  while (const dirent* entry = ::readdir(dir)) {
    const std::optional<pid_t> creator = shm_segment_creator(entry->d_name);
    if (creator && pids.contains(*creator)) found.push_back({entry->d_name, *creator});
  }
  ::closedir(dir);
  std::vector<RemovedSegment> removed;
  for (RemovedSegment& segment : found) {
    if (::shm_unlink(("/" + segment.name).c_str()) == 0) removed.push_back(std::move(segment));
  }
  return removed;
}

}  // namespace nanoddp::run
