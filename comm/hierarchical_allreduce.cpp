#include "nanoddp/comm/hierarchical_allreduce.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <gloo/allreduce.h>

#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/gloo_helpers.h"
#include "nanoddp/comm/reduce_ops.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/comm/tcp_ring.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/error.h"

// ================================================================================================
// One hierarchical all-reduce on rank r (host h, local rank l of L; the leader is l = 0):
//
//   1. local    ShmAllreduce over the host's L ranks (sum for sum and avg; max; min):
//               every rank of the host now holds the host's partial result
//   2. across   the leader only: the all-reduce among the H leaders around nanoddp's TCP ring
//               (Gloo's with $NANODDP_TCP_RING=0), op number = the op's sequence number; avg
//               divides once here, by the world size
//   3. status   a 1-element shared-memory all-reduce (max): 0 = the leader succeeded, 1 = it
//               failed and left its message in the store; nothing else would tell the
//               host-mates, who otherwise wait in step 4 for a leader that never comes
//   4. back     the leader's buffer to its host-mates, as a shared-memory *sum* in which they
//               contribute -0.0: x + (-0.0) == x for every float x (+0 and -0 included; NaN
//               stays NaN), so the sum is an exact copy, bit for bit, of the leader's result
//
// Pipelining. A buffer of several pieces (kPipelinePieceBytes) runs step 1 piece by piece on the
// group's worker thread while the leader's step 2 follows one piece behind on a thread of its
// own (AcrossThread); steps 3 and 4 then go piece by piece as the ring finishes each. Every rank
// runs the same shared-memory ops in the same order (step 1 for all pieces, then status and
// back for each), so the pipelining changes no result, only what overlaps. A leader alone on its
// host runs step 2 in the same pieces, one after another: the leaders' ring ops must match.
//
// Step 4 reuses the all-reduce rather than adding a broadcast to the shared-memory path: the
// host-mates read their -0.0 from one small buffer (kBackPieceBytes, reused piece by piece, so it
// stays in cache), and the cost is close to a broadcast's (each rank copies (L-1)/L of the buffer
// in and out either way).
//
// Why the timeouts differ. A host-mate waits in step 3 while its leader is in step 2, which may
// take up to the group's timeout before it fails; the shared-memory steps therefore wait up to
// twice the timeout, so the host-mate hears the leader's reason instead of timing out first.
// ================================================================================================

namespace nanoddp::comm {
namespace {

// Host-mates' -0.0 buffer for step 4, in pieces of this many bytes.
constexpr std::size_t kBackPieceBytes = std::size_t{1} << 20;
// Buffers are pipelined in pieces of this many bytes: the leaders' ring carries one piece while
// the host reduces the next (or sends the previous back). Large enough that the ring's per-op
// latency stays small beside a piece's transfer.
constexpr std::size_t kPipelinePieceBytes = std::size_t{4} << 20;

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

// ---- the layout ---------------------------------------------------------------------------------

HostLayout group_by_host(const std::vector<std::string>& identities) {
  HostLayout layout;
  std::map<std::string, std::size_t> index;
  for (std::size_t r = 0; r < identities.size(); ++r) {
    auto [it, fresh] = index.try_emplace(identities[r], layout.hosts.size());
    if (fresh) layout.hosts.emplace_back();
    layout.hosts[it->second].push_back(static_cast<int>(r));
  }
  return layout;
}

int HostLayout::host_of(int rank) const {
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    if (std::find(hosts[h].begin(), hosts[h].end(), rank) != hosts[h].end()) {
      return static_cast<int>(h);
    }
  }
  return -1;
}

std::string HostLayout::describe() const {
  std::vector<std::string> parts;
  for (const auto& ranks : hosts) {
    const bool contiguous = ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size());
    parts.push_back(ranks.size() == 1 ? std::to_string(ranks[0])
                    : contiguous      ? fmt::format("{}-{}", ranks.front(), ranks.back())
                                      : fmt::format("{}", fmt::join(ranks, ",")));
  }
  return fmt::format("{} host{}: ranks {}", hosts.size(), hosts.size() == 1 ? "" : "s",
                     fmt::join(parts, " | "));
}

bool hierarchical_wanted_from_env(const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  fail(
      "NANODDP_HIER='{}' is not understood: set 0 to force the flat ring across hosts, or 1 (the "
      "default) to let the group choose the hierarchical all-reduce",
      value);
}

