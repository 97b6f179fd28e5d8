#include "output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace nanoddp::run {

int write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

void LineSink::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(bytes);
      // Cut an overlong line at kMaxLine so memory stays bounded.
      while (partial_.size() >= kMaxLine) {
        emit(std::string_view(partial_).substr(0, kMaxLine));
        partial_.erase(0, kMaxLine);
      }
      return;
    }
    if (partial_.empty()) {
      emit(bytes.substr(0, newline));
    } else {
      partial_.append(bytes.substr(0, newline));
      emit(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
}

void LineSink::flush() {
  if (partial_.empty()) return;
  emit(partial_);
  partial_.clear();
}

void LineSink::emit(std::string_view line) {
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  write_all(out_fd_, out);
  if (log_fd_ < 0 || *log_failed_) return;
  if (const int error = write_all(log_fd_, std::string_view(out).substr(prefix_.size()))) {
    // Said once per file; the launcher goes on supervising (and printing) the workers.
    *log_failed_ = true;
    write_all(STDERR_FILENO, "nanoddp-run: warning: writing '" + log_name_ + "' failed (" +
                                 std::strerror(error) +
                                 "): its last line is missing or cut short and no more lines "
                                 "are written there\n");
  }
}

}  // namespace nanoddp::run
