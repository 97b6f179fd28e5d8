// nanoddp-test-comm-worker: one rank of a multi-process collective test. The tests in
// tests/comm/test_gloo*.cpp start 2-4 copies with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
// set, exactly as a launcher would, and assert on the exit codes and the output.
//
// Every check compares against a closed-form value computed from the rank-dependent fill, so a
// wrong element is reported with its index, expected and actual value. Exit codes:
//   0  every check passed
//   1  a check failed (wrong value)
//   2  a collective or the rendezvous threw (CommError, StoreError, Error): the message is
//      printed, which the failure tests look for
//   17 --fault crash: this rank "crashed" on purpose (std::_Exit, no clean-up)
//
// The collectives run over whatever the group picked: shared memory when all ranks are on this
// host (always, here), TCP with NANODDP_SHM=0. The "ok" line names the backend ("gloo+shm" or
// "gloo") so the tests can tell which transport they covered.
//
// Usage: nanoddp-test-comm-worker [--big]
//        nanoddp-test-comm-worker --vs-flat   (the group's all-reduce against the flat ring:
//                                              vs_flat.cpp)
//        nanoddp-test-comm-worker --fault crash|stall --fault-rank R --fault-after K
//   crash: after K good allreduces rank R exits at once; the others' next op must fail.
//   stall: after K good allreduces rank R sleeps for 3 timeouts before its next op; the
//          others' next op must time out (and every process must still end).
//   kill-mid: after K good allreduces every rank starts a 64 MiB allreduce, and rank R kills
//          itself (SIGKILL) while it is in flight; the others' op must fail, naming rank R.
//   mismatch: after K good allreduces rank R runs an allgather where the others run a
//          reduce_scatter; every rank's op must fail.
//   starved-late / starved-stall: after K good allreduces every other rank can open no file
//          (RLIMIT_NOFILE 0: "too many open files"), and rank R comes to the next op 1 s late /
//          3 timeouts late. A liveness check that cannot read /proc must not call R dead: the
//          late op succeeds; the stalled one times out saying R's state could not be checked.

#include <fmt/format.h>

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "nanoddp/comm/init.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/comm/shm_allreduce.h"
#include "nanoddp/engine/tensor.h"
#include "vs_flat.h"

using nanoddp::DType;
using nanoddp::Tensor;
using nanoddp::comm::ReduceOp;

namespace {

int g_rank = 0;
int g_size = 1;
long g_checks = 0;

struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect_eq(float actual, float expected, const std::string& what, std::int64_t index) {
  ++g_checks;
  const bool ok = actual == expected ||
                  std::fabs(actual - expected) <= 1e-6f * std::max(1.0f, std::fabs(expected));
  if (!ok) {
    throw CheckFailed(fmt::format("rank {}: {}: element {} is {}, expected {}", g_rank, what, index,
                                  actual, expected));
  }
}

// The fill: element i of rank r holds (r + 1) * f(i), f(i) = i % 7 + 1 (small integers, so
// sums are exact in float32 and bf16 for these world sizes).
float f(std::int64_t i) {
  return static_cast<float>(i % 7 + 1);
}

Tensor filled(std::int64_t n) {
  Tensor t = Tensor::empty({n});
  float* p = t.data();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(g_rank + 1) * f(i);
  return t;
}

float expected_reduction(ReduceOp op, std::int64_t i) {
  const float n = static_cast<float>(g_size);
  switch (op) {
    case ReduceOp::kSum:
      return f(i) * n * (n + 1) / 2;
    case ReduceOp::kAvg:
      return f(i) * (n + 1) / 2;
    case ReduceOp::kMax:
      return f(i) * n;
    case ReduceOp::kMin:
      return f(i);
  }
  return 0;
}

std::uint16_t to_bf16(float v) {
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16);
}
float from_bf16(std::uint16_t v) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}

void check_allreduce(nanoddp::comm::ProcessGroup& pg, std::int64_t n, ReduceOp op) {
  Tensor t = filled(n);
  auto work = pg.allreduce(t, op);
  work->wait();
  const float* p = t.data();
  const std::string what = fmt::format("allreduce {} n={}", nanoddp::comm::reduce_op_name(op), n);
  // The 16M-element case checks a stride of elements (every check is a pass over memory).
  const std::int64_t step = n > 2000000 ? 997 : 1;
  for (std::int64_t i = 0; i < n; i += step) expect_eq(p[i], expected_reduction(op, i), what, i);
  if (n > 0) expect_eq(p[n - 1], expected_reduction(op, n - 1), what, n - 1);
}