// ---- the state ----------------------------------------------------------------------------------

struct HierarchicalAllreduce::Impl {
  int rank = 0;
  int size = 1;
  ProcessGroupOptions options;
  std::shared_ptr<Store> store;  // "<name>/hier/": failure messages of the leaders
  HostLayout layout;
  int host = 0;
  int local_rank = 0;
  std::vector<int> host_ranks;          // this host's ranks
  std::vector<int> leaders;             // every host's leader, by host
  std::unique_ptr<ShmAllreduce> local;  // null when this host has one rank
  GlooConnection across;                // leaders only
  // The leaders' all-reduce: nanoddp's TCP ring over them, as the flat group's (tcp_ring.h),
  // unless a leader opted out ($NANODDP_TCP_RING=0); then Gloo's over `across`.
  std::unique_ptr<TcpRing> across_ring;
  int ring_peer = -1;          // the host at the other end of the ring's failed socket
  std::string ring_address;    // and its address
  bool ring_mismatch = false;  // the failure was another op or size there, not a lost peer
  std::string fallback_reason;
  bool enabled = false;

  std::vector<std::uint8_t> negative_zeros;  // step 4's host-mate input, one piece of each dtype
  DType negative_zeros_dtype = DType::kF32;

  bool leader() const { return local_rank == 0; }
  int host_size() const { return static_cast<int>(host_ranks.size()); }

  std::string host_text() const {
    return fmt::format("host {} (ranks {}; rank {} is local rank 0)", host, rank_list(host_ranks),
                       host_ranks[0]);
  }

  void set_up(const std::shared_ptr<Store>& base);
  void run_local(void* data, const void* input, std::size_t count, DType dtype, ReduceOp op,
                 std::uint64_t seq, const char* step);
  void run_across(void* data, std::size_t count, DType dtype, ReduceOp op, std::uint64_t seq);
  std::string explain_across(const std::string& what) const;
  const void* negative_zero_piece(DType dtype);
};

