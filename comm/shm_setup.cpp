// ShmAllreduce's set-up: every rank publishes its host and process, rank 0 creates the
// segment, the others map it, and all agree to use it or to fall back to TCP (the steps are in
// shm_allreduce.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/comm/shm_segment.h"
#include "nanoddp/engine/env.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

// ---- host identity and processes ------------------------------------------------------------

shm::ProcessProbe shm::probe_process(long pid) {
  const std::string path = fmt::format("/proc/{}/stat", pid);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ESRCH) return {.state = ProcessProbe::State::kGone};
    return {.why_unknown = fmt::format("{}: {}", path, std::strerror(errno))};
  }
  char buffer[1024];
  const ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) {
    if (read_errno == ESRCH) return {.state = ProcessProbe::State::kGone};  // exited meanwhile
    return {.why_unknown = fmt::format("{}: {}", path, std::strerror(read_errno))};
  }
  const std::string stat(buffer, static_cast<std::size_t>(n));
  const std::size_t paren = stat.rfind(')');  // the command name may contain spaces
  if (paren == std::string::npos) return {.why_unknown = path + ": unexpected contents"};
  std::istringstream fields(stat.substr(paren + 1));
  std::string state;
  fields >> state;  // field 3
  if (state == "Z" || state == "X") return {.state = ProcessProbe::State::kGone};
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;
  std::uint64_t start = 0;
  if (state.empty() || !(fields >> start)) return {.why_unknown = path + ": unexpected contents"};
  return {.state = ProcessProbe::State::kRunning, .start_time = start};
}

namespace {

using namespace shm;

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A process's start time, or nothing if it is gone or cannot be checked.
std::optional<std::uint64_t> process_start_time(long pid) {
  const ProcessProbe probe = probe_process(pid);
  if (probe.state != ProcessProbe::State::kRunning) return std::nullopt;
  return probe.start_time;
}

std::string random_segment_name() {
  std::random_device device;
  const std::uint64_t bits = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  return fmt::format("/nanoddp-{}-{:016x}", getpid(), bits);
}

std::string errno_text(const char* call) {
  return fmt::format("{}: {}", call, std::strerror(errno));
}

}  // namespace

// Why these three: boot_id is random per boot (two machines never share it, a container shares
// its host's), and processes in different network namespaces are how containers and
// tests/multinode simulate separate machines, so they are treated as such.
std::string shm_host_identity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char netns[128] = {};
  const ssize_t len = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  if (len < 0) netns[0] = '\0';
  return fmt::format("{} boot {} {}", host, read_first_line("/proc/sys/kernel/random/boot_id"),
                     netns);
}

// ---- set-up -------------------------------------------------------------------------------

ShmAllreduce::ShmAllreduce(Store& store, int rank, int size, std::chrono::milliseconds timeout,
                           const std::string& name)
    : rank_(rank), size_(size), timeout_(timeout) {
  if (size <= 1) {
    fallback_reason_ = "a world of one has nothing to reduce";
    return;
  }
  set_up(store, name + "/shm/");
  if (!enabled() && rank_ == 0) {
    fmt::print(stderr, "nanoddp: allreduce goes over TCP, not shared memory: {}\n",
               fallback_reason_);
    std::fflush(stderr);
  }
}

ShmAllreduce::~ShmAllreduce() = default;

