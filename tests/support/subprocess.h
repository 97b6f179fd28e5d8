#pragma once
// Runs a real program for a test: no shell, argv as given, stdout and stderr captured together,
// a hard timeout (the child is killed, never waited on forever), and the exit code or signal.

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace nanoddp::testing {

struct ProcessResult {
  int exit_code = -1;  // valid when !signaled
  int signal = 0;      // the signal that ended it, when signaled
  bool signaled = false;
  bool timed_out = false;
  std::string output;  // stdout and stderr, interleaved
};

struct ProcessOptions {
  std::map<std::string, std::string> env;  // added to (or overriding) the test's environment
  std::chrono::milliseconds timeout{60000};
  std::string working_directory;
};

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// Path of an executable built by this project (build/bin/NAME), from NANODDP_BIN_DIR.
std::string bin_path(const std::string& name);

// A fresh empty directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace nanoddp::testing
