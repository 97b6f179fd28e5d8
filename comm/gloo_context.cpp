#include "nanoddp/comm/gloo_context.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "nanoddp/comm/gloo_store.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {
namespace {

// The local IP address the kernel would use to reach `host`. A connected UDP socket sends
// nothing; connect() only picks the route, and getsockname() reads the source address back.
// This is how a multi-homed machine (loopback, docker bridge, two NICs) binds Gloo to the
// interface that can actually reach the other ranks.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), "9", &hints, &result);
  if (rc != 0) {
    fail("cannot resolve the master address '{}': {} (is MASTER_ADDR right?)", host,
         gai_strerror(rc));
  }
  std::string address;
  for (addrinfo* ai = result; ai != nullptr && address.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) address = text;
    }
    close(fd);
  }
  freeaddrinfo(result);
  if (address.empty()) fail("no local network route reaches the master address '{}'", host);
  return address;
}

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Gloo's error for a connect to a peer's listening socket that is gone (the process died):
// found at once, not after the timeout.
bool refused(const std::string& cause) {
  return cause.find("Connection refused") != std::string::npos ||
         cause.find("Connection reset") != std::string::npos;
}

// The addresses rank r published for its pairs in Gloo's rendezvous (this Gloo stores them
// under key "r", one per other rank in rank order), as Gloo prints them, "$seq" dropped. Empty
// when the key is absent or of another Gloo's layout.
std::vector<std::string> rendezvous_addresses(Store& gloo_keys, int r, int size) {
  std::vector<std::string> out;
  if (size < 2 || !gloo_keys.check({std::to_string(r)})) return out;
  const Bytes all = gloo_keys.get(std::to_string(r));
  const std::size_t others = static_cast<std::size_t>(size - 1);
  if (all.empty() || all.size() % others != 0) return out;
  const std::size_t chunk = all.size() / others;
  // Gloo's Address copies the bytes it is given: only whole addresses of this build.
  if (chunk != gloo::transport::tcp::Address().bytes().size()) return out;
  for (std::size_t i = 0; i < others; ++i) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(i * chunk);
    const std::vector<char> bytes(first, first + static_cast<std::ptrdiff_t>(chunk));
    std::string address = gloo::transport::tcp::Address(bytes).str();
    out.push_back(address.substr(0, address.find('$')));
  }
  return out;
}

// The rank whose address Gloo's connect error names ("connect [ip]:port: Connection refused",
// "Connect timeout [ip]:port"), from the pair addresses every rank published. -1 when none
// matches (another Gloo's layout, the store gone).
int rank_named_in(Store& gloo_keys, int rank, int size, const std::string& cause) {
  if (size < 2) return -1;
  try {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::vector<std::string> theirs = rendezvous_addresses(gloo_keys, r, size);
      if (theirs.empty()) continue;
      const std::string& address = theirs[static_cast<std::size_t>(rank < r ? rank : rank - 1)];
      for (auto at = cause.find(address); at != std::string::npos;
           at = cause.find(address, at + 1)) {
        const std::size_t after = at + address.size();
        if (after == cause.size() || std::isdigit(static_cast<unsigned char>(cause[after])) == 0) {
          return r;
        }
      }
    }
  } catch (const std::exception&) {
    // Another layout, or the store is gone: the original error says enough.
  }
  return -1;
}

