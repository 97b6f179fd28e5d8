#include "nanoddp/comm/store_socket.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <type_traits>

namespace nanoddp::comm::detail {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string format_address(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string format_seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", static_cast<double>(ms.count()) / 1000.0);
}

std::string errno_text(int err) {
  char buf[256];
  // The GNU strerror_r returns the message (maybe not in buf); the XSI one fills buf.
  const auto result = strerror_r(err, buf, sizeof buf);
  std::string text;
  if constexpr (std::is_same_v<std::remove_cv_t<decltype(result)>, char*>) {
    text = result;
  } else {
    text = result == 0 ? std::string(buf) : fmt::format("error {}", err);
  }
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

}  // namespace nanoddp::comm::detail
