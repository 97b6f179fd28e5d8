#include "support/process_snapshot.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace nanoddp::testing {

namespace {

namespace fs = std::filesystem;

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses):
// [0] is the state, [1] the parent, [2] the process group.
std::vector<std::string> stat_fields(const fs::path& stat) {
  const std::string line = read_line(stat);
  const auto close = line.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 1));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

std::string describe_threads(const fs::path& process) {
  std::string text;
  std::error_code error;
  for (const auto& task : fs::directory_iterator(process / "task", error)) {
    const auto fields = stat_fields(task.path() / "stat");
    // `syscall` is the call's number and arguments (x86-64 numbering), or "running".
    const std::string syscall = read_line(task.path() / "syscall");
    text += fmt::format("    thread {} '{}': state {}, in {}, syscall {}\n",
                        task.path().filename().string(), read_line(task.path() / "comm"),
                        fields.empty() ? "?" : fields[0], read_line(task.path() / "wchan"),
                        syscall.substr(0, syscall.find(' ')));
  }
  return text;
}

// The stacks from gdb, when it is installed and may attach (as root, or with ptrace_scope 0).
std::string gdb_stacks(pid_t pid) {
  if (std::system("command -v gdb >/dev/null 2>&1") != 0) return {};
  const std::string command = fmt::format(
      "timeout 30 gdb -p {} -batch -nx -ex 'thread apply all bt 12' 2>/dev/null | grep -E "
      "'^(Thread|#)'",
      pid);
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0 && out.size() < 64 * 1024;)
      out.append(buffer, n);
    pclose(pipe);
  }
  return out;
}

}  // namespace

std::string snapshot_process_group(pid_t group) {
  std::string text = fmt::format("[test harness: process group {} as it was given up on]\n", group);
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto fields = stat_fields(entry.path() / "stat");
    if (fields.size() < 3 || fields[2] != std::to_string(group)) continue;
    std::string command = read_line(entry.path() / "cmdline");
    for (char& c : command) c = c == '\0' ? ' ' : c;
    text += fmt::format("  process {} (parent {}, state {}): {}\n", name, fields[1], fields[0],
                        command.substr(0, 200));
    text += describe_threads(entry.path());
    if (fields[0] != "Z") text += gdb_stacks(std::stoi(name));
  }
  return text;
}

}  // namespace nanoddp::testing
