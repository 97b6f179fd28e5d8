#include "common/provenance.h"

#include <fmt/format.h>

#include <cstdlib>
#include <ctime>
#include <map>
#include <string_view>

extern char** environ;  // POSIX

namespace nanoddp::common {

namespace {

// Quoted as a POSIX shell reads it back, so the command line can be pasted.
std::string shell_quote(std::string_view arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789-_./=:,+@%") == std::string_view::npos) {
    return std::string(arg);
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out.append("'\\''");
    } else {
      out.push_back(c);
    }
  }
  out.push_back('\'');
  return out;
}

}  // namespace

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

nlohmann::ordered_json provenance(int argc, const char* const* argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command.push_back(' ');
    command.append(shell_quote(argv[i]));
  }
  std::map<std::string, std::string> env;  // sorted: the same variables read the same
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq);
    if (name.starts_with("NANODDP_") || name.starts_with("OMP_") || name.starts_with("NCCL_")) {
      env.emplace(name, entry.substr(eq + 1));
    }
  }
  double load[3] = {-1, -1, -1};
  const bool have_load = getloadavg(load, 3) == 3;
  nlohmann::ordered_json p;
  p["commit"] = git_commit();
  p["dirty"] = git_dirty();
  p["command"] = command;
  p["utc"] = utc_now();
  p["environment"] = env;
  p["load_average"] =
      have_load ? nlohmann::ordered_json::array({load[0], load[1], load[2]}) : nullptr;
  return p;
}

std::string provenance_line(const nlohmann::ordered_json& p) {
  const std::string commit = p.value("commit", "unknown");
  const std::string dirty = p.value("dirty", "unknown");
  std::string line = fmt::format("commit {}{}, {}", commit.substr(0, 10),
                                 dirty == "yes"  ? " (dirty)"
                                 : dirty == "no" ? ""
                                                 : " (dirty: unknown)",
                                 p.value("utc", "?"));
  if (p.contains("load_average") && p["load_average"].is_array()) {
    line += fmt::format(", load average {:.2f}", p["load_average"][0].get<double>());
  }
  return line;
}

}  // namespace nanoddp::common
