#include "nanoddp/comm/store_socket.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace nanoddp::comm::detail {

std::string store_token(const TcpStoreOptions& options) {
  if (!options.token.empty()) return options.token;
  const char* env = std::getenv("NANODDP_STORE_TOKEN");
  return env != nullptr ? env : "";
}

protocol::Limits store_limits(const TcpStoreOptions& options) {
  protocol::Limits limits;
  limits.max_key_bytes = options.max_key_bytes;
  limits.max_value_bytes = options.max_value_bytes;
  limits.max_keys = options.max_keys;
  return limits;
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