void check_bf16_allreduce(nanoddp::comm::ProcessGroup& pg, std::int64_t n, ReduceOp op) {
  Tensor t = Tensor::empty({n}, nanoddp::Device::cpu(), DType::kBF16);
  auto* p = static_cast<std::uint16_t*>(t.raw_data());
  for (std::int64_t i = 0; i < n; ++i) p[i] = to_bf16(static_cast<float>(g_rank + 1) * f(i));
  pg.allreduce(t, op)->wait();
  for (std::int64_t i = 0; i < n; ++i) {
    expect_eq(from_bf16(p[i]), expected_reduction(op, i),
              fmt::format("bf16 allreduce {}", nanoddp::comm::reduce_op_name(op)), i);
  }
}

void check_broadcast(nanoddp::comm::ProcessGroup& pg, std::int64_t n, int root) {
  Tensor t = Tensor::full({n}, -1.0f);
  if (g_rank == root) {
    for (std::int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<float>(root * 1000 + i);
  }
  pg.broadcast(t, root)->wait();
  for (std::int64_t i = 0; i < n; ++i) {
    expect_eq(t.data()[i], static_cast<float>(root * 1000 + i),
              fmt::format("broadcast root {}", root), i);
  }
}

float get(const Tensor& t, std::int64_t i) {
  if (t.dtype() == DType::kF32) return t.data()[i];
  return from_bf16(static_cast<const std::uint16_t*>(t.raw_data())[i]);
}
void set(Tensor& t, std::int64_t i, float v) {
  if (t.dtype() == DType::kF32) {
    t.data()[i] = v;
  } else {
    static_cast<std::uint16_t*>(t.raw_data())[i] = to_bf16(v);
  }
}
Tensor make(std::int64_t n, DType dtype, float value) {
  Tensor t = Tensor::empty({n}, nanoddp::Device::cpu(), dtype);
  for (std::int64_t i = 0; i < n; ++i) set(t, i, value);
  return t;
}
// Large buffers check a stride of elements, and always the last one.
template <typename Check>
void each_checked(std::int64_t n, Check check) {
  const std::int64_t step = n > 2000000 ? 997 : 1;
  for (std::int64_t i = 0; i < n; i += step) check(i);
  if (n > 0) check(n - 1);
}

// What rank r gathers at element i: exact in float32 and bfloat16, and different per rank.
float gathered(int r, std::int64_t i, DType dtype) {
  return dtype == DType::kF32 ? static_cast<float>(r * 10000 + i % 9999)
                              : static_cast<float>(r + 1) * f(i);
}

// In place: the input is this rank's block of the output (nccl-tests' in-place all-gather).
void check_allgather(nanoddp::comm::ProcessGroup& pg, std::int64_t n, DType dtype = DType::kF32,
                     bool in_place = false) {
  Tensor out = make(n * g_size, dtype, -1.0f);
  Tensor in = in_place ? out.view(g_rank * n, {n}) : make(n, dtype, -1.0f);
  for (std::int64_t i = 0; i < n; ++i) set(in, i, gathered(g_rank, i, dtype));
  pg.allgather(in, out)->wait();
  const std::string what = fmt::format("allgather n={} {}{}", n, nanoddp::dtype_name(dtype),
                                       in_place ? " in place" : "");
  each_checked(n * g_size, [&](std::int64_t j) {
    expect_eq(get(out, j), gathered(static_cast<int>(j / n), j % n, dtype), what, j);
  });
}

// In place: the output is this rank's block of the input (nccl-tests' in-place reduce-scatter).
void check_reduce_scatter(nanoddp::comm::ProcessGroup& pg, std::int64_t m, ReduceOp op,
                          DType dtype = DType::kF32, bool in_place = false) {
  Tensor in = make(m * g_size, dtype, 0.0f);
  for (std::int64_t j = 0; j < m * g_size; ++j) set(in, j, static_cast<float>(g_rank + 1) * f(j));
  Tensor out = in_place ? in.view(g_rank * m, {m}) : make(m, dtype, -1.0f);
  pg.reduce_scatter(in, out, op)->wait();
  const std::string what =
      fmt::format("reduce_scatter {} m={} {}{}", nanoddp::comm::reduce_op_name(op), m,
                  nanoddp::dtype_name(dtype), in_place ? " in place" : "");
  each_checked(m, [&](std::int64_t k) {
    expect_eq(get(out, k), expected_reduction(op, g_rank * m + k), what, k);
  });
  if (in_place) return;
  // The input is left as it was.
  each_checked(m * g_size, [&](std::int64_t j) {
    expect_eq(get(in, j), static_cast<float>(g_rank + 1) * f(j), what + " input", j);
  });
}

// Every reduce-scatter and all-gather case: sizes 0 and 1, odd, around the shared-memory path's
// step boundaries (a reduce-scatter step is a lane split into size-1 slots, an all-gather step
// one lane), bf16, every reduction, in place.
void check_scatter_gather(nanoddp::comm::ProcessGroup& pg, bool big) {
  const char* kb = std::getenv("NANODDP_SHM_CHUNK_KB");
  const std::int64_t chunk_bytes =
      kb != nullptr ? std::atoll(kb) * 1024
                    : static_cast<std::int64_t>(nanoddp::comm::kShmDefaultChunkBytes);
  const std::int64_t lane = chunk_bytes / 4;
  const std::int64_t slot = g_size > 1 ? lane / (g_size - 1) / 32 * 32 : lane;
  for (std::int64_t n :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{1237}, lane - 1, lane + 1, 2 * lane + 17}) {
    check_allgather(pg, n);
  }
  check_allgather(pg, 1237, DType::kBF16);
  check_allgather(pg, lane + 3, DType::kF32, true);
  check_allgather(pg, 5, DType::kBF16, true);
  for (std::int64_t m : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, std::int64_t{1237},
                         slot - 1, slot + 1, 3 * slot + 7}) {
    check_reduce_scatter(pg, m, ReduceOp::kSum);
  }
  for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    check_reduce_scatter(pg, 1237, op);
    check_reduce_scatter(pg, slot + 1, op, DType::kBF16);
  }
  check_reduce_scatter(pg, 1237, ReduceOp::kSum, DType::kBF16);
  check_reduce_scatter(pg, 2 * slot + 9, ReduceOp::kSum, DType::kF32, true);
  check_reduce_scatter(pg, 7, ReduceOp::kAvg, DType::kBF16, true);
  if (big) {
    // 64 MiB of float32 in all.
    check_reduce_scatter(pg, (std::int64_t{16} << 20) / g_size, ReduceOp::kSum);
    check_allgather(pg, (std::int64_t{16} << 20) / g_size);
  }
}

