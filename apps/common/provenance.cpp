#include "common/provenance.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string_view>
#include <vector>

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

// The values redact() hides: every secret-named variable's value (4 characters or more: a
// shorter one would hide digits everywhere) and its '/'-separated parts of 8 or more.
std::vector<std::string> secret_values() {
  std::vector<std::string> values;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos || !is_secret_name(entry.substr(0, eq))) continue;
    const std::string_view value = entry.substr(eq + 1);
    if (value.size() >= 4) values.emplace_back(value);
    for (std::size_t start = 0; start <= value.size();) {
      const std::size_t slash = std::min(value.find('/', start), value.size());
      if (slash - start >= 8 && slash - start < value.size()) {
        values.emplace_back(value.substr(start, slash - start));
      }
      start = slash + 1;
    }
  }
  // Longest first, so that a whole value goes before its parts.
  std::sort(values.begin(), values.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return values;
}

// What the user typed when this process is a worker of nanoddp-run: the launcher's own command
// line ("" when there is none, or it cannot be read).
std::string launcher_command() {
  const char* pid = std::getenv("NANODDP_LAUNCHER_PID");
  if (pid == nullptr || std::to_string(::getppid()) != pid) return {};
  std::ifstream in(std::string("/proc/") + pid + "/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (std::size_t start = 0; start < raw.size();) {
    const std::size_t end = std::min(raw.find('\0', start), raw.size());
    args.push_back(raw.substr(start, end - start));
    start = end + 1;
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return argv.empty() ? std::string() : command_line(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

bool is_secret_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char* word : {"TOKEN", "SECRET", "PASSWORD", "KEY"}) {
    if (upper.find(word) != std::string::npos) return true;
  }
  return false;
}

std::string redact(std::string text) {
  for (const std::string& secret : secret_values()) {
    for (std::size_t at = text.find(secret); at != std::string::npos;
         at = text.find(secret, at + std::string_view(kRedacted).size())) {
      text.replace(at, secret.size(), kRedacted);
    }
  }
  return text;
}

void redact_strings(nlohmann::ordered_json& value) {
  if (value.is_string()) {
    value = redact(value.get<std::string>());
  } else if (value.is_array()) {
    for (auto& v : value) redact_strings(v);
  } else if (value.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto& [k, v] : value.items()) {
      redact_strings(v);
      out[redact(k)] = std::move(v);
    }
    value = std::move(out);
  }
}

std::string command_line(int argc, const char* const* argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command.push_back(' ');
    command.append(shell_quote(argv[i]));
  }
  return command;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

nlohmann::ordered_json provenance(int argc, const char* const* argv) {
  const std::string own = command_line(argc, argv);
  const std::string outer = launcher_command();
  std::map<std::string, std::string> env;  // sorted: the same variables read the same
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq);
    if (name.starts_with("NANODDP_") || name.starts_with("OMP_") || name.starts_with("NCCL_")) {
      env.emplace(name, is_secret_name(name) ? std::string(kRedacted)
                                             : redact(std::string(entry.substr(eq + 1))));
    }
  }
  double load[3] = {-1, -1, -1};
  const bool have_load = getloadavg(load, 3) == 3;
  nlohmann::ordered_json p;
  p["commit"] = git_commit();
  p["dirty"] = git_dirty();
  p["command"] = redact(outer.empty() ? own : outer);
  if (!outer.empty()) p["worker_command"] = redact(own);
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  p["cwd"] = ec ? std::string("unknown") : redact(cwd.string());
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
