#include "nanoddp/comm/store_socket.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
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

std::string describe_keys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return fmt::format("key '{}'", keys.front());
  std::string s = "keys ";
  for (std::size_t i = 0; i < keys.size() && i < 5; ++i) {
    s += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  }
  if (keys.size() > 5) s += fmt::format(" and {} more", keys.size() - 5);
  return s;
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

namespace {

int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, 60'000));
}

}  // namespace

// Waits for `events` on fd until the deadline; kOk when ready.
IoResult wait_for(int fd, short events, Clock::time_point deadline, int& err) {
  while (true) {
    pollfd p{fd, events, 0};
    const int timeout = poll_ms(deadline);
    const int n = ::poll(&p, 1, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return IoResult::kError;
    }
    if (n > 0) return IoResult::kOk;  // errors and hang-ups show up in the send / recv
    if (Clock::now() >= deadline) return IoResult::kTimeout;
  }
}

IoResult send_all(int fd, std::span<const std::uint8_t> data, Clock::time_point deadline,
                  int& err) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return IoResult::kClosed;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
      return IoResult::kError;
    }
    const IoResult r = wait_for(fd, POLLOUT, deadline, err);
    if (r != IoResult::kOk) return r;
  }
  return IoResult::kOk;
}

// Receives whatever is there (at least one byte) into the back of `buf`.
IoResult recv_some(int fd, protocol::Bytes& buf, Clock::time_point deadline, int& err) {
  constexpr std::size_t kChunk = 64u << 10;
  while (true) {
    const std::size_t old = buf.size();
    buf.resize(old + kChunk);
    const ssize_t n = ::recv(fd, buf.data() + old, kChunk, MSG_DONTWAIT);
    buf.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) return IoResult::kOk;
    if (n == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return IoResult::kClosed;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
      return IoResult::kError;
    }
    const IoResult r = wait_for(fd, POLLIN, deadline, err);
    if (r != IoResult::kOk) return r;
  }
}

std::optional<UniqueFd> connect_tcp(const std::string& host, std::uint16_t port,
                                    Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0) {
    // Retried too: a cluster's DNS may learn the master's name a moment after we start.
    why = fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc));
    return std::nullopt;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd s(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s) {
      why = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        why = errno_text(errno);
        continue;
      }
      const IoResult r = wait_for(s.get(), POLLOUT, deadline, err);
      if (r != IoResult::kOk) {
        why = r == IoResult::kTimeout ? "connecting timed out" : errno_text(err);
        continue;
      }
      socklen_t len = sizeof err;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        why = errno_text(err);
        continue;
      }
    }
    const int one = 1;
    ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
  }
  return std::nullopt;
}

UniqueFd connect_with_retry(const std::string& server, const std::string& hint,
                            std::chrono::milliseconds budget, const ConnectAttempt& attempt) {
  const auto deadline = Clock::now() + budget;
  auto backoff = std::chrono::milliseconds(kFirstBackoff);
  int attempts = 0;
  std::string why = "no attempt finished";
  while (true) {
    ++attempts;
    if (auto s = attempt(deadline, why)) return std::move(*s);
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  throw StoreError(fmt::format("cannot reach {} after {} ({}); {} attempts, the last one: {}",
                               server, format_seconds(budget), hint, attempts, why));
}

std::string no_answer_message(const std::string& server, const std::string& what,
                              std::chrono::milliseconds timeout, const std::string& hint) {
  return fmt::format("{} did not answer {} within {}{}", server, what, format_seconds(timeout),
                     hint.empty() ? "" : " (" + hint + ")");
}

}  // namespace nanoddp::comm::detail
