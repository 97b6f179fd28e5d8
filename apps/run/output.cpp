#include "output.h"

#include <unistd.h>

#include <cerrno>

namespace nanoddp::run {

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
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
  if (log_fd_ >= 0) write_all(log_fd_, std::string_view(out).substr(prefix_.size()));
}

}  // namespace nanoddp::run