void ShmAllreduce::set_up(Store& store, const std::string& prefix) {
  // 1. Everyone publishes: wants shared memory?, host identity, pid and its start time.
  // A switch this rank does not understand is published in its place ("!reason"), so that every
  // rank stops with it: the others would wait for this rank's hello until their timeout.
  bool wanted = true;
  std::size_t chunk = 0;
  try {
    wanted = env_switch("NANODDP_SHM", /*default_on=*/true);
    chunk = env_count("NANODDP_SHM_CHUNK_KB", kShmDefaultChunkBytes / 1024, 4, 64 << 10) * 1024;
  } catch (const Error& e) {
    store.set(prefix + "hello/" + std::to_string(rank_), std::string("!") + e.what());
    throw;
  }
  const long pid = static_cast<long>(getpid());
  store.set(prefix + "hello/" + std::to_string(rank_),
            fmt::format("{}\n{}\n{}\n{}", wanted ? 1 : 0, pid, process_start_time(pid).value_or(0),
                        shm_host_identity()));
  std::vector<std::string> identities(static_cast<std::size_t>(size_));
  peers_.assign(static_cast<std::size_t>(size_), Peer{});
  std::string no_reason;  // the first reason not to, the same on every rank
  for (int r = 0; r < size_; ++r) {
    const Bytes bytes = store.get(prefix + "hello/" + std::to_string(r));
    if (!bytes.empty() && bytes[0] == '!') {
      throw PeerFailedError(
          r, fmt::format("rank {} stopped setting up shared memory, so every rank stops: {}", r,
                         std::string(bytes.begin() + 1, bytes.end())));
    }
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    int peer_wants = 0;
    Peer& peer = peers_[static_cast<std::size_t>(r)];
    in >> peer_wants >> peer.pid >> peer.start_time;
    in.ignore(1);
    std::getline(in, identities[static_cast<std::size_t>(r)]);
    if (no_reason.empty() && peer_wants == 0) {
      no_reason = fmt::format("NANODDP_SHM=0 on rank {}", r);
    }
    if (no_reason.empty() && identities[static_cast<std::size_t>(r)] != identities[0]) {
      no_reason = fmt::format("ranks 0 and {} are on different hosts ({} / {})", r, identities[0],
                              identities[static_cast<std::size_t>(r)]);
    }
    // Can we tell whether this peer is alive? Only if /proc/<pid> shows the very process (same
    // pid namespace): then a dead peer is reported at once instead of after the timeout.
    peer.checkable = r != rank_ && peer.start_time != 0 &&
                     process_start_time(peer.pid) == std::optional<std::uint64_t>(peer.start_time);
  }
  if (!no_reason.empty()) {
    fallback_reason_ = no_reason;
    return;
  }

  // 2. Rank 0 creates the segment and publishes its name ("!reason" if it could not).
  auto segment = std::make_unique<Segment>();
  std::string name;
  std::string local_failure;
  // Rank 0 removes the name once everyone has reported — or on any way out of here, an
  // exception included — so the name never outlives the set-up.
  bool created = false;
  struct Unlink {
    const std::string& name;
    const bool& created;
    ~Unlink() {
      if (created) shm_unlink(name.c_str());
    }
  } unlink_guard{name, created};
  if (rank_ == 0) {
    const Layout layout(size_, chunk);
    name = random_segment_name();
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      local_failure = errno_text("shm_open");
    } else {
      created = true;
      // ftruncate only sets the size: on a /dev/shm too small for the segment (Docker's default
      // is 64 MiB) the first touch of a page past its space raised SIGBUS, and the rank died
      // without a word. posix_fallocate takes the pages now, or fails with ENOSPC: a fallback
      // to TCP with the reason, as for any segment that cannot be made.
      int reserved = 0;
      if (ftruncate(fd, static_cast<off_t>(layout.total)) != 0) {
        local_failure = errno_text("ftruncate");
      } else if ((reserved = posix_fallocate(fd, 0, static_cast<off_t>(layout.total))) != 0) {
        local_failure = fmt::format(
            "posix_fallocate of {} MiB in /dev/shm: {} (too little room there? a container's "
            "--shm-size, or a smaller NANODDP_SHM_CHUNK_KB)",
            layout.total >> 20, std::strerror(reserved));
      } else {
        void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) {
          local_failure = errno_text("mmap");
        } else {
          segment->base = static_cast<std::uint8_t*>(base);
          segment->bytes = layout.total;
          // Touch every page now: the first touch of fresh memory is slow (page faults, the
          // kernel zeroing pages), and it belongs in set-up, not in the first training step.
          std::memset(base, 0, layout.total);
          Header& h = segment->header();
          h.version = kVersion;
          h.size = static_cast<std::uint32_t>(size_);
          h.chunk_bytes = chunk;
          h.total_bytes = layout.total;
          atomic(h.magic).store(kMagic, std::memory_order_release);
        }
      }
      close(fd);  // the mapping stays valid without the descriptor
    }
    store.set(prefix + "segment", local_failure.empty() ? name : "!" + local_failure);
  } else {
    const Bytes bytes = store.get(prefix + "segment");
    name.assign(bytes.begin(), bytes.end());
    if (!name.empty() && name[0] == '!') {
      local_failure = "rank 0 could not create it";  // rank 0's report says why
    } else {
      const int fd = shm_open(name.c_str(), O_RDWR, 0);
      struct stat st {};
      if (fd < 0) {
        local_failure = errno_text("shm_open");
      } else if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kLine)) {
        local_failure = "the segment has no header";
      } else {
        const auto bytes_total = static_cast<std::size_t>(st.st_size);
        // MAP_POPULATE maps every page now (rank 0 already made them exist).
        void* base =
            mmap(nullptr, bytes_total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (base == MAP_FAILED) {
          local_failure = errno_text("mmap");
        } else {
          segment->base = static_cast<std::uint8_t*>(base);
          segment->bytes = bytes_total;
          const Header& h = segment->header();
          if (atomic(const_cast<Header&>(h).magic).load(std::memory_order_acquire) != kMagic ||
              h.version != kVersion || h.size != static_cast<std::uint32_t>(size_) ||
              h.total_bytes != bytes_total || Layout(size_, h.chunk_bytes).total != bytes_total) {
            local_failure = "the segment's header does not match this build or world size";
          }
        }
      }
      if (fd >= 0) close(fd);
    }
  }

  // 3. Everyone reports, everyone reads all reports; rank 0 then unlinks the name. From here
  // on the segment has no name: it goes away with the last process that maps it.
  store.set(prefix + "attached/" + std::to_string(rank_),
            local_failure.empty() ? std::string("ok") : local_failure);
  std::string failure;
  for (int r = 0; r < size_; ++r) {
    const Bytes bytes = store.get(prefix + "attached/" + std::to_string(r));
    const std::string report(bytes.begin(), bytes.end());
    if (failure.empty() && report != "ok") {
      failure = fmt::format("rank {} could not map the shared segment {} ({})", r, name, report);
    }
  }
  if (!failure.empty()) {
    fallback_reason_ = failure;
    return;  // the segment (if mapped) is unmapped here, and rank 0 unlinks
  }
  segment->size = size_;
  segment->chunk_bytes = segment->header().chunk_bytes;
  segment->layout = Layout(size_, segment->chunk_bytes);
  chunk_bytes_ = segment->chunk_bytes;
  segment_ = std::move(segment);
}

}  // namespace nanoddp::comm
