// The store server: one thread, one poll() loop over the listening socket, an eventfd (to wake
// it for shutdown) and every client connection, all non-blocking.
//
// Per connection it keeps an input buffer (bytes not yet decoded) and an output buffer (answers
// not yet sent). Both are bounded: the decoders reject any length over the limits as soon as it
// arrives, so a partial request is never bigger than the largest legal one; and a connection
// whose client does not read its answers (or is parked in a wait) is not read from beyond a
// small cap until it catches up.
//
// The requests themselves are answered in tcp_store_commands.cpp.

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "nanoddp/comm/store.h"
#include "nanoddp/comm/store_protocol.h"
#include "nanoddp/comm/store_socket.h"
#include "nanoddp/comm/tcp_store_server_impl.h"

namespace nanoddp::comm {

using namespace store_server;

namespace {

// File descriptors open in this process now (/proc/self/fd), or 0 if it cannot be read.
std::size_t open_descriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  std::size_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count > 0 ? count - 1 : 0;  // not the directory's own descriptor
}

// How many client connections this process can hold and still open its own files: three
// quarters of the descriptors free under the soft RLIMIT_NOFILE, at least 8. A flood of
// connections that took every descriptor would make the job's next open() (a checkpoint,
// /proc/<pid>/stat for a liveness check) fail, and fail the job.
std::size_t connection_cap(std::size_t configured) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return configured;
  }
  const auto soft = static_cast<std::size_t>(limit.rlim_cur);
  const std::size_t used = open_descriptors();
  const std::size_t free = soft > used ? soft - used : 0;
  return std::min(configured, std::max<std::size_t>(8, free - free / 4));
}

}  // namespace

TcpStoreServer::Impl::Impl(const TcpStoreOptions& opts)
    : options(opts),
      token(detail::store_token(opts)),
      limits(detail::store_limits(opts)),
      address(detail::format_address(opts.host, opts.port)),
      max_connections(connection_cap(opts.max_connections)),
      handshake_timeout(std::min(opts.handshake_timeout, opts.timeout)) {
  stats.max_connections = max_connections;
}

