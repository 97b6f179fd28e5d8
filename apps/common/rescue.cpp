#include "common/rescue.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <vector>

namespace nanoddp::common {

std::string rescue(const std::function<void(const std::string& folder)>& write,
                   std::string* problem) {
  std::vector<std::string> bases;
  if (const char* tmpdir = std::getenv("TMPDIR"); tmpdir != nullptr && *tmpdir != '\0') {
    bases.emplace_back(tmpdir);
  }
  if (bases.empty() || std::filesystem::path(bases[0]).lexically_normal() != "/tmp") {
    bases.emplace_back("/tmp");
  }
  std::vector<std::string> failures;
  for (const std::string& base : bases) {
    std::string folder =
        (std::filesystem::path(base) / fmt::format("nanoddp-rescue-{}-XXXXXX", ::getpid()))
            .string();
    if (::mkdtemp(folder.data()) == nullptr) {
      failures.push_back(fmt::format("'{}': {}", folder, std::strerror(errno)));
      continue;
    }
    try {
      write(folder);
      return folder;
    } catch (const std::exception& e) {
      std::string what = e.what();
      while (what.ends_with('.')) what.pop_back();  // quoted in a sentence
      failures.push_back(fmt::format("'{}': {}", folder, what));
      std::error_code ec;
      std::filesystem::remove_all(folder, ec);  // ours alone: made just now, mode 0700
    }
  }
  *problem = fmt::format("{}", fmt::join(failures, "; "));
  return {};
}

}  // namespace nanoddp::common
