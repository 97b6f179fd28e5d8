#include "nanoddp/comm/tcp_ring.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include <sys/uio.h>

#include "nanoddp/comm/gloo_helpers.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/engine/env.h"

namespace nanoddp::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x6e646472;  // "nddr": the first bytes of every message

// The most one send or receive moves: a received piece is combined while it is still in the
// core's L2 cache, and the two directions take turns often enough that neither socket's queue
// runs dry while the other is served.
constexpr std::size_t kPiece = std::size_t{256} << 10;

// An op's waits are cut into slices this long, so that time this process did not run (a gap
// between two waits much longer than a slice) can be told from a peer's lateness.
constexpr int kPollSliceMs = 200;
constexpr auto kNotRunning = std::chrono::seconds(1);

struct Hello {
  std::uint32_t magic;
  std::int32_t rank;
  std::uint64_t nonce;
};

// Before each chunk: which op and step it belongs to, what the op is (collective, dtype,
// reduction, whole element count) and the chunk's size. Ranks in different ops are told apart
// by any field, not only by the sizes (a reduce-scatter and an all-gather of one size move
// chunks of equal bytes).
struct Header {
  std::uint32_t magic;
  std::uint32_t step;
  std::uint64_t seq;
  std::uint64_t nbytes;
  std::uint64_t total;  // elements of the whole op
  std::uint32_t kind;   // collective << 16 | dtype << 8 | reduction
  std::uint32_t root;   // a broadcast's; 0 for the other collectives
};

enum Collective : std::uint32_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kBarrier = 4,
  kBroadcast = 5
};
constexpr std::uint32_t kNoReduction = 0xff;

std::uint32_t kind_of(Collective collective, DType dtype, std::uint32_t reduction) {
  return collective << 16 | static_cast<std::uint32_t>(dtype) << 8 | reduction;
}

// "reduce_scatter (sum, float32)" for a header's kind; numbers where a peer sent nonsense.
std::string kind_text(std::uint32_t kind) {
  const std::uint32_t collective = kind >> 16;
  const std::uint32_t dtype = (kind >> 8) & 0xff;
  const std::uint32_t reduction = kind & 0xff;
  const char* names[] = {"?", "allreduce", "reduce_scatter", "allgather", "barrier", "broadcast"};
  const std::string name = collective <= 5 ? names[collective] : fmt::format("op {}", collective);
  if (collective == kBarrier) return name;
  std::string dtype_text = fmt::format("dtype {}", dtype);
  for (DType d : {DType::kF32, DType::kBF16, DType::kI64}) {
    if (static_cast<std::uint32_t>(d) == dtype) dtype_text = std::string(dtype_name(d));
  }
  std::string reduction_text;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    if (static_cast<std::uint32_t>(op) == reduction) {
      reduction_text = std::string(reduce_op_name(op)) + ", ";
    }
  }
  return fmt::format("{} ({}{})", name, reduction_text, dtype_text);
}

std::string errno_text(int e) {
  return std::strerror(e);
}

// Gloo's spelling ("[ip]:port"), so that errors name peers alike on both paths.
std::string address_text(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, host, sizeof(host));
    port = ntohs(v4.sin_port);
  } else {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, host, sizeof(host));
    port = ntohs(v6.sin6_port);
  }
  return fmt::format("[{}]:{}", host, port);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

void set_nonblocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // No SO_SNDBUF / SO_RCVBUF: setting them turns off the kernel's autotuning of the buffers,
  // which grows them to net.ipv4.tcp_[rw]mem's maximum (MiBs), while an explicit size is capped
  // at net.core.[rw]mem_max (a few hundred KiB by default): a 64 MiB all-reduce took 1.5x as long.
}

bool write_exactly(int fd, const void* data, std::size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::size_t sent = 0;
  while (sent < n) {
    const ssize_t k = ::send(fd, p + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      sent += static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, remaining_ms(deadline)) == 0) return false;
  }
  return true;
}

addrinfo* resolve(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) fail("TCP ring: cannot use the address '{}': {}", host, gai_strerror(rc));
  return result;
}

}  // namespace