void TcpStoreServer::Impl::bind_and_listen() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options.port);
  const int rc = ::getaddrinfo(options.host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0) {
    throw StoreError(
        fmt::format("cannot start the store on {}: cannot resolve '{}': {} (set "
                    "MASTER_ADDR to an address of this machine)",
                    address, options.host, ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  int last_errno = 0;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last_errno = errno;
      continue;
    }
    // Lets a restarted job rebind while the previous one's connections sit in TIME_WAIT; a port
    // someone still listens on is refused all the same.
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
      last_errno = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    listen_fd = std::move(fd);
    return;
  }
  if (last_errno == EADDRINUSE) {
    throw StoreError(
        fmt::format("cannot start the store on {}: address already in use (another "
                    "job? pick another port: MASTER_PORT)",
                    address));
  }
  if (last_errno == EADDRNOTAVAIL) {
    throw StoreError(
        fmt::format("cannot start the store on {}: {} is not an address of this "
                    "machine (check MASTER_ADDR)",
                    address, options.host));
  }
  throw StoreError(
      fmt::format("cannot start the store on {}: {}", address, detail::errno_text(last_errno)));
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<std::uint64_t> ids;
  while (!stop.load()) {
    try {
      loop_once(fds, ids);
    } catch (const std::exception&) {
      // Out of memory outside any one connection's work: back off and go on serving.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  conns.clear();  // closes every client: parked ones see the connection end
  publish_stats();
}

void TcpStoreServer::Impl::loop_once(std::vector<pollfd>& fds, std::vector<std::uint64_t>& ids) {
  // Decode what was buffered (new input, unparked connections, drained output).
  while (!runnable.empty()) {
    const std::uint64_t id = runnable.front();
    runnable.pop_front();
    auto it = conns.find(id);
    if (it == conns.end() || it->second.dead) continue;
    try {
      process(id, it->second);
    } catch (const std::exception&) {
      kill(it->second);  // e.g. out of memory for its value: that client loses its connection
    }
  }
  std::erase_if(conns, [](const auto& kv) { return kv.second.dead; });
  publish_stats();

  const Clock::time_point now = Clock::now();
  fds.clear();
  ids.clear();
  fds.push_back({wake_fd.get(), POLLIN, 0});
  fds.push_back({listen_fd.get(), static_cast<short>(now >= accept_paused_until ? POLLIN : 0), 0});
  Clock::time_point next = Clock::time_point::max();
  if (accept_paused_until > now) next = accept_paused_until;
  for (auto& [id, c] : conns) {
    short events = 0;
    const bool stalled = c.parked || c.pending_out() >= kOutputHighWater;
    if (!c.closing && (!stalled || c.in.size() < kStalledReadCap)) events |= POLLIN;
    if (c.pending_out() > 0) events |= POLLOUT;
    fds.push_back({c.fd.get(), events, 0});
    ids.push_back(id);
    if (c.parked || !c.greeted) next = std::min(next, c.deadline);
  }
  int timeout_ms = -1;
  if (next != Clock::time_point::max()) {
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    timeout_ms = static_cast<int>(std::clamp<std::int64_t>(wait, 0, 60'000));
  }
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0) {
    if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
  if (fds[0].revents != 0) {
    std::uint64_t count = 0;
    [[maybe_unused]] const auto r = ::read(wake_fd.get(), &count, sizeof count);
    if (stop.load()) return;
  }
  for (std::size_t i = 2; i < fds.size(); ++i) {
    const short revents = fds[i].revents;
    if (revents == 0) continue;
    auto it = conns.find(ids[i - 2]);
    if (it == conns.end()) continue;
    Connection& c = it->second;
    if (revents & (POLLERR | POLLNVAL)) {
      kill(c);
      continue;
    }
    if (revents & POLLOUT) flush(c);
    if (revents & (POLLIN | POLLHUP)) {
      try {
        read_from(it->first, c);
      } catch (const std::exception&) {
        kill(c);
      }
    }
  }
  if (fds[1].revents & POLLIN) accept_all();
  expire(Clock::now());
  std::erase_if(conns, [](const auto& kv) { return kv.second.dead; });
}

void TcpStoreServer::Impl::accept_all() {
  while (true) {
    UniqueFd fd(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the listener stays readable, so pause accepting instead of
        // spinning; connections wait in the backlog meanwhile.
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    // Room for it: past the cap, the oldest connection still in its handshake goes (a client
    // of the job sends its hello at once, so this is one that idles), or else the new one.
    if (conns.size() >= max_connections && !evict_oldest_handshaking()) {
      ++dropped;
      continue;  // closed by fd's destructor
    }
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Connection c;
    c.fd = std::move(fd);
    c.deadline = Clock::now() + handshake_timeout;
    handshaking.push_back(next_id);
    conns.emplace(next_id++, std::move(c));
  }
}

bool TcpStoreServer::Impl::evict_oldest_handshaking() {
  while (!handshaking.empty()) {
    const std::uint64_t id = handshaking.front();
    handshaking.pop_front();
    auto it = conns.find(id);
    if (it == conns.end() || it->second.greeted || it->second.dead) continue;
    ++dropped;
    conns.erase(it);  // closes it now: its descriptor is the room
    return true;
  }
  return false;
}

void TcpStoreServer::Impl::read_from(std::uint64_t id, Connection& c) {
  const std::size_t old = c.in.size();
  c.in.resize(old + kReadChunk);
  const ssize_t n = ::recv(c.fd.get(), c.in.data() + old, kReadChunk, 0);
  c.in.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
  if (n == 0) {
    // The client hung up. Whatever it left half-sent dies with the connection. (Not counted as
    // dropped: hanging up is how a client says goodbye.)
    c.dead = true;
    return;
  }
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) kill(c);
    return;
  }
  runnable.push_back(id);
}

void TcpStoreServer::Impl::flush(Connection& c) {
  while (c.pending_out() > 0) {
    const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.out_pos, c.pending_out(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      kill(c);
      return;
    }
    c.out_pos += static_cast<std::size_t>(n);
  }
  c.out.clear();
  c.out_pos = 0;
  release_if_big(c.out);
  if (c.closing) c.dead = true;
}

void TcpStoreServer::Impl::publish_stats() {
  TcpStoreServerStats s;
  s.connections = conns.size();
  s.keys = data.size();
  s.dropped = dropped;
  s.max_connections = max_connections;
  for (const auto& [id, c] : conns) {
    s.parked += c.parked ? 1 : 0;
    s.buffered_bytes += c.in.capacity() + c.out.capacity();
  }
  std::lock_guard lock(stats_mutex);
  stats = s;
}

TcpStoreServer::TcpStoreServer(const TcpStoreOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  impl_->bind_and_listen();
  impl_->wake_fd = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl_->wake_fd) {
    throw StoreError(fmt::format("cannot start the store on {}: eventfd failed: {}", impl_->address,
                                 detail::errno_text(errno)));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto r = ::write(impl_->wake_fd.get(), &one, sizeof one);
  impl_->thread.join();
}

std::uint16_t TcpStoreServer::port() const {
  return impl_->port;
}

TcpStoreServerStats TcpStoreServer::stats() const {
  std::lock_guard lock(impl_->stats_mutex);
  return impl_->stats;
}

}  // namespace nanoddp::comm
