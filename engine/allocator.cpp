#include "nanoddp/engine/allocator.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "nanoddp/config.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/engine/env.h"
#include "nanoddp/kernels/error.h"
#if NANODDP_WITH_CUDA
#include "nanoddp/engine/cuda/cuda_memory.h"
#include "nanoddp/engine/cuda/device_guard.h"
#endif

namespace nanoddp {

std::size_t CachingAllocator::rounded_size(std::size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  return (nbytes + kGranularity - 1) / kGranularity * kGranularity;
}

CachingAllocator::CachingAllocator(std::string name, RawAllocate raw_allocate, RawFree raw_free)
    : name_(std::move(name)),
      raw_allocate_(std::move(raw_allocate)),
      raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() {
  empty_cache();
}

void* CachingAllocator::allocate(std::size_t nbytes) {
  const std::size_t size = rounded_size(nbytes);
  std::lock_guard lock(mutex_);
  ++stats_.requests;
  void* ptr = nullptr;
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
  } else {
    ptr = raw_allocate_(size);
    if (ptr == nullptr) {
      fail("{}: out of memory allocating {} bytes ({} bytes reserved, {} in use)", name_, size,
           stats_.bytes_reserved, stats_.bytes_in_use);
    }
    ++stats_.system_allocations;
    stats_.bytes_reserved += size;
  }
  stats_.bytes_in_use += size;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, std::size_t nbytes) {
  if (ptr == nullptr) return;
  const std::size_t size = rounded_size(nbytes);
  std::lock_guard lock(mutex_);
  free_blocks_[size].push_back(ptr);
  stats_.bytes_in_use -= size;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* ptr : blocks) raw_free_(ptr);
    stats_.bytes_reserved -= size * blocks.size();
  }
  free_blocks_.clear();
}

namespace {

// 64-byte alignment: a cache line, and what AVX-512 loads like best. Large buffers: 2 MiB
// pages (see host_huge_page_bytes in allocator.h).
void* host_allocate(std::size_t nbytes) {
  if (host_huge_page_bytes(nbytes) == 0) return std::aligned_alloc(64, nbytes);
  const std::size_t rounded = (nbytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* ptr = std::aligned_alloc(kHugePageBytes, rounded);
  // Only a request: where the kernel has no transparent huge pages, madvise fails (EINVAL) or
  // THP is off, and the buffer works the same on 4 KiB pages.
  if (ptr != nullptr && ::madvise(ptr, rounded, MADV_HUGEPAGE) != 0) {
    debug_log(DebugLevel::kDetail, "madvise(MADV_HUGEPAGE) of {} bytes failed: {}", rounded,
              std::strerror(errno));
  }
  return ptr;
}
void host_free(void* ptr) {
  std::free(ptr);
}

}  // namespace

std::size_t host_huge_page_bytes(std::size_t nbytes) {
  static const bool enabled = env_switch("NANODDP_HUGEPAGES", /*default_on=*/true);
  return enabled && nbytes >= kHugePageBytes ? kHugePageBytes : 0;
}

void check_allocator_environment() {
  host_huge_page_bytes(0);  // its switch is a static, read on the first call
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CachingAllocator host("cpu allocator", host_allocate, host_free);
    return host;
  }
  require_device(device);
#if NANODDP_WITH_CUDA
  // One allocator per device index, created on first use and kept for the process lifetime
  // (deliberately leaked: freeing CUDA memory during static destruction races driver teardown).
  static std::mutex mutex;
  static std::vector<CachingAllocator*> per_device;
  std::lock_guard lock(mutex);
  if (per_device.size() <= static_cast<std::size_t>(device.index)) {
    per_device.resize(device.index + 1, nullptr);
  }
  auto& slot = per_device[device.index];
  if (slot == nullptr) {
    const int index = device.index;
    slot = new CachingAllocator(
        device.str() + " allocator",
        [index](std::size_t nbytes) {
          detail::CudaDeviceGuard guard(index);
          return cuda_raw_allocate(nbytes);
        },
        [index](void* ptr) {
          detail::CudaDeviceGuard guard(index);
          cuda_raw_free(ptr);
        });
  }
  return *slot;
#else
  fail("{}: this nanoddp was built without CUDA", device.str());
#endif
}

}  // namespace nanoddp