// ---- set-up ----------------------------------------------------------------------------------

TcpRing::TcpRing(Store& store, int rank, int size, std::chrono::milliseconds timeout,
                 const std::string& name, const std::string& bind_ip, std::vector<int> names)
    : rank_(rank), size_(size), names_(std::move(names)), timeout_(timeout) {
  if (!names_.empty() && names_.size() != static_cast<std::size_t>(size)) {
    fail("TcpRing: {} names for a ring of {}", names_.size(), size);
  }
  const std::string prefix = name + "/ring/";
  const auto deadline = Clock::now() + timeout;
  // 1. Take part or not, and say so.
  std::string mine;
  UniqueFd listener;
  std::uint64_t nonce = std::random_device{}();
  nonce = (nonce << 32) ^ std::random_device{}();
  // A switch this rank does not understand is published in its place ("! reason"), so that the
  // others stop with it rather than wait for this rank until their timeout.
  bool wanted = true;
  try {
    wanted = env_switch("NANODDP_TCP_RING", /*default_on=*/true);
  } catch (const Error& e) {
    store.set(prefix + std::to_string(rank), std::string("! ") + e.what());
    throw;
  }
  if (size < 2) {
    mine = "0 a group of one rank needs no ring";
  } else if (!wanted) {
    mine = fmt::format("0 NANODDP_TCP_RING=0 on rank {}", rank_name(rank));
  } else {
    addrinfo* ai = resolve(bind_ip, "0", true);
    listener.reset(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const bool bound = listener && ::bind(listener.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
                       ::listen(listener.get(), 16) == 0;
    const int bind_errno = errno;
    freeaddrinfo(ai);
    sockaddr_storage own{};
    socklen_t len = sizeof(own);
    if (!bound || getsockname(listener.get(), reinterpret_cast<sockaddr*>(&own), &len) != 0) {
      mine = fmt::format("0 rank {} cannot listen on {}: {}", rank_name(rank), bind_ip,
                         errno_text(bind_errno));
      listener.reset();
    } else {
      set_nonblocking(listener.get());
      const int port = own.ss_family == AF_INET
                           ? ntohs(reinterpret_cast<sockaddr_in&>(own).sin_port)
                           : ntohs(reinterpret_cast<sockaddr_in6&>(own).sin6_port);
      mine = fmt::format("1 {} {} {}", bind_ip, port, nonce);
    }
  }
  store.set(prefix + std::to_string(rank), mine);

  // 2. Read everyone's; the ring is used only if every rank takes part.
  std::vector<std::string> entries(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    try {
      entries[static_cast<std::size_t>(r)] =
          r == rank ? mine : store.get_string(prefix + std::to_string(r));
    } catch (const StoreError& e) {
      throw CommError(fmt::format(
          "TCP ring '{}': rank {} did not publish its ring address within {:.1f} s: it died or "
          "stalled during the set-up (the store: {})",
          name, rank_name(r), static_cast<double>(timeout.count()) / 1000.0, e.what()));
    }
  }
  for (int r = 0; r < size; ++r) {
    const std::string& e = entries[static_cast<std::size_t>(r)];
    if (e.rfind("! ", 0) == 0) {
      throw CommError(
          fmt::format("rank {} stopped setting up the TCP ring, so every rank stops: {}",
                      rank_name(r), e.substr(2)));
    }
  }
  for (const std::string& e : entries) {
    if (e.rfind("1 ", 0) != 0) {
      fallback_reason_ = e.size() > 2 ? e.substr(2) : std::string("a rank did not take part");
      // Said once, by rank 0, as the shared-memory fallback is: a slower path is never silent.
      if (rank == 0 && size > 1) {
        fmt::print(stderr, "nanoddp: allreduce goes around Gloo's TCP ring, not nanoddp's: {}\n",
                   fallback_reason_);
      }
      return;
    }
  }
  auto field = [](const std::string& entry, int index) {
    std::size_t start = 0;
    for (int i = 0; i < index; ++i) start = entry.find(' ', start) + 1;
    return entry.substr(start, entry.find(' ', start) - start);
  };
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  const std::string& next_entry = entries[static_cast<std::size_t>(next)];
  const std::string& prev_entry = entries[static_cast<std::size_t>(prev)];
  const std::uint64_t prev_nonce = std::strtoull(field(prev_entry, 3).c_str(), nullptr, 10);

  // 3. Connect to the next rank and accept the previous one. Either failure is published
  // before it is thrown, and every rank then waits for every other's outcome (4): a rank whose
  // own connections formed must not go on to the job's next store wait and time out there,
  // blaming whoever that wait was for, while the rank that knows the cause is still waiting.
  const std::string done_key = prefix + "done/";
  try {
    connect_ring(listener.get(), field(next_entry, 1), field(next_entry, 2), nonce, prev_nonce,
                 name, deadline);
  } catch (const std::exception& e) {
    try {
      store.set(done_key + std::to_string(rank), std::string("! ") + e.what());
    } catch (const std::exception&) {
      // The store is gone too: the others then time out below, naming this rank.
    }
    throw;
  }
  store.set(done_key + std::to_string(rank), std::string("ok"));
  // 4. Everyone's outcome.
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::string outcome;
    try {
      outcome = store.get_string(done_key + std::to_string(r));
    } catch (const StoreError& e) {
      throw CommError(fmt::format(
          "TCP ring '{}': rank {} did not finish setting up its connections within {:.1f} s: it "
          "died or stalled during the set-up (the store: {})",
          name, rank_name(r), static_cast<double>(timeout.count()) / 1000.0, e.what()));
    }
    if (outcome.rfind("! ", 0) == 0) {
      throw CommError(fmt::format("rank {} could not set up the TCP ring, so every rank stops: {}",
                                  rank_name(r), outcome.substr(2)));
    }
  }
  for (int fd : {next_.get(), prev_.get()}) {
    set_nonblocking(fd);
    tune(fd);
  }
  enabled_ = true;
}

void TcpRing::connect_ring(int listener, const std::string& next_ip, const std::string& next_port,
                           std::uint64_t nonce, std::uint64_t prev_nonce, const std::string& name,
                           Clock::time_point deadline) {
  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  // Connect to the next rank and say hello. Its listener exists (it published after listen), so
  // the connection completes in its backlog even before it accepts.
  {
    addrinfo* ai = resolve(next_ip, next_port, false);
    next_.reset(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const bool connected = next_ && ::connect(next_.get(), ai->ai_addr, ai->ai_addrlen) == 0;
    const int connect_errno = errno;
    next_address_ = fmt::format("[{}]:{}", next_ip, next_port);
    freeaddrinfo(ai);
    const Hello hello{kMagic, rank_, nonce};
    if (!connected || !write_exactly(next_.get(), &hello, sizeof(hello), deadline)) {
      throw CommError(fmt::format(
          "TCP ring '{}': rank {} of {} cannot connect to rank {} at {}: {} (is a firewall "
          "between them? NANODDP_TCP_RING=0 on every rank uses Gloo's ring instead)",
          name, rank_name(rank_), size_, rank_name(next), next_address_,
          connected ? std::string("it closed the connection") : errno_text(connect_errno)));
    }
  }
  // Accept the previous rank: the connection whose hello is its rank and nonce. Connections are
  // read side by side, so strangers (a port scanner, an idle client) cost nothing but a slot:
  // the oldest is dropped when all are taken.
  struct Pending {
    UniqueFd fd;
    sockaddr_storage peer{};
    Hello hello{};
    std::size_t got = 0;
  };
  constexpr std::size_t kMaxPending = 64;
  std::vector<Pending> pending;
  int dropped = 0;
  while (!prev_) {
    std::vector<pollfd> fds = {{listener, POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), remaining_ms(deadline)) == 0 && Clock::now() >= deadline) {
      throw CommError(fmt::format(
          "TCP ring '{}': rank {} of {} was not connected to by rank {} within {:.1f} s: rank {} "
          "died or stalled during the set-up{}",
          name, rank_name(rank_), size_, rank_name(prev),
          static_cast<double>(timeout_.count()) / 1000.0, rank_name(prev),
          dropped > 0 ? fmt::format(" ({} other connections to this rank's ring port were "
                                    "dropped: they were not rank {}'s)",
                                    dropped, rank_name(prev))
                      : std::string()));
    }
    for (std::size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t k = ::recv(p.fd.get(), reinterpret_cast<std::uint8_t*>(&p.hello) + p.got,
                               sizeof(Hello) - p.got, MSG_DONTWAIT);
      if (k > 0) p.got += static_cast<std::size_t>(k);
      const bool complete = p.got == sizeof(Hello);
      const bool theirs = complete && p.hello.magic == kMagic && p.hello.rank == prev &&
                          p.hello.nonce == prev_nonce;
      if (theirs) {
        prev_ = std::move(p.fd);
        prev_address_ = address_text(p.peer);
        break;
      }
      if (complete || k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        debug_log(DebugLevel::kInfo, "TCP ring '{}': dropped a connection from {}: not rank {}'s",
                  name, address_text(p.peer), rank_name(prev));
        ++dropped;
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    if (prev_ || (fds[0].revents & POLLIN) == 0) continue;
    Pending p;
    socklen_t len = sizeof(p.peer);
    p.fd.reset(::accept4(listener, reinterpret_cast<sockaddr*>(&p.peer), &len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!p.fd) continue;
    if (pending.size() == kMaxPending) {
      ++dropped;
      pending.erase(pending.begin());
    }
    pending.push_back(std::move(p));
  }
}

std::string TcpRing::describe() const {
  return fmt::format("to rank {} at {}, from rank {} at {}", rank_name((rank_ + 1) % size_),
                     next_address_, rank_name((rank_ + size_ - 1) % size_), prev_address_);
}

// ---- one step: send a chunk to the next rank while receiving one from the previous ----------

struct TcpRing::Transfer {
  Header out_header;
  const std::uint8_t* out;
  Header in_header;  // what the previous rank must send
  std::uint8_t* in;
  // Called with [from, to) byte offsets of `in` as whole elements arrive (may be empty).
  std::size_t element_bytes;
  std::function<void(std::size_t, std::size_t)> arrived;
  bool ends_op;  // the op's last step: the next rank may leave once it has this rank's data
};

void TcpRing::still_running(Clock::time_point& deadline) {
  const auto now = Clock::now();
  if (now - checked_in_ > std::chrono::milliseconds(kPollSliceMs) + kNotRunning) {
    deadline += now - checked_in_ - std::chrono::milliseconds(kPollSliceMs);
  }
  checked_in_ = now;
}

void TcpRing::exchange(Transfer& t, Clock::time_point& deadline) {
  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  const std::size_t out_total = sizeof(Header) + t.out_header.nbytes;
  const std::size_t in_total = sizeof(Header) + t.in_header.nbytes;
  std::size_t sent = 0;
  std::size_t received = 0;
  std::size_t handed = 0;  // payload bytes given to `arrived`
  Header got{};
  while (sent < out_total || received < in_total) {
    still_running(deadline);
    bool progress = false;
    if (sent < out_total) {
      iovec iov[2];
      int count = 0;
      if (sent < sizeof(Header)) {
        iov[count++] = {reinterpret_cast<std::uint8_t*>(&t.out_header) + sent,
                        sizeof(Header) - sent};
      }
      const std::size_t payload_sent = sent > sizeof(Header) ? sent - sizeof(Header) : 0;
      if (t.out_header.nbytes > payload_sent) {
        iov[count++] = {const_cast<std::uint8_t*>(t.out) + payload_sent,
                        std::min(t.out_header.nbytes - payload_sent, kPiece)};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(count);
      const ssize_t k = ::sendmsg(next_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<std::size_t>(k);
        progress = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw TcpRingError(fmt::format("send to rank {}: {}", rank_name(next), errno_text(errno)),
                           TcpRingError::Kind::kConnectionLost, next, next_address_);
      }
    }
    if (received < in_total) {
      ssize_t k;
      if (received < sizeof(Header)) {
        k = ::recv(prev_.get(), reinterpret_cast<std::uint8_t*>(&got) + received,
                   sizeof(Header) - received, MSG_DONTWAIT);
      } else {
        k = ::recv(prev_.get(), t.in + (received - sizeof(Header)),
                   std::min(in_total - received, kPiece), MSG_DONTWAIT);
      }
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        const std::string how = k == 0 ? std::string("closed the connection") : errno_text(errno);
        // A failure travels round the ring the way the data does, from a dead rank to the rank
        // after it and on. So when the next rank has hung up as well, it is the likelier first
        // (the previous rank then failed on the way round): name it. Seen in an all-gather's
        // last step, where the next rank is no longer watched (an outside tester's).
        pollfd next_fd{next_.get(), POLLRDHUP, 0};
        if (next != prev && ::poll(&next_fd, 1, 0) > 0 &&
            (next_fd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
          throw TcpRingError(fmt::format("rank {} closed the connection, and rank {} after it ({})",
                                         rank_name(next), rank_name(prev), how),
                             TcpRingError::Kind::kConnectionLost, next, next_address_);
        }
        throw TcpRingError(k == 0 ? fmt::format("rank {} closed the connection", rank_name(prev))
                                  : fmt::format("receive from rank {}: {}", rank_name(prev), how),
                           TcpRingError::Kind::kConnectionLost, prev, prev_address_);
      }
      if (k > 0) {
        const bool header_was_partial = received < sizeof(Header);
        received += static_cast<std::size_t>(k);
        progress = true;
        if (header_was_partial && received >= sizeof(Header)) {
          if (got.magic != kMagic) {
            throw TcpRingError(fmt::format("rank {} ({}) sent bytes that are not a ring message",
                                           rank_name(prev), prev_address_),
                               TcpRingError::Kind::kMismatch, prev, prev_address_);
          }
          if (got.seq != t.in_header.seq || got.step != t.in_header.step) {
            throw TcpRingError(
                fmt::format("rank {} sent step {} of op #{} while this rank runs step {} of op "
                            "#{}: the ranks issued different ops",
                            rank_name(prev), got.step, got.seq, t.in_header.step, t.in_header.seq),
                TcpRingError::Kind::kMismatch, prev, prev_address_);
          }
          if (got.kind != t.in_header.kind) {
            throw TcpRingError(
                fmt::format("rank {} sent op #{} as {}, this rank runs it as {}: the ranks issued "
                            "different ops",
                            rank_name(prev), got.seq, kind_text(got.kind),
                            kind_text(t.in_header.kind)),
                TcpRingError::Kind::kMismatch, prev, prev_address_);
          }
          if (got.root != t.in_header.root) {
            throw TcpRingError(
                fmt::format("rank {} broadcasts op #{} from rank {}, this rank from rank {}: the "
                            "ranks gave different roots",
                            rank_name(prev), got.seq, rank_name(static_cast<int>(got.root)),
                            rank_name(static_cast<int>(t.in_header.root))),
                TcpRingError::Kind::kMismatch, prev, prev_address_);
          }
          if (got.total != t.in_header.total) {
            throw TcpRingError(
                fmt::format("rank {} runs op #{}, {}, over {} elements, this rank over {}: the "
                            "ranks ran it on buffers of different sizes",
                            rank_name(prev), got.seq, kind_text(got.kind), got.total,
                            t.in_header.total),
                TcpRingError::Kind::kMismatch, prev, prev_address_);
          }
          if (got.nbytes != t.in_header.nbytes) {
            throw TcpRingError(
                fmt::format("rank {} sent {} bytes for step {} of op #{}, this rank expected {}: "
                            "the ranks all-reduce buffers of different sizes",
                            rank_name(prev), got.nbytes, got.step, got.seq, t.in_header.nbytes),
                TcpRingError::Kind::kMismatch, prev, prev_address_);
          }
        }
        if (t.arrived && received > sizeof(Header)) {
          const std::size_t payload = received - sizeof(Header);
          const std::size_t whole = payload - payload % t.element_bytes;
          if (whole > handed) {
            t.arrived(handed, whole);
            handed = whole;
          }
        }
      }
    }
    if (progress) continue;
    // The next rank never sends on its connection: readable there means it closed or reset.
    // Watched always, so the rank before a dead one names it at once, instead of waiting on its
    // own receive until the failure has gone round the ring and come back from the other side.
    // Only where the next rank still needs this rank's data: after the op's last send it may
    // have finished the op and exited, which is no failure.
    const bool next_must_stay = sent < out_total || !t.ends_op;
    pollfd fds[2] = {
        {next_.get(),
         static_cast<short>((next_must_stay ? POLLRDHUP : 0) | (sent < out_total ? POLLOUT : 0)),
         0},
        {prev_.get(), static_cast<short>(received < in_total ? POLLIN : 0), 0}};
    const auto slice = std::min(remaining_ms(deadline), kPollSliceMs);
    const int ready = ::poll(fds, 2, slice);
    // A gap between two check-ins far longer than a slice means this process did not run
    // (stopped: Ctrl-Z under nanoddp-run stops every rank; or starved), in the wait or between
    // waits: not a peer's lateness, so the deadline moves, as the shared-memory path's does.
    still_running(deadline);
    const auto now = checked_in_;
    // What the previous rank sent is read first: a header that shows the ranks in different
    // ops says more than the hang-up that follows it.
    const bool can_read = (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    if (!can_read && next_must_stay && (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      throw TcpRingError(fmt::format("rank {} closed the connection", rank_name(next)),
                         TcpRingError::Kind::kConnectionLost, next, next_address_);
    }
    if (ready == 0 && now >= deadline) {
      // Waiting to receive blames the rank before; only a full send queue blames the next.
      const bool on_receive = received < in_total;
      const int peer = on_receive ? prev : next;
      throw TcpRingError(fmt::format("Timed out after {:.1f} s waiting to {} rank {}",
                                     static_cast<double>(timeout_.count()) / 1000.0,
                                     on_receive ? "receive from" : "send to", rank_name(peer)),
                         TcpRingError::Kind::kTimedOut, peer,
                         on_receive ? prev_address_ : next_address_);
    }
  }
}

// ---- the collectives ---------------------------------------------------------------------

// Chunk c of n elements cut W ways: elements [first(c), first(c + 1)), n / W each, and the last
// chunk also the n % W left over. So element i of an all-reduce lies in the chunk that holds it
// in a reduce-scatter of the first W * (n / W) elements (ZeRO's, whose left-over elements are
// all-reduced on their own, in the last chunk): both sum it in the same order, to the same bits.
struct TcpRing::Chunks {
  std::size_t n;
  std::size_t w;
  std::size_t elem;
  std::uint32_t kind;  // the header's
  std::uint32_t root = 0;
  Header header(std::uint32_t step, std::uint64_t seq, std::uint64_t nbytes) const {
    return Header{.magic = kMagic,
                  .step = step,
                  .seq = seq,
                  .nbytes = nbytes,
                  .total = n,
                  .kind = kind,
                  .root = root};
  }
  std::size_t first(std::size_t c) const { return c == w ? n : c * (n / w); }
  std::size_t bytes(std::size_t c) const { return (first(c + 1) - first(c)) * elem; }
  std::size_t offset(std::size_t c) const { return first(c) * elem; }
};

std::size_t TcpRing::chunk(int c) const {
  return static_cast<std::size_t>(((c % size_) + size_) % size_);
}

// W-1 steps; in step s this rank sends its partial of chunk (r-s-1) and receives the previous
// rank's partial of chunk (r-s-2), combining it with its own input's as the bytes arrive: into
// a partial for the next step, or at the last step (chunk r, now reduced over every rank) into
// `out`. Chunk c is thus summed from rank c+1 round to rank c, the same order in the all-reduce
// and in a reduce-scatter, so both give the same bits. `input` is only read (`out` may be its
// chunk r: each element is read before it is written).
void TcpRing::reduce_scatter_steps(const std::uint8_t* input, std::uint8_t* out,
                                   const Chunks& chunks, DType dtype, ReduceOp op,
                                   std::uint64_t seq, std::uint32_t& step,
                                   Clock::time_point& deadline, bool ends_op) {
  const std::size_t largest = chunks.bytes(chunks.w - 1);  // the last chunk holds the rest
  // The received piece, and two partials: one being sent while the next is made.
  scratch_.resize(std::max(scratch_.size(), (size_ > 2 ? 3 : 1) * largest));
  std::uint8_t* received = scratch_.data();
  // The same element-wise reductions as Gloo's ring and the shared-memory path (bfloat16 widened,
  // combined and rounded at every step, as gloo::allreduce does); average sums here.
  const auto combine = gloo_reduce_function(op, dtype);
  for (int s = 0; s < size_ - 1; ++s, ++step) {
    const std::size_t send_c = chunk(rank_ - s - 1);
    const std::size_t recv_c = chunk(rank_ - s - 2);
    const std::uint8_t* sending =
        s == 0 ? input + chunks.offset(send_c) : scratch_.data() + (1 + (s - 1) % 2) * largest;
    std::uint8_t* target = s == size_ - 2 ? out : scratch_.data() + (1 + s % 2) * largest;
    const std::uint8_t* own = input + chunks.offset(recv_c);
    Transfer t{
        .out_header = chunks.header(step, seq, chunks.bytes(send_c)),
        .out = sending,
        .in_header = chunks.header(step, seq, chunks.bytes(recv_c)),
        .in = received,
        .element_bytes = chunks.elem,
        // Combine what arrived while it is in cache; the socket keeps filling meanwhile.
        .arrived =
            [&](std::size_t from, std::size_t to) {
              combine(target + from, received + from, own + from, (to - from) / chunks.elem);
            },
        .ends_op = ends_op && s == size_ - 2,
    };
    exchange(t, deadline);
  }
}

// W-1 steps: in step s this rank sends chunk (r-s) of `data` and receives chunk (r-s-1) into
// place. Starts with this rank's own chunk r in place; ends with every chunk.
void TcpRing::allgather_steps(std::uint8_t* data, const Chunks& chunks, std::uint64_t seq,
                              std::uint32_t& step, Clock::time_point& deadline) {
  for (int s = 0; s < size_ - 1; ++s, ++step) {
    const std::size_t send_c = chunk(rank_ - s);
    const std::size_t recv_c = chunk(rank_ - s - 1);
    Transfer t{
        .out_header = chunks.header(step, seq, chunks.bytes(send_c)),
        .out = data + chunks.offset(send_c),
        .in_header = chunks.header(step, seq, chunks.bytes(recv_c)),
        .in = data + chunks.offset(recv_c),
        .element_bytes = chunks.elem,
        .arrived = nullptr,
        .ends_op = s == size_ - 2,
    };
    exchange(t, deadline);
  }
}

void TcpRing::barrier(std::uint64_t seq) {
  // An all-gather of nothing: step s's receive completes only once rank r-1 has begun step s,
  // so after W-1 steps every rank is known to have entered the barrier.
  const Chunks chunks{0, static_cast<std::size_t>(size_), 1,
                      kind_of(kBarrier, DType::kF32, kNoReduction)};
  std::uint8_t nothing = 0;
  auto deadline = Clock::now() + timeout_;
  checked_in_ = Clock::now();
  std::uint32_t step = 0;
  allgather_steps(&nothing, chunks, seq, step, deadline);
}

void TcpRing::allreduce(void* data, const void* input, std::size_t n, DType dtype, ReduceOp op,
                        std::uint64_t seq) {
  const Chunks chunks{n, static_cast<std::size_t>(size_), dtype_size(dtype),
                      kind_of(kAllreduce, dtype, static_cast<std::uint32_t>(op))};
  auto* bytes = static_cast<std::uint8_t*>(data);
  const auto* source = static_cast<const std::uint8_t*>(input != nullptr ? input : data);
  auto deadline = Clock::now() + timeout_;
  checked_in_ = Clock::now();
  std::uint32_t step = 0;
  // A reduce-scatter leaves chunk r, reduced, in its place; an all-gather passes them round.
  reduce_scatter_steps(source, bytes + chunks.offset(chunk(rank_)), chunks, dtype, op, seq, step,
                       deadline, /*ends_op=*/false);
  allgather_steps(bytes, chunks, seq, step, deadline);
}

void TcpRing::reduce_scatter(const void* input, void* output, std::size_t block, DType dtype,
                             ReduceOp op, std::uint64_t seq) {
  const Chunks chunks{block * static_cast<std::size_t>(size_), static_cast<std::size_t>(size_),
                      dtype_size(dtype),
                      kind_of(kReduceScatter, dtype, static_cast<std::uint32_t>(op))};
  std::uint32_t step = 0;
  auto deadline = Clock::now() + timeout_;
  checked_in_ = Clock::now();
  reduce_scatter_steps(static_cast<const std::uint8_t*>(input), static_cast<std::uint8_t*>(output),
                       chunks, dtype, op, seq, step, deadline, /*ends_op=*/true);
}

// A scatter from the root along the ring, then the all-gather (as MPI's large broadcasts): each
// link carries 2(W-1)/W of the buffer, where a chain carries all of it. Scatter, W-1 steps: with
// d this rank's distance from the root, the chunk meant for distance t leaves the root at step
// W-1-t and moves one rank a step, so all arrive at the last step; in step s this rank sends the
// chunk meant for distance W-1+d-s (the root from step 0, the others from step d, once they hold
// one that is not their own) and receives the one meant for W-2+d-s (from step d-1). A rank with
// nothing to pass on in a step sends a header alone: every rank still checks that its neighbour
// runs the same op, from the same root.
void TcpRing::broadcast(void* data, std::size_t n, DType dtype, int root, std::uint64_t seq) {
  const auto w = static_cast<std::size_t>(size_);
  Chunks chunks{n, w, dtype_size(dtype), kind_of(kBroadcast, dtype, kNoReduction)};
  chunks.root = static_cast<std::uint32_t>(root);
  auto* bytes = static_cast<std::uint8_t*>(data);
  const int d = (rank_ - root + size_) % size_;
  const auto meant_for = [&](int t) { return chunk(root + t); };  // the chunk of distance t
  auto deadline = Clock::now() + timeout_;
  checked_in_ = Clock::now();
  std::uint32_t step = 0;
  for (int s = 0; s < size_ - 1; ++s, ++step) {
    const bool sends = d == 0 || (s >= d && d < size_ - 1);
    const bool receives = d >= 1 && s >= d - 1;
    const std::size_t send_c = meant_for(size_ - 1 + d - s);
    const std::size_t recv_c = meant_for(size_ - 2 + d - s);
    Transfer t{
        .out_header = chunks.header(step, seq, sends ? chunks.bytes(send_c) : 0),
        .out = bytes + (sends ? chunks.offset(send_c) : 0),
        .in_header = chunks.header(step, seq, receives ? chunks.bytes(recv_c) : 0),
        .in = bytes + (receives ? chunks.offset(recv_c) : 0),
        .element_bytes = chunks.elem,
        .arrived = nullptr,
        .ends_op = false,
    };
    exchange(t, deadline);
  }
  allgather_steps(bytes, chunks, seq, step, deadline);
}

void TcpRing::allgather(const void* input, void* output, std::size_t block, DType dtype,
                        std::uint64_t seq) {
  const Chunks chunks{block * static_cast<std::size_t>(size_), static_cast<std::size_t>(size_),
                      dtype_size(dtype), kind_of(kAllgather, dtype, kNoReduction)};
  auto* out = static_cast<std::uint8_t*>(output);
  std::uint8_t* own = out + chunks.offset(chunk(rank_));
  if (own != input) std::memmove(own, input, chunks.bytes(chunk(rank_)));
  std::uint32_t step = 0;
  auto deadline = Clock::now() + timeout_;
  checked_in_ = Clock::now();
  allgather_steps(out, chunks, seq, step, deadline);
}

}  // namespace nanoddp::comm