void HierarchicalAllreduce::Impl::set_up(const std::shared_ptr<Store>& base) {
  // 1. Everyone publishes its settings and host; everyone reads everyone's.
  // NANODDP_TCP_RING travels here too, only to be checked: every group of two or more ranks
  // passes this point, so a value no rank understands stops every rank, naming it, even where
  // no TCP ring would be made (one host, shared memory).
  const char* hier_env = std::getenv("NANODDP_HIER");
  const char* shm_env = std::getenv("NANODDP_SHM");
  const char* ring_env = std::getenv("NANODDP_TCP_RING");
  store->set(fmt::format("hello/{}", rank),
             fmt::format("{}\n{}\n{}\n{}", hier_env != nullptr ? hier_env : "",
                         shm_env != nullptr && std::string(shm_env) == "0" ? 0 : 1,
                         ring_env != nullptr ? ring_env : "", shm_host_identity()));
  std::vector<std::string> identities(static_cast<std::size_t>(size));
  std::string hier_off;
  std::string shm_off;
  std::string ring_off;  // any rank's 0 puts the leaders on Gloo's ring, as it does a flat group
  for (int r = 0; r < size; ++r) {
    const std::string hello = store->get_string(fmt::format("hello/{}", r));
    const std::size_t a = hello.find('\n');
    const std::size_t b = hello.find('\n', a + 1);
    const std::size_t c = hello.find('\n', b + 1);
    const std::string hier_value = hello.substr(0, a);
    const std::string ring_value = hello.substr(b + 1, c - b - 1);
    if (!ring_value.empty() && ring_value != "0" && ring_value != "1") {
      fail(
          "NANODDP_TCP_RING='{}' is not understood: set it to 0 (off) or 1 (on), or unset it (set "
          "on rank {})",
          ring_value, r);
    }
    if (ring_value == "0" && ring_off.empty())
      ring_off = fmt::format("NANODDP_TCP_RING=0 on rank {}", r);
    bool wanted = true;
    try {
      wanted = hierarchical_wanted_from_env(hier_value.c_str());
    } catch (const Error& e) {
      // Every rank reads the same value and fails alike, naming the rank that set it.
      fail("{} (set on rank {})", e.what(), r);
    }
    if (!wanted && hier_off.empty()) hier_off = fmt::format("NANODDP_HIER=0 on rank {}", r);
    if (hello.substr(a + 1, b - a - 1) == "0" && shm_off.empty()) {
      shm_off = fmt::format("NANODDP_SHM=0 on rank {}", r);
    }
    identities[static_cast<std::size_t>(r)] = hello.substr(c + 1);
  }
  layout = group_by_host(identities);
  const int hosts = static_cast<int>(layout.hosts.size());
  // One host: the group's own shared-memory path covers it. One rank per host: nothing to
  // reduce locally, the flat ring is the leaders' ring.
  if (hosts == 1 || hosts == size) return;
  if (!hier_off.empty() || !shm_off.empty()) {
    fallback_reason = !hier_off.empty() ? hier_off : shm_off;
    return;
  }
  host = layout.host_of(rank);
  host_ranks = layout.hosts[static_cast<std::size_t>(host)];
  local_rank =
      static_cast<int>(std::find(host_ranks.begin(), host_ranks.end(), rank) - host_ranks.begin());
  for (const auto& ranks : layout.hosts) leaders.push_back(ranks[0]);

  // 2. Each host's shared segment (a collective among the host's ranks only), then everyone
  // learns whether every host got one.
  std::string local_failure;
  if (host_size() > 1) {
    local = std::make_unique<ShmAllreduce>(*base, local_rank, host_size(), 2 * options.timeout,
                                           fmt::format("{}/hier/host{}", options.name, host));
    if (!local->enabled()) local_failure = local->fallback_reason();
  }
  store->set(fmt::format("local/{}", rank), local_failure.empty() ? "ok" : local_failure);
  for (int r = 0; r < size && fallback_reason.empty(); ++r) {
    const std::string report = store->get_string(fmt::format("local/{}", r));
    if (report != "ok") {
      fallback_reason =
          fmt::format("rank {} cannot share memory with the ranks of its host ({})", r, report);
    }
  }
  if (!fallback_reason.empty()) {
    local.reset();
    return;
  }

  // 3. The leaders connect among themselves; everyone waits for every leader's report, so a
  // leader that cannot connect ends its host-mates too, with its reason.
  if (leader()) {
    std::string report = "ok";
    ProcessGroupOptions across_options = options;
    across_options.name = options.name + "/hier/leaders";
    try {
      across = connect_gloo(base, host, hosts, across_options);
      if (ring_off.empty()) {
        across_ring = std::make_unique<TcpRing>(*base, host, hosts, options.timeout,
                                                across_options.name, own_ip(across, host), leaders);
      } else if (rank == 0) {
        fmt::print(stderr,
                   "nanoddp: the leaders' all-reduce goes around Gloo's TCP ring, not nanoddp's: "
                   "{}\n",
                   ring_off);
        std::fflush(stderr);
      }
    } catch (const std::exception& e) {
      report = e.what();
    }
    store->set(fmt::format("across/{}", host), report);
  }
  for (int h = 0; h < hosts; ++h) {
    const std::string report = store->get_string(fmt::format("across/{}", h));
    if (report != "ok") {
      throw CommError(fmt::format(
          "hierarchical all-reduce: rank {}, the leader of host {}, could not connect to the "
          "other hosts' leaders: {}",
          leaders[static_cast<std::size_t>(h)], h, report));
    }
  }
  enabled = true;
}

const void* HierarchicalAllreduce::Impl::negative_zero_piece(DType dtype) {
  if (negative_zeros.empty() || negative_zeros_dtype != dtype) {
    negative_zeros.resize(kBackPieceBytes);
    if (dtype == DType::kF32) {
      const float value = -0.0f;
      for (std::size_t i = 0; i < kBackPieceBytes; i += sizeof value) {
        std::memcpy(negative_zeros.data() + i, &value, sizeof value);
      }
    } else {
      const std::uint16_t value = 0x8000;  // bfloat16 -0.0
      for (std::size_t i = 0; i < kBackPieceBytes; i += sizeof value) {
        std::memcpy(negative_zeros.data() + i, &value, sizeof value);
      }
    }
    negative_zeros_dtype = dtype;
  }
  return negative_zeros.data();
}

