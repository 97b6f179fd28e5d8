#include "nanoddp/engine/host_sync.h"

#include <atomic>

namespace nanoddp {

namespace {
std::atomic<std::int64_t> g_count{0};
std::atomic<const char*> g_last_reason{nullptr};
thread_local int t_depth = 0;
}  // namespace

HostSyncPoint::HostSyncPoint(const char* reason) : outer_(t_depth == 0) {
  ++t_depth;
  if (!outer_) return;
  g_count.fetch_add(1, std::memory_order_relaxed);
  g_last_reason.store(reason, std::memory_order_relaxed);
}

HostSyncPoint::~HostSyncPoint() {
  --t_depth;
}

std::int64_t host_sync_count() {
  return g_count.load(std::memory_order_relaxed);
}

std::string last_host_sync_reason() {
  const char* reason = g_last_reason.load(std::memory_order_relaxed);
  return reason != nullptr ? reason : "";
}

}  // namespace nanoddp
