// The caching allocator: reuse, rounding, statistics, and the property the engine relies on:
// a training step in steady state allocates no new memory from the system.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "nanoddp/engine/allocator.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/optimizer_in_backward.h"

namespace nanoddp {
namespace {

// Counts what the caching allocator asks of the "system".
struct RawCounter {
  int allocations = 0;
  int frees = 0;
  std::vector<std::size_t> sizes;
  std::set<void*> live;
};

CachingAllocator make_allocator(RawCounter& counter) {
  return CachingAllocator(
      "test allocator",
      [&counter](std::size_t nbytes) {
        ++counter.allocations;
        counter.sizes.push_back(nbytes);
        void* p = std::malloc(nbytes);
        counter.live.insert(p);
        return p;
      },
      [&counter](void* p) {
        ++counter.frees;
        counter.live.erase(p);
        std::free(p);
      });
}

}  // namespace

TEST_CASE("CachingAllocator rounds requests up to its granularity") {
  constexpr std::size_t g = CachingAllocator::kGranularity;
  CHECK(CachingAllocator::rounded_size(0) == g);
  CHECK(CachingAllocator::rounded_size(1) == g);
  CHECK(CachingAllocator::rounded_size(g) == g);
  CHECK(CachingAllocator::rounded_size(g + 1) == 2 * g);
  CHECK(CachingAllocator::rounded_size(3 * g - 1) == 3 * g);

  RawCounter counter;
  {
    CachingAllocator alloc = make_allocator(counter);
    void* p = alloc.allocate(100);
    REQUIRE(counter.sizes.size() == 1);
    CHECK(counter.sizes[0] == g);  // the system sees the rounded size
    CHECK(alloc.stats().bytes_in_use == g);
    alloc.deallocate(p, 100);
    // 200 bytes round to the same block size: served from the cache.
    void* q = alloc.allocate(200);
    CHECK(q == p);
    CHECK(counter.allocations == 1);
    alloc.deallocate(q, 200);
  }
}

TEST_CASE("CachingAllocator reuses freed blocks of the same size and keeps stats") {
  RawCounter counter;
  CachingAllocator alloc = make_allocator(counter);

  void* a = alloc.allocate(1000);  // 1024
  void* b = alloc.allocate(4096);  // 4096
  CHECK(a != b);
  AllocatorStats s = alloc.stats();
  CHECK(s.requests == 2);
  CHECK(s.cache_hits == 0);
  CHECK(s.system_allocations == 2);
  CHECK(counter.allocations == 2);
  CHECK(s.bytes_in_use == 1024 + 4096);
  CHECK(s.bytes_reserved == 1024 + 4096);

  alloc.deallocate(a, 1000);
  s = alloc.stats();
  CHECK(s.bytes_in_use == 4096);
  CHECK(s.bytes_reserved == 1024 + 4096);  // cached, not returned
  CHECK(counter.frees == 0);

  // Same size again: the cached block, no new system allocation.
  void* a2 = alloc.allocate(1024);
  CHECK(a2 == a);
  s = alloc.stats();
  CHECK(s.requests == 3);
  CHECK(s.cache_hits == 1);
  CHECK(s.system_allocations == 2);
  CHECK(counter.allocations == 2);

  // A different size does not take the cached block of another size.
  alloc.deallocate(a2, 1024);
  void* c = alloc.allocate(2048);
  CHECK(c != a);
  CHECK(alloc.stats().system_allocations == 3);
  // Peak: a (1024) was freed before c (2048) was allocated, so b + c is the high mark.
  CHECK(alloc.stats().peak_bytes_in_use == 4096 + 2048);

  alloc.deallocate(b, 4096);
  alloc.deallocate(c, 2048);
  s = alloc.stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.bytes_reserved == 1024 + 4096 + 2048);
  CHECK(counter.frees == 0);

  alloc.empty_cache();
  s = alloc.stats();
  CHECK(s.bytes_reserved == 0);
  CHECK(counter.frees == 3);
  CHECK(counter.live.empty());

  // After empty_cache a request goes to the system again.
  void* d = alloc.allocate(1024);
  CHECK(alloc.stats().system_allocations == 4);
  CHECK(alloc.stats().cache_hits == 1);
  alloc.deallocate(d, 1024);
}

TEST_CASE("empty_cache keeps blocks that are still in use") {
  RawCounter counter;
  CachingAllocator alloc = make_allocator(counter);
  void* kept = alloc.allocate(512);
  void* freed = alloc.allocate(512);
  alloc.deallocate(freed, 512);
  alloc.empty_cache();
  CHECK(counter.frees == 1);
  CHECK(counter.live.count(kept) == 1);
  CHECK(alloc.stats().bytes_reserved == 512);
  CHECK(alloc.stats().bytes_in_use == 512);
  alloc.deallocate(kept, 512);
}

