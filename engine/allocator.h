#pragma once
// Memory. Every tensor's storage comes from a per-device caching allocator: a freed block goes
// onto a free list keyed by its (rounded) size and is handed out again to the next request of
// that size, instead of being returned to the system.
//
// Why: a training step allocates the same buffers every step (activations, temporaries,
// gradients of intermediate tensors). Giving them back and asking again is slow everywhere
// (cudaMalloc synchronizes the device), and the first touch of fresh host memory takes a page
// fault per page (docs/benchmarks.md has a figure). With the cache, the second step allocates
// nothing new: `stats().system_allocations` stops growing after the first step (a test checks
// that).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "nanoddp/engine/device.h"

namespace nanoddp {

struct AllocatorStats {
  std::int64_t requests = 0;            // allocate() calls
  std::int64_t cache_hits = 0;          // served from the free lists
  std::int64_t system_allocations = 0;  // cache misses: new memory from the system / driver
  std::size_t bytes_in_use = 0;
  std::size_t peak_bytes_in_use = 0;
  std::size_t bytes_reserved = 0;  // in use + cached
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t nbytes) = 0;
  virtual void deallocate(void* ptr, std::size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  // Give every cached (unused) block back to the system.
  virtual void empty_cache() = 0;
};

// The caching allocator, over a raw allocate/free pair (aligned host memory, or cudaMalloc).
// Thread-safe: communication threads may release tensors too.
class CachingAllocator final : public Allocator {
 public:
  using RawAllocate = std::function<void*(std::size_t nbytes)>;
  using RawFree = std::function<void(void* ptr)>;

  CachingAllocator(std::string name, RawAllocate raw_allocate, RawFree raw_free);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t nbytes) override;
  void deallocate(void* ptr, std::size_t nbytes) override;
  AllocatorStats stats() const override;
  void empty_cache() override;

  // Requests are rounded up to this granularity so that near-identical sizes share blocks.
  static constexpr std::size_t kGranularity = 512;
  static std::size_t rounded_size(std::size_t nbytes);

 private:
  std::string name_;
  RawAllocate raw_allocate_;
  RawFree raw_free_;
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks_;
  AllocatorStats stats_;
};

// The allocator of a device (created on first use; CUDA ones fail clearly without a GPU).
Allocator& allocator_for(Device device);

// Host buffers of 2 MiB or more live on 2 MiB pages (Linux transparent huge pages).
//
// Why: a training step streams the weights, gradients and optimizer state (tens of MiB)
// through the TLB several times. On 4 KiB pages that is thousands of pages, more than the
// second-level TLB holds, so every pass pays page walks; on 2 MiB pages a 4 MiB weight takes
// two TLB entries. Linux backs a region with huge pages when it is 2 MiB aligned and
// madvise(MADV_HUGEPAGE) asks for it (the default THP mode, "madvise", serves only such
// regions). PyTorch's CPU allocator does the same under THP_MEM_ALLOC_ENABLE=1 (the measured
// gain: docs/benchmarks.md, one CPU training step). The cost: such a buffer is rounded up to whole
// 2 MiB pages. NANODDP_HUGEPAGES=0 turns it off.
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
// The page size host_allocate aligns an `nbytes` buffer to: kHugePageBytes, or 0 for small
// buffers (and with NANODDP_HUGEPAGES=0).
std::size_t host_huge_page_bytes(std::size_t nbytes);
// Reads NANODDP_HUGEPAGES now rather than at the first large allocation: a program calls it
// before its rank joins a job, so that a value it cannot read stops the rank there, where the
// other ranks are told, and not after they have waited for it at a collective.
void check_allocator_environment();

}  // namespace nanoddp
