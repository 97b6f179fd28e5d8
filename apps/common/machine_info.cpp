#include "common/machine_info.h"

#include <fmt/format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "nanoddp/config.h"

namespace nanoddp::common {

namespace {

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\"");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t\"");
  return s.substr(first, last - first + 1);
}

// The value of the first "key<sep>value" line of `path` whose key is `key`; "" if none.
std::string file_field(const std::string& path, const std::string& key, char sep) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(sep);
    if (at != std::string::npos && trim(line.substr(0, at)) == key) {
      return trim(line.substr(at + 1));
    }
  }
  return {};
}

}  // namespace

double available_memory_bytes() {
  // "MemAvailable:   12345678 kB"
  const std::string kb = file_field("/proc/meminfo", "MemAvailable", ':');
  if (kb.empty()) return -1;
  return std::strtod(kb.c_str(), nullptr) * 1024.0;
}

std::string hostname() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  return host;
}

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

nlohmann::ordered_json machine_info() {
  std::string cpu = file_field("/proc/cpuinfo", "model name", ':');
  if (cpu.empty()) cpu = "unknown";
  struct utsname uts {};
  std::string os = "unknown";
  if (::uname(&uts) == 0) {
    const std::string distribution = file_field("/etc/os-release", "PRETTY_NAME", '=');
    os = distribution.empty() ? fmt::format("{} {}", uts.sysname, uts.release)
                              : fmt::format("{} ({} {})", distribution, uts.sysname, uts.release);
  }
  return {{"hostname", hostname()},
          {"cpu", cpu},
          {"cores", static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))},
          {"os", os}};
}

nlohmann::ordered_json build_info() {
  const std::string build_type = NANODDP_BUILD_TYPE;
  return {{"version", NANODDP_VERSION},
          {"compiler", compiler()},
          {"build_type", build_type.empty() ? std::string("unknown") : build_type},
          {"cuda", NANODDP_WITH_CUDA != 0},
          {"native", NANODDP_NATIVE != 0}};
}

}  // namespace nanoddp::common
