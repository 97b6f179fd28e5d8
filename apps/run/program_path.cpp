#include "program_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

namespace nanoddp::run {

namespace {

enum class Kind { kMissing, kNotExecutable, kExecutable };

Kind classify(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return Kind::kMissing;
  if (!S_ISREG(info.st_mode) || access(path.c_str(), X_OK) != 0) return Kind::kNotExecutable;
  return Kind::kExecutable;
}

}  // namespace

ProgramLookup find_program(const std::string& name) {
  if (name.empty()) return {{}, "PROGRAM is an empty string", 127};
  if (name.find('/') != std::string::npos) {
    switch (classify(name)) {
      case Kind::kExecutable:
        return {name, {}, 0};
      case Kind::kNotExecutable:
        return {{}, fmt::format("PROGRAM '{}' is not an executable file", name), 126};
      case Kind::kMissing:
        break;
    }
    return {{}, fmt::format("PROGRAM '{}' does not exist", name), 127};
  }
  const char* env_path = std::getenv("PATH");
  const std::string_view search = env_path != nullptr ? env_path : "/bin:/usr/bin";
  bool saw_non_executable = false;
  std::size_t begin = 0;
  while (begin <= search.size()) {
    std::size_t end = search.find(':', begin);
    if (end == std::string_view::npos) end = search.size();
    // An empty entry means the current directory, as for execvp.
    std::string dir(search.substr(begin, end - begin));
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    const Kind kind = classify(candidate);
    if (kind == Kind::kExecutable) return {candidate, {}, 0};
    saw_non_executable |= kind == Kind::kNotExecutable;
    begin = end + 1;
  }
  if (saw_non_executable) {
    return {{}, fmt::format("PROGRAM '{}' was found in PATH but is not executable", name), 126};
  }
  return {{}, fmt::format("PROGRAM '{}' not found in PATH", name), 127};
}

}  // namespace nanoddp::run