void check_coalesced(nanoddp::comm::ProcessGroup& pg) {
  std::vector<std::int64_t> sizes = {1, 1237, 0, 10};
  std::vector<Tensor> tensors;
  for (auto n : sizes) tensors.push_back(filled(n));
  pg.allreduce_coalesced(tensors, ReduceOp::kSum)->wait();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    for (std::int64_t i = 0; i < sizes[t]; ++i) {
      expect_eq(tensors[t].data()[i], expected_reduction(ReduceOp::kSum, i),
                fmt::format("coalesced tensor {}", t), i);
    }
  }
}

// Buffers that cross the shared-memory path's chunk boundaries by one element either way
// (kShmDefaultChunkBytes, or $NANODDP_SHM_CHUNK_KB; the TCP path just sees odd sizes).
void check_chunk_boundaries(nanoddp::comm::ProcessGroup& pg) {
  const char* kb = std::getenv("NANODDP_SHM_CHUNK_KB");
  const std::int64_t chunk_bytes =
      kb != nullptr ? std::atoll(kb) * 1024
                    : static_cast<std::int64_t>(nanoddp::comm::kShmDefaultChunkBytes);
  const std::int64_t f32 = chunk_bytes / 4;
  for (std::int64_t n : {f32 - 1, f32, f32 + 1, 2 * f32 + 17, 3 * f32 - 1}) {
    check_allreduce(pg, n, ReduceOp::kSum);
  }
  check_allreduce(pg, f32 + 1, ReduceOp::kAvg);
  check_allreduce(pg, 2 * f32 + 5, ReduceOp::kMax);
  check_allreduce(pg, 2 * f32 + 5, ReduceOp::kMin);
  check_bf16_allreduce(pg, chunk_bytes / 2 + 1, ReduceOp::kSum);
  check_bf16_allreduce(pg, chunk_bytes / 2 + 1, ReduceOp::kAvg);
}