// Who kept the mesh from forming, for connect_gloo's error: ranks that never joined, ranks that
// joined but never published their Gloo address, or the peer Gloo's error names.
std::string who_failed_to_connect(Store& gloo_keys, int rank, int size, const std::string& cause) {
  std::string missing;
  std::string silent;
  try {
    for (int r = 0; r < size; ++r) {
      if (!gloo_keys.check({fmt::format("joined/{}", r)})) {
        missing += missing.empty() ? std::to_string(r) : ", " + std::to_string(r);
      }
    }
    // This Gloo publishes each rank's addresses under its rank number; looked for only when this
    // rank's own key is there (another Gloo may name them otherwise).
    if (missing.empty() && gloo_keys.check({std::to_string(rank)})) {
      for (int r = 0; r < size; ++r) {
        if (!gloo_keys.check({std::to_string(r)})) {
          silent += silent.empty() ? std::to_string(r) : ", " + std::to_string(r);
        }
      }
    }
  } catch (const std::exception&) {
    return "a peer did not complete the connection";  // the store is gone: the cause says more
  }
  if (!missing.empty()) return fmt::format("rank(s) {} never joined", missing);
  if (!silent.empty()) {
    return fmt::format(
        "rank(s) {} joined but never published their Gloo address (died or stalled while "
        "connecting?)",
        silent);
  }
  const int peer = rank_named_in(gloo_keys, rank, size, cause);
  const std::string named = peer >= 0 ? fmt::format("rank {}", peer) : std::string("a peer");
  if (refused(cause)) {
    return fmt::format("{} joined, then refused the connection: it died since", named);
  }
  return fmt::format("{} joined but did not complete the connection (died or stalled since?)",
                     named);
}

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

GlooConnection connect_gloo(std::shared_ptr<Store> store, int rank, int size,
                            const ProcessGroupOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    fail("Gloo group '{}': rank {} is outside a world of size {}", options.name, rank, size);
  }
  if (store == nullptr) fail("Gloo group '{}': no store to rendezvous through", options.name);

  // 1. The transport device: one listening socket and one epoll loop thread for this process.
  gloo::transport::tcp::attr attr;
  GlooConnection connection;
  const char* env_iface = std::getenv("NANODDP_SOCKET_IFNAME");
  if (env_iface != nullptr && *env_iface != '\0') {
    attr.iface = env_iface;
    connection.device_description =
        fmt::format("interface {} ($NANODDP_SOCKET_IFNAME)", attr.iface);
  } else if (!options.interface.empty()) {
    attr.iface = options.interface;
    connection.device_description = fmt::format("interface {}", attr.iface);
  } else if (!options.master_addr.empty()) {
    attr.hostname = local_address_towards(options.master_addr);
    connection.device_description =
        fmt::format("address {} (the route to {})", attr.hostname, options.master_addr);
  } else {
    attr.hostname = this_host_name();
    connection.device_description = fmt::format("host name {}", attr.hostname);
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail("Gloo group '{}': cannot open a TCP device on {}: {}", options.name,
         connection.device_description, e.what());
  }

  // 2. Connect every pair of ranks. Gloo publishes this rank's addresses in the store and
  // reads everybody else's; the keys live under "<group name>/" so two groups (or two
  // restarts, see init.cpp) never see each other's.
  auto prefixed = std::make_shared<PrefixStore>(options.name + "/gloo", std::move(store));
  // Our own "I got here" key: when the mesh cannot be completed, it tells which ranks never
  // started connecting (crashed before init, wrong MASTER_ADDR, wrong WORLD_SIZE).
  prefixed->set(fmt::format("joined/{}", rank), std::string("1"));
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  // This Gloo waits 5 x its timeout for a pair to connect ("a longer timeout when waiting for
  // initial connect", gloo/transport/tcp/pair.h): a peer that died between publishing its
  // address and connecting held rank 0 there for 25 s under NANODDP_TIMEOUT_S=5. With a fifth
  // of the timeout the connect ends within it; the rendezvous keys still get the whole timeout
  // (GlooStore), and so does every collective (each sets its own; the context gets it back).
  context->setTimeout(std::max(std::chrono::milliseconds(1), options.timeout / 5));
  const auto connect_start = std::chrono::steady_clock::now();
  try {
    GlooStore gloo_store(prefixed, options.timeout);
    context->connectFullMesh(gloo_store, device);
  } catch (const std::exception& e) {
    const std::string cause = e.what();
    // "within the timeout" only when it ran out; a peer that refused or closed says so sooner.
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - connect_start).count();
    std::string when;
    if (took >= 0.9 * seconds(options.timeout)) {
      when = fmt::format(" within {:.1f} s", seconds(options.timeout));
    } else if (!refused(cause)) {
      when = fmt::format(" (it failed after {:.1f} s)", took);
    }
    throw CommError(fmt::format(
        "Gloo group '{}': rank {} of {} could not connect to its peers{}: {} (is every rank "
        "running, with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT?). Cause: {}",
        options.name, rank, size, when, who_failed_to_connect(*prefixed, rank, size, cause),
        cause));
  }
  context->setTimeout(options.timeout);

  // 3. Every rank's addresses, to name the peer in later errors. Gloo's errors print a pair's
  // peer address, which is either the address the peer published in the rendezvous (where this
  // side connected to it) or the peer's end of the connection (where the peer connected), and
  // a pair's address() is its own end once connected. So each rank publishes both sets; the
  // "$seq" suffix is dropped, as Gloo's messages print the address without it.
  std::vector<std::string> mine;
  auto add = [&mine](std::string address) {
    address = address.substr(0, address.find('$'));
    if (std::find(mine.begin(), mine.end(), address) == mine.end()) mine.push_back(address);
  };
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) add(context->getPair(peer)->address().str());
  }
  for (const std::string& address : rendezvous_addresses(*prefixed, rank, size)) add(address);
  std::string own;
  for (const std::string& address : mine) own += (own.empty() ? "" : " ") + address;
  prefixed->set(fmt::format("address/{}", rank), own);
  connection.addresses.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::string list = own;
    if (r != rank) {
      try {
        list = prefixed->get_string(fmt::format("address/{}", r));
      } catch (const StoreError& e) {
        // Its pairs connected, so it was there a moment ago: name it, not just the key. But it
        // may be alive and still connecting to a rank that stalled (an outside tester's SIGSTOP
        // named a live rank 0 so): name every rank whose addresses are missing.
        std::string missing;
        try {
          for (int other = 0; other < size; ++other) {
            if (other == rank || prefixed->check({fmt::format("address/{}", other)})) continue;
            missing += (missing.empty() ? "" : ", ") + std::to_string(other);
          }
        } catch (const StoreError&) {
          missing.clear();  // the store is gone too: say what is known
        }
        const std::string who =
            missing.empty() || missing == std::to_string(r)
                ? fmt::format("rank {} died or stalled during the set-up", r)
                : fmt::format(
                      "ranks {} have not published theirs: one of them died or stalled during "
                      "the set-up, and the others may still be connecting to it",
                      missing);
        throw CommError(fmt::format(
            "Gloo group '{}': rank {} of {} connected to rank {}, which then did not publish its "
            "addresses: {}. Cause: {}",
            options.name, rank, size, r, who, e.what()));
      }
    }
    auto& out = connection.addresses[static_cast<std::size_t>(r)];
    for (std::size_t start = 0; start < list.size();) {
      std::size_t end = list.find(' ', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) out.push_back(list.substr(start, end - start));
      start = end + 1;
    }
  }
  connection.context = std::move(context);
  return connection;
}