void HierarchicalAllreduce::Impl::run_local(void* data, const void* input, std::size_t count,
                                            DType dtype, ReduceOp op, std::uint64_t seq,
                                            const char* step) {
  try {
    local->run(data, input, count, dtype, op, seq);
  } catch (const ShmError& e) {
    // The shared-memory path numbers the ranks of this host 0..L-1: say which ranks they are.
    std::vector<int> suspects;
    for (int s : e.suspects()) suspects.push_back(host_ranks[static_cast<std::size_t>(s)]);
    std::vector<int> local_numbers(host_ranks.size());
    for (std::size_t i = 0; i < local_numbers.size(); ++i) local_numbers[i] = static_cast<int>(i);
    throw HierarchicalError(fmt::format(
        "the {} step through shared memory on host {} failed (it numbers the host's ranks {} as "
        "{}): {}; {}: {}",
        step, host, rank_list(host_ranks), rank_list(local_numbers), e.what(),
        suspects.size() == 1 ? "the rank to look at" : "the ranks to look at",
        suspects.empty() ? std::string("unknown") : rank_list(suspects)));
  }
}

std::string HierarchicalAllreduce::Impl::explain_across(const std::string& what) const {
  const std::string message = strip_gloo_location(what);
  std::string address;
  int peer = gloo_peer_from_message(message, across.addresses, &address);
  const bool on_ring = across_ring != nullptr && across_ring->enabled();
  if (on_ring && ring_mismatch) {
    // Nobody crashed: the leaders issued different ops or sizes (their hosts' ranks did).
    return fmt::format(
        "the step across hosts (the TCP ring among the leaders) failed on rank {}: {}. Hint: ops "
        "must be issued in the same order, with the same sizes, on every rank",
        rank, message);
  }
  if (peer < 0 && on_ring && ring_peer >= 0) {
    peer = ring_peer;
    address = ring_address;
  }
  const bool timed_out = message.find("Timed out") != std::string::npos ||
                         message.find("timeout") != std::string::npos;
  // With two hosts the peer is known even when Gloo's message names no address (a timeout).
  if (peer < 0 && layout.hosts.size() == 2) peer = 1 - host;
  const std::string what_happened =
      timed_out ? fmt::format("timed out after {:.1f} s waiting for", seconds(options.timeout))
                : std::string("lost the connection to");
  std::string cause;
  if (peer >= 0) {
    const auto& ranks = layout.hosts[static_cast<std::size_t>(peer)];
    cause = fmt::format(
        "{} rank {}, the leader of host {}{} (it or a rank of its host, {}, may have crashed or "
        "be stuck)",
        what_happened, ranks[0], peer, address.empty() ? "" : " at " + address, rank_list(ranks));
  } else {
    std::vector<int> others;
    for (int r : leaders) {
      if (r != rank) others.push_back(r);
    }
    cause = fmt::format(
        "{} another host's leader (ranks {}; one of them or a rank of their hosts may have crashed "
        "or be stuck)",
        what_happened, rank_list(others));
  }
  return fmt::format(
      "the step across hosts ({} ring among the leaders) failed on rank {}: {} ({}: \"{}\")",
      on_ring ? "the TCP" : "Gloo's", rank, cause, on_ring ? "TCP ring" : "Gloo", message);
}

void HierarchicalAllreduce::Impl::run_across(void* data, std::size_t count, DType dtype,
                                             ReduceOp op, std::uint64_t seq) {
  if (across_ring != nullptr && across_ring->enabled()) {
    try {
      across_ring->allreduce(data, nullptr, count, dtype, op, seq);
    } catch (const TcpRingError& e) {
      // explain_across reads these after the ring's thread handed the failure over.
      ring_peer = e.peer();
      ring_address = e.address();
      ring_mismatch = e.kind() == TcpRingError::Kind::kMismatch;
      throw;
    }
    return;
  }
  auto opts = std::make_unique<gloo::AllreduceOptions>(across.context);
  if (dtype == DType::kF32) {
    opts->setOutput(static_cast<float*>(data), count);
  } else {
    opts->setOutput(static_cast<std::uint16_t*>(data), count);
  }
  opts->setReduceFunction(gloo_reduce_function(op, dtype));
  opts->setTag(static_cast<std::uint32_t>(seq));
  opts->setTimeout(options.timeout);
  try {
    gloo::allreduce(*opts);
  } catch (...) {
    keep_failed_gloo_op(std::shared_ptr<gloo::AllreduceOptions>(std::move(opts)));
    throw;
  }
}

