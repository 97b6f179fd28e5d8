// When a Gloo op fails: which rank to look at, and a message that says so. Gloo itself only
// says "a recv did not complete"; the shared-memory path knows exactly who is missing.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "nanoddp/comm/gloo_group_impl.h"
#include "nanoddp/comm/gloo_helpers.h"

namespace nanoddp::comm {

std::vector<int> GlooProcessGroup::Impl::ranks_without_report(std::uint64_t seq) const {
  std::vector<int> missing;
  if (diagnostics == nullptr) return missing;
  try {
    const auto key = [&](int r) { return fmt::format("timeout/{}/{}", seq, r); };
    diagnostics->set(key(rank), std::string("1"));
    const auto grace =
        std::min<std::chrono::milliseconds>(options.timeout / 2, std::chrono::seconds(3));
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
      missing.clear();
      for (int r = 0; r < size; ++r) {
        if (r != rank && !diagnostics->check({key(r)})) missing.push_back(r);
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    missing.clear();  // the store is gone too: say nothing rather than something wrong
  }
  return missing;
}

std::string GlooProcessGroup::Impl::explain(const std::string& description, std::uint64_t seq,
                                            const std::string& what) const {
  const std::string gloo_message = strip_gloo_location(what);
  std::string address;
  const int peer = gloo_peer_from_message(gloo_message, connection.addresses, &address);
  const bool timed_out = gloo_message.find("Timed out") != std::string::npos ||
                         gloo_message.find("timeout") != std::string::npos;
  return explain_failure(description, seq, peer, address, timed_out,
                         fmt::format("Gloo: \"{}\"", gloo_message));
}

std::string GlooProcessGroup::Impl::explain_ring(const std::string& description, std::uint64_t seq,
                                                 const TcpRingError& e) const {
  if (e.kind() == TcpRingError::Kind::kMismatch) {
    return fmt::format(
        "Gloo {} failed on rank {} of {} (TCP ring): {}. Hint: ops must be issued in the same "
        "order, with the same sizes, on every rank",
        description, rank, size, e.what());
  }
  return explain_failure(description, seq, e.peer(), e.address(),
                         e.kind() == TcpRingError::Kind::kTimedOut,
                         fmt::format("TCP ring: \"{}\"", e.what()));
}

std::string GlooProcessGroup::Impl::explain_failure(const std::string& description,
                                                    std::uint64_t seq, int peer,
                                                    const std::string& address, bool timed_out,
                                                    const std::string& quoted) const {
  std::string who = peer >= 0 ? fmt::format("rank {}", peer) : std::string("another rank");
  std::string cause;
  if (timed_out) {
    cause = fmt::format("timed out after {:.1f} s",
                        static_cast<double>(options.timeout.count()) / 1000.0);
    const std::vector<int> missing = ranks_without_report(seq);
    if (!missing.empty()) {
      who = fmt::format("rank{} {}", missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
      cause += fmt::format(
          "; {} did not report reaching this op (every rank that times out "
          "in it reports so through the store)",
          who);
    }
  } else if (peer < 0) {
    cause = "lost the connection to a peer";
  } else if (address.empty()) {
    cause = fmt::format("lost the connection to rank {}", peer);
  } else {
    cause = fmt::format("lost the connection to rank {} ({})", peer, address);
  }
  // A closed connection names the peer at its other end, which may itself have exited on a
  // failure that began elsewhere (a knock-on): say so rather than blame it outright.
  const std::string what_then =
      timed_out ? std::string("may have crashed or be stuck")
                : std::string(
                      "may have crashed, or exited on a failure of its own (then the "
                      "first rank to fail says more)");
  return fmt::format(
      "Gloo {} failed on rank {} of {}: {} ({}). Hint: {} {}; ops must be issued in "
      "the same order on every rank",
      description, rank, size, cause, quoted, who, what_then);
}

std::string GlooProcessGroup::Impl::explain_shm(const std::string& description,
                                                const ShmError& e) const {
  std::string who = "another rank";
  if (!e.suspects().empty()) {
    who =
        fmt::format("rank{} {}", e.suspects().size() > 1 ? "s" : "", fmt::join(e.suspects(), ", "));
  }
  return fmt::format(
      "Gloo {} failed on rank {} of {} (shared memory): {}. Hint: {} may have crashed or be "
      "stuck; ops must be issued in the same order on every rank",
      description, rank, size, e.what(), who);
}

}  // namespace nanoddp::comm