std::string own_ip(const GlooConnection& connection, int rank) {
  const auto& mine = connection.addresses.at(static_cast<std::size_t>(rank));
  for (const std::string& address : mine) {
    const std::size_t close = address.rfind(']');
    if (!address.empty() && address[0] == '[' && close != std::string::npos) {
      return address.substr(1, close - 1);
    }
  }
  fail("Gloo group: rank {} has no address of its own to open another transport on", rank);
}

int gloo_peer_from_message(const std::string& message,
                           const std::vector<std::vector<std::string>>& addresses,
                           std::string* address) {
  // Gloo prints addresses as "[ip]:port" (IPv6 too: "[::1]:port"), optionally with "$seq".
  std::size_t open = message.find('[');
  while (open != std::string::npos) {
    const std::size_t close_bracket = message.find("]:", open);
    if (close_bracket == std::string::npos) break;
    std::size_t end = close_bracket + 2;
    while (end < message.size() && message[end] >= '0' && message[end] <= '9') ++end;
    const std::string token = message.substr(open, end - open);
    for (std::size_t r = 0; r < addresses.size(); ++r) {
      for (const std::string& candidate : addresses[r]) {
        if (candidate == token) {
          if (address != nullptr) *address = token;
          return static_cast<int>(r);
        }
      }
    }
    open = message.find('[', open + 1);
  }
  return -1;
}

}  // namespace nanoddp::comm