TEST_CASE("tensors return their storage to the device allocator's cache") {
  Allocator& alloc = allocator_for(Device::cpu());
  { const Tensor warm = Tensor::zeros({333, 7}); }
  const AllocatorStats before = alloc.stats();
  {
    const Tensor t = Tensor::zeros({333, 7});  // same size as the one just released
  }
  const AllocatorStats after = alloc.stats();
  CHECK(after.requests == before.requests + 1);
  CHECK(after.cache_hits == before.cache_hits + 1);
  CHECK(after.system_allocations == before.system_allocations);
  CHECK(after.bytes_in_use == before.bytes_in_use);
}

TEST_CASE("a training step in steady state allocates nothing new from the system") {
  nn::MlpOptions options;
  options.in_features = 16;
  options.out_features = 8;
  options.hidden = 64;
  options.layers = 2;
  options.seed = 5;
  nn::Mlp model(options);
  nn::FlatParameters flat(model, Device::cpu());
  nn::SGD sgd(flat, {.lr = 0.01f, .momentum = 0.9f});

  const Tensor x = Tensor::normal({32, 16}, 0.0f, 1.0f, {.seed = 1, .stream = 0});
  const Tensor y = Tensor::normal({32, 8}, 0.0f, 1.0f, {.seed = 1, .stream = 1});

  // Steps after backward, then (from step 6) steps taken inside backward: the NaN count and
  // the slice updates of nn::OptimizerInBackward must allocate nothing per step either.
  nn::OptimizerInBackward in_backward(sgd, flat, {});
  Allocator& alloc = allocator_for(Device::cpu());
  std::vector<AllocatorStats> stats;
  std::vector<float> losses;
  for (int step = 0; step < 12; ++step) {
    const bool fused = step >= 6;
    Tensor loss = mse_loss(model(x), y);
    losses.push_back(loss.item());
    if (fused) in_backward.arm();
    loss.backward();
    if (fused) {
      in_backward.finish();
      CHECK(in_backward.nonfinite_gradients() == 0);
    } else {
      sgd.step();
    }
    sgd.zero_grad();
    stats.push_back(alloc.stats());
  }
  CHECK(losses[11] < losses[6]);  // the steps inside backward train too
  for (int step = 8; step < 12; ++step) {
    CAPTURE(step);
    CHECK(stats[step].system_allocations == stats[7].system_allocations);
    CHECK(stats[step].bytes_reserved == stats[7].bytes_reserved);
  }
  // The steps did something (otherwise the property would be vacuous).
  CHECK(losses.back() < losses.front());
  CHECK(stats[5].requests > stats[1].requests);
  // From the second step on, every request is served from the cache.
  for (int step = 2; step < 6; ++step) {
    CAPTURE(step);
    CHECK(stats[step].system_allocations == stats[1].system_allocations);
    CHECK(stats[step].bytes_reserved == stats[1].bytes_reserved);
  }
  CHECK(stats[5].cache_hits - stats[1].cache_hits == stats[5].requests - stats[1].requests);
}

}  // namespace nanoddp

namespace nanoddp {
namespace {

// kB of transparent huge pages backing the mapping that contains `p` (from /proc/self/smaps).
long anon_huge_kb_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stol(line.substr(std::string("AnonHugePages:").size()));
    }
  }
  return -1;
}

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(in, mode);
  return mode;
}

}  // namespace

TEST_CASE("host buffers of 2 MiB or more are 2 MiB aligned and asked to be huge pages") {
  CHECK(host_huge_page_bytes(kHugePageBytes - 1) == 0);
  const char* env = std::getenv("NANODDP_HUGEPAGES");
  if (env != nullptr && std::string(env) == "0") {
    CHECK(host_huge_page_bytes(kHugePageBytes) == 0);
    return;
  }
  CHECK(host_huge_page_bytes(kHugePageBytes) == kHugePageBytes);
  // A 4 x 1024 x 1024 weight, and an odd size above 2 MiB.
  for (const std::int64_t rows : {std::int64_t{1024}, std::int64_t{777}}) {
    CAPTURE(rows);
    Tensor big = Tensor::empty({rows, 1024});
    CHECK(reinterpret_cast<std::uintptr_t>(big.raw_data()) % kHugePageBytes == 0);
    big.fill(1.0f);  // touch every page
    CHECK(big.to_vector()[static_cast<std::size_t>(rows * 1024 - 1)] == 1.0f);
    // Whether the kernel really backed it with huge pages depends on its THP mode and on free
    // contiguous memory: reported, not required.
    const long huge_kb = anon_huge_kb_at(big.raw_data());
    MESSAGE("THP mode '", thp_mode(), "': ", huge_kb, " kB of huge pages behind the buffer");
    if (thp_mode().find("[never]") == std::string::npos) WARN(huge_kb >= 2048);
  }
  // Small buffers keep the plain allocation (no rounding to 2 MiB).
  const Tensor small = Tensor::empty({1000});
  CHECK(reinterpret_cast<std::uintptr_t>(small.raw_data()) % 64 == 0);
}

}  // namespace nanoddp