std::uint64_t fnv1a(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Values whose sum depends on the order of the additions, so a rank that combined them in
// another order would show up: every rank must end with the very same bits.
void check_bit_identical(nanoddp::comm::ProcessGroup& pg, std::int64_t n, ReduceOp op) {
  Tensor t = Tensor::empty({n});
  for (std::int64_t i = 0; i < n; ++i) {
    t.data()[i] = std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(g_rank)) *
                  std::pow(10.0f, static_cast<float>((i + g_rank) % 9) - 4.0f);
  }
  pg.allreduce(t, op)->wait();
  const std::uint64_t mine = fnv1a(t.data(), t.nbytes());
  // Hashes travel as two float32 each (bytes are bytes to allgather).
  Tensor hash = Tensor::empty({2});
  std::memcpy(hash.data(), &mine, sizeof(mine));
  Tensor all = Tensor::empty({2 * g_size});
  pg.allgather(hash, all)->wait();
  for (int r = 0; r < g_size; ++r) {
    ++g_checks;
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, all.data() + 2 * r, sizeof(theirs));
    if (theirs != mine) {
      throw CheckFailed(fmt::format("rank {}: allreduce {} n={} differs bitwise from rank {}'s",
                                    g_rank, nanoddp::comm::reduce_op_name(op), n, r));
    }
  }
}

// The segment's name is unlinked as soon as every rank has mapped it: /dev/shm keeps nothing,
// even if the job is killed later. Rank 0 created it, so its pid is in the name.
void check_no_segment_left() {
  if (g_rank != 0) return;
  const std::string prefix = fmt::format("nanoddp-{}-", getpid());
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::string found;
  while (const dirent* entry = readdir(dir)) {
    if (std::string(entry->d_name).rfind(prefix, 0) == 0) found = entry->d_name;
  }
  closedir(dir);
  ++g_checks;
  if (!found.empty()) throw CheckFailed("shared segment left in /dev/shm: " + found);
}

// Many ops in flight at once, waited for in reverse: FIFO on the worker still gives every rank
// the same order, and sequence numbers count up by one.
void check_pipelined(nanoddp::comm::ProcessGroup& pg) {
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<nanoddp::comm::Work>> works;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(filled(100 + k));
    works.push_back(pg.allreduce(tensors.back(), ReduceOp::kSum));
  }
  for (std::size_t k = 1; k < works.size(); ++k) {
    ++g_checks;
    if (works[k]->sequence_number() != works[0]->sequence_number() + k) {
      throw CheckFailed(fmt::format("sequence numbers {} then {}", works[0]->sequence_number(),
                                    works[k]->sequence_number()));
    }
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    ++g_checks;
    if (!works[k]->is_completed() || works[k]->error() != nullptr) {
      throw CheckFailed("a waited op is not completed or has an error");
    }
    for (std::int64_t i = 0; i < tensors[k].numel(); ++i) {
      expect_eq(tensors[k].data()[i], expected_reduction(ReduceOp::kSum, i), "pipelined", i);
    }
  }
}

