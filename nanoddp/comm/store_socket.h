#pragma once
// Small POSIX socket helpers shared by the TCP store's client and server (internal).

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace nanoddp::comm::detail {

// Owns a file descriptor; closes it once.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "127.0.0.1:29500", or "[::1]:29500" for an IPv6 literal.
std::string format_address(const std::string& host, std::uint16_t port);
// "0.3 s", "300 s": how messages state a timeout.
std::string format_seconds(std::chrono::milliseconds ms);
// strerror, thread-safely, lower-cased the way our messages use it ("connection refused").
std::string errno_text(int err);

}  // namespace nanoddp::comm::detail
