#pragma once
// Worker output, line by line: the bytes read from one worker pipe are cut into lines, and each
// complete line goes out as "[rank R] line\n" in a single write(). The launcher is the only
// writer of its stdout and stderr and writes whole lines, so lines of different ranks never
// interleave mid-line, however the workers' writes were split by the pipes.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace nanoddp::run {

// Writes all of `data` to `fd`, retrying after EINTR and short writes. Errors (a closed terminal,
// EPIPE from `| head`, a full disk) drop the rest: the launcher must keep supervising its
// workers even when nobody reads their output any more. Returns 0 when everything was written,
// else the errno of the failure (ENOSPC for a write that made no progress on a full disk).
int write_all(int fd, std::string_view data);

class LineSink {
 public:
  // A line longer than this is written in pieces of this size (each with the prefix and a
  // newline), so a worker that never prints a newline cannot grow the launcher's memory.
  static constexpr std::size_t kMaxLine = 64 * 1024;

  // `log_fd` < 0: no log file. Otherwise lines are also written there, without the prefix. When
  // a write there fails (a full disk), one warning naming `log_name` goes to stderr and the
  // log gets no more lines (a line cut short would look complete). Sinks sharing one log (a
  // rank's stdout and stderr) share `log_failed`, so that the warning comes once.
  LineSink(int out_fd, std::string prefix, int log_fd = -1, std::string log_name = {},
           std::shared_ptr<bool> log_failed = std::make_shared<bool>(false))
      : out_fd_(out_fd),
        prefix_(std::move(prefix)),
        log_fd_(log_fd),
        log_name_(std::move(log_name)),
        log_failed_(std::move(log_failed)) {}

  void feed(std::string_view bytes);
  // Writes a final line that did not end with a newline (adding one). Call when the pipe closed.
  void flush();

 private:
  void emit(std::string_view line);  // without its '\n'

  int out_fd_;
  std::string prefix_;
  int log_fd_;
  std::string log_name_;
  std::shared_ptr<bool> log_failed_;
  std::string partial_;  // bytes after the last newline seen
};

}  // namespace nanoddp::run
