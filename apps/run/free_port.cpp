#include "free_port.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace nanoddp::run {

int find_free_port(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(address.c_str(), "0", &hints, &found); rc != 0) {
    throw std::runtime_error(
        fmt::format("cannot resolve --master-addr '{}': {}", address, gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      close(fd);
      freeaddrinfo(found);
      return bound.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                 : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw std::runtime_error(fmt::format("cannot find a free port on '{}': {}", address, last_error));
}

}  // namespace nanoddp::run
