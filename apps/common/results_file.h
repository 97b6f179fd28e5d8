#pragma once
// A benchmark's results file (--json, --csv), handled one way by every benchmark: opened and
// truncated before anything is measured, so that a path that cannot be written is a usage error
// at once; and every write checked, so that results lost to a full disk are an error naming the
// file (exit code 1), never a run that ends with code 0 and an empty file (an outside tester's
// `nanoddp-bench-gemm --json /dev/full`).
//
// Header-only, like cli.h: a dependency of the executables only.

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>

namespace nanoddp::common {

class ResultsFile {
 public:
  // `program` and `flag` name the file in messages: "nanoddp-bench-gemm: error: --json F: ...".
  ResultsFile(std::string program, std::string flag)
      : program_(std::move(program)), flag_(std::move(flag)) {}

  // Opens `path` for writing, truncated. Returns "" or the problem, naming the flag and the path
  // (for cli::usage_error: a file that cannot be opened is a usage error, exit 2).
  std::string open(const std::string& path) {
    path_ = path;
    errno = 0;
    out_.open(path, std::ios::trunc);
    if (out_.is_open()) return {};
    return flag_ + " " + path + ": cannot open the file for writing" +
           (errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : std::string());
  }
  bool is_open() const { return out_.is_open(); }

  // One line of results; a newline is appended. Checked at the next flush() or close().
  void write_line(std::string_view line) {
    if (out_.is_open()) out_ << line << '\n';
  }
  // Flushes the lines written so far: false, and said once on stderr, when a write failed.
  bool flush() {
    if (out_.is_open() && !out_.flush()) report();
    return !failed_;
  }
  // Flushes and closes (a full disk may show only here): false as flush().
  bool close() {
    if (!out_.is_open()) return !failed_;
    flush();
    out_.close();
    if (out_.fail()) report();
    return !failed_;
  }
  bool failed() const { return failed_; }

 private:
  void report() {
    if (!failed_) {
      std::cerr << program_ << ": error: " << flag_ << " " << path_
                << ": writing the results failed\n";
    }
    failed_ = true;
  }

  std::string program_, flag_, path_;
  std::ofstream out_;
  bool failed_ = false;
};

}  // namespace nanoddp::common