// ---- the class
// ------------------------------------------------------------------------------------

HierarchicalAllreduce::HierarchicalAllreduce(std::shared_ptr<Store> store, int rank, int size,
                                             const ProcessGroupOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->size = size;
  impl_->options = options;
  if (size <= 1) return;
  impl_->store = std::make_shared<PrefixStore>(options.name + "/hier", store);
  impl_->set_up(store);
  if (!impl_->fallback_reason.empty() && rank == 0) {
    fmt::print(stderr,
               "nanoddp: allreduce uses the flat TCP ring across hosts ({}), not the "
               "hierarchical one: {}\n",
               impl_->layout.describe(), impl_->fallback_reason);
    std::fflush(stderr);
  }
}

HierarchicalAllreduce::~HierarchicalAllreduce() = default;

bool HierarchicalAllreduce::enabled() const {
  return impl_->enabled;
}

const std::string& HierarchicalAllreduce::fallback_reason() const {
  return impl_->fallback_reason;
}

std::string HierarchicalAllreduce::describe() const {
  if (!enabled()) return "off";
  std::size_t chunk = 0;
  if (impl_->local != nullptr) chunk = impl_->local->chunk_bytes();
  const bool own = impl_->across_ring != nullptr && impl_->across_ring->enabled();
  return fmt::format(
      "{}; shared memory within a host{}, {} TCP ring across the leaders (ranks {}{})",
      impl_->layout.describe(), chunk > 0 ? fmt::format(" ({} KiB chunks)", chunk / 1024) : "",
      own ? "nanoddp's" : "Gloo's", rank_list(impl_->leaders),
      impl_->leader() ? "; " + impl_->across.device_description : std::string());
}

namespace {

// The leader's step 2 on its own thread, one piece behind step 1: while the host's ranks reduce
// piece k + 1 in shared memory, the leaders' ring carries piece k, and step 4 of piece k runs
// while the ring carries piece k + 1. The worker thread (step 1, then 3 and 4) and this one hand
// pieces over through two counters.
class AcrossThread {
 public:
  AcrossThread(std::size_t pieces, std::function<void(std::size_t)> across)
      : pieces_(pieces), run_across_(std::move(across)), thread_([this] { loop(); }) {}
  // On every way out, an exception included: the thread stops after the piece it is in (one
  // ring all-reduce, bounded by the timeout) and is joined.
  ~AcrossThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  AcrossThread(const AcrossThread&) = delete;
  AcrossThread& operator=(const AcrossThread&) = delete;

  void within_done(std::size_t piece) {
    {
      std::lock_guard lock(mutex_);
      within_ = piece + 1;
    }
    cv_.notify_all();
  }
  // Waits until piece `piece` has been across; returns the failure, if the ring failed (in this
  // piece or an earlier one).
  std::optional<std::string> wait_across(std::size_t piece) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return across_ > piece || failure_.has_value(); });
    return failure_;
  }

 private:
  void loop() {
    for (std::size_t k = 0; k < pieces_; ++k) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return within_ > k || stop_; });
        if (stop_) return;
      }
      std::optional<std::string> failure;
      try {
        run_across_(k);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      {
        std::lock_guard lock(mutex_);
        if (failure) failure_ = std::move(failure);
        across_ = k + 1;
      }
      cv_.notify_all();
      if (failure) return;
    }
  }

  const std::size_t pieces_;
  std::function<void(std::size_t)> run_across_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t within_ = 0;  // pieces reduced within the host
  std::size_t across_ = 0;  // pieces reduced across hosts
  bool stop_ = false;
  std::optional<std::string> failure_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace

