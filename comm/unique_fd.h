#pragma once
// A file descriptor that closes itself, once. The TCP store's client and server hold sockets
// and an eventfd; the launcher (apps/run) holds two pipes and a log file per worker. Every early
// return (a refused connection, a failed spawn, a signal) must close them, not leak them into
// the next attempt.

#include <unistd.h>

#include <utility>

namespace nanoddp::comm {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace nanoddp::comm
