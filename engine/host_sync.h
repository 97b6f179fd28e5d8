#pragma once
// Every place where the host waits for a device goes through one counter, so that the cost
// that matters most on a GPU (the GPU idles while the host works out what to enqueue next) can
// be counted, and a test can assert how many a training step has.
//
// Counted, on every device alike so that a CPU run counts what a GPU run would do: reading a
// tensor's values (Tensor::to_vector, item), an upload from a host vector (Tensor::from_vector),
// and a copy across devices. On CUDA also every stream or event synchronization and every
// blocking copy_bytes. A point inside another (to_vector's copy) counts once: the outer one.

#include <cstdint>
#include <string>

namespace nanoddp {

// Marks a scope in which the host waits for a device. Counted when constructed, unless this
// thread is already inside one. `reason` must outlive the process (a string literal).
class HostSyncPoint {
 public:
  explicit HostSyncPoint(const char* reason);
  ~HostSyncPoint();
  HostSyncPoint(const HostSyncPoint&) = delete;
  HostSyncPoint& operator=(const HostSyncPoint&) = delete;

 private:
  bool outer_;
};

// Host synchronizations counted in this process so far (all threads).
std::int64_t host_sync_count();
// The reason of the last one counted ("Tensor::to_vector", ...), or "" before the first.
std::string last_host_sync_reason();

}  // namespace nanoddp