void HierarchicalAllreduce::run(void* data, const void* input, std::size_t count, DType dtype,
                                ReduceOp op, std::uint64_t seq) {
  if (!enabled()) fail("HierarchicalAllreduce::run: not enabled");
  if (count == 0) return;
  Impl& s = *impl_;
  const ReduceOp wire_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const std::size_t elem = dtype_size(dtype);
  auto* out = static_cast<std::uint8_t*>(data);
  const auto* in = static_cast<const std::uint8_t*>(input);
  // $NANODDP_DEBUG=DETAIL: how long the steps took (where a slow all-reduce spends its time).
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  // Step 2 for one piece (the leader): the leaders' ring; avg divides here, once.
  auto across = [&](std::size_t first, std::size_t n) {
    s.run_across(out + first * elem, n, dtype, wire_op, seq);
    if (op == ReduceOp::kAvg) divide_by(out + first * elem, dtype, n, s.size);
  };

  const std::size_t piece = kPipelinePieceBytes / elem;
  const std::size_t pieces = (count + piece - 1) / piece;
  const auto first_of = [&](std::size_t k) { return k * piece; };
  const auto size_of = [&](std::size_t k) { return std::min(piece, count - k * piece); };

  // A leader alone on its host: only the ring, in the same pieces as the other leaders' (one
  // op of the whole buffer met their first piece's op: 2 + 1 ranks failed on every bucket over
  // 4 MiB, an outside reader's).
  if (s.local == nullptr) {
    if (in != nullptr) std::memcpy(out, in, count * elem);
    try {
      for (std::size_t k = 0; k < pieces; ++k) across(first_of(k), size_of(k));
    } catch (const std::exception& e) {
      throw HierarchicalError(s.explain_across(e.what()));
    }
    return;
  }

  // 1. Within the host, piece by piece; the leader's ring (2) follows one piece behind.
  // (One piece has nothing to overlap: the leader runs it inline, without a thread.)
  std::optional<AcrossThread> ring;
  if (s.leader() && pieces > 1) {
    ring.emplace(pieces, [&](std::size_t k) { across(first_of(k), size_of(k)); });
  }
  for (std::size_t k = 0; k < pieces; ++k) {
    s.run_local(out + first_of(k) * elem, in != nullptr ? in + first_of(k) * elem : nullptr,
                size_of(k), dtype, wire_op, seq, "within-host reduce");
    if (ring) ring->within_done(k);
  }
  const double within_ms = since(started);

  const std::string failure_key = fmt::format("failed/{}/{}", seq, s.host);
  for (std::size_t k = 0; k < pieces; ++k) {
    // 3. Did the leader's ring succeed for this piece? Its host-mates learn it here, and why
    // not from the store (a host-mate waits here while its leader's ring runs).
    std::optional<std::string> failure;
    if (ring) {
      failure = ring->wait_across(k);
    } else if (s.leader()) {
      try {
        across(first_of(k), size_of(k));
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    if (failure) {
      failure = s.explain_across(*failure);
      try {
        s.store->set(failure_key, *failure);
      } catch (const std::exception&) {
        // The store is gone too; the host-mates then say where to look instead.
      }
    }
    float status = failure ? 1.0f : 0.0f;
    s.run_local(&status, nullptr, 1, DType::kF32, ReduceOp::kMax, seq, "status");
    if (failure) throw HierarchicalError(*failure);
    if (status != 0.0f) {
      std::string why = fmt::format(
          "its message could not be read from the store (see rank {}'s output)", s.host_ranks[0]);
      try {
        if (s.store->check({failure_key})) why = s.store->get_string(failure_key);
      } catch (const std::exception&) {
        why += "; the store is unreachable too (rank 0 serves it)";
      }
      throw HierarchicalError(fmt::format(
          "rank {}, the leader of {}, failed in the step across hosts, so the result never came "
          "back: {}",
          s.host_ranks[0], s.host_text(), why));
    }
    // 4. Back to the host-mates: an exact copy of the leader's result (see the top of the
    // file), in sub-pieces that keep the host-mates' -0.0 buffer small.
    const std::size_t sub = kBackPieceBytes / elem;
    for (std::size_t first = first_of(k); first < first_of(k) + size_of(k); first += sub) {
      const std::size_t n = std::min(sub, first_of(k) + size_of(k) - first);
      s.run_local(out + first * elem, s.leader() ? nullptr : s.negative_zero_piece(dtype), n, dtype,
                  ReduceOp::kSum, seq, "broadcast");
    }
  }
  debug_log(DebugLevel::kDetail,
            "hierarchical allreduce #{}: {} piece(s); within-host reduce done after {:.3f} ms, "
            "all done after {:.3f} ms",
            seq, pieces, within_ms, since(started));
}

}  // namespace nanoddp::comm