int run(int argc, char** argv) {
  bool big = false;
  bool vs_flat = false;
  std::string fault;
  int fault_rank = -1;
  int fault_after = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--big") {
      big = true;
    } else if (arg == "--vs-flat") {
      vs_flat = true;
    } else if (arg == "--fault" && i + 1 < argc) {
      fault = argv[++i];
    } else if (arg == "--fault-rank" && i + 1 < argc) {
      fault_rank = std::atoi(argv[++i]);
    } else if (arg == "--fault-after" && i + 1 < argc) {
      fault_after = std::atoi(argv[++i]);
    } else {
      fmt::print(stderr, "unknown argument {}\n", arg);
      return 64;
    }
  }
  const auto world = nanoddp::comm::world_from_env();
  g_rank = world.rank;
  g_size = world.world_size;
  nanoddp::comm::DistributedOptions options;
  options.backend = "gloo";
  auto dist = nanoddp::comm::init_distributed(world, options);
  auto& pg = *dist.group;
  if (vs_flat) return run_vs_flat(dist);

  if (!fault.empty()) {
    for (int k = 0; k < fault_after; ++k) check_allreduce(pg, 1237, ReduceOp::kSum);
    if (fault == "mismatch") {
      // Rank R all-gathers while the others reduce-scatter the same bytes: every rank must fail,
      // the shared-memory path naming both collectives.
      if (g_rank == fault_rank) {
        check_allgather(pg, 1237);
      } else {
        check_reduce_scatter(pg, 1237, ReduceOp::kSum);
      }
      fmt::print("rank {}: the mismatched op succeeded?!\n", g_rank);
      return 1;
    }
    if (fault == "kill-mid") {
      Tensor buffer = filled(std::int64_t{16} << 20);  // 64 MiB: tens of milliseconds to reduce
      auto work = pg.allreduce(buffer, ReduceOp::kSum);
      if (g_rank == fault_rank) {
        // At once, while the op is in flight on the group's worker thread (queued or just
        // started: a 64 MiB op takes milliseconds). A sleep here made the test flaky: on a busy
        // machine the sleep overran, the op completed everywhere, and the survivors failed one
        // op later than the test expects.
        fmt::print("rank {}: killing myself mid-allreduce{}\n", g_rank,
                   work->is_completed() ? " (too late? it completed)" : "");
        std::fflush(stdout);
        raise(SIGKILL);
      }
      const auto issued = std::chrono::steady_clock::now();
      try {
        work->wait();                                  // must fail: the peer died in it
        pg.allreduce(buffer, ReduceOp::kSum)->wait();  // (if it finished first: this one fails)
      } catch (const std::exception&) {
        // How long the failure took to surface (the process then still waits, bounded, for the
        // dead rank to check out of the store, so its exit time says less).
        fmt::print(
            "rank {}: failed {:.3f} s after the op was issued\n", g_rank,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - issued).count());
        std::fflush(stdout);
        throw;
      }
      fmt::print("rank {}: the allreduce with a killed peer succeeded?!\n", g_rank);
      return 1;
    }
    if (fault == "starved-late" || fault == "starved-stall") {
      rlimit saved{};
      ::getrlimit(RLIMIT_NOFILE, &saved);
      if (g_rank == fault_rank) {
        fmt::print("rank {}: {} after {} ops\n", g_rank, fault, fault_after);
        std::fflush(stdout);
        std::this_thread::sleep_for(fault == "starved-late" ? std::chrono::milliseconds(1000)
                                                            : 3 * options.timeout);
      } else {
        rlimit none = saved;
        none.rlim_cur = 0;  // every open() now fails with EMFILE
        ::setrlimit(RLIMIT_NOFILE, &none);
      }
      std::exception_ptr error;
      try {
        check_allreduce(pg, 1237, ReduceOp::kSum);
      } catch (...) {
        error = std::current_exception();
      }
      ::setrlimit(RLIMIT_NOFILE, &saved);
      if (error) std::rethrow_exception(error);
      fmt::print("rank {}: the op with a late peer succeeded\n", g_rank);
      return 0;
    }
    if (g_rank == fault_rank) {
      fmt::print("rank {}: {} after {} ops\n", g_rank, fault, fault_after);
      std::fflush(stdout);
      if (fault == "crash") std::_Exit(17);
      std::this_thread::sleep_for(3 * options.timeout);
    }
    check_allreduce(pg, 1237, ReduceOp::kSum);  // must fail: the peer is gone or late
    fmt::print("rank {}: the op after the {} succeeded?!\n", g_rank, fault);
    return 1;
  }

  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    for (std::int64_t n : {0, 1, 1237}) check_allreduce(pg, n, op);
  }
  // Over 8 MiB: three of the hierarchical all-reduce's 4 MiB pieces (a leader alone on its host
  // once ran them as one op, which met the other leaders' first piece).
  check_allreduce(pg, (std::int64_t{1} << 21) + 12345, ReduceOp::kSum);
  if (big) check_allreduce(pg, std::int64_t{16} << 20, ReduceOp::kSum);  // 64 MiB of float32
  check_chunk_boundaries(pg);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    check_bit_identical(pg, 300007, op);
  }
  check_no_segment_left();
  check_broadcast(pg, 1237, g_size - 1);
  check_broadcast(pg, 5, 0);
  check_scatter_gather(pg, big);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    check_bf16_allreduce(pg, 1237, op);
  }
  check_coalesced(pg);
  check_pipelined(pg);
  auto last = pg.barrier();
  last->wait();
  fmt::print("rank {} of {}: ok, {} checks, {} ops, backend {}\n", g_rank, g_size, g_checks,
             last->sequence_number(), pg.backend_name());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const CheckFailed& e) {
    fmt::print(stderr, "CHECK FAILED: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {} error: {}\n", g_rank, e.what());
    return 2;
  }
}
