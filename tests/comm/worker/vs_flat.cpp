// The group's all-reduce vs the flat TCP ring, in one job: after init_distributed made the group
// (hierarchical on several hosts with some sharing one), every rank builds a second group with
// NANODDP_HIER=0 (the flat ring), and both reduce the same values. Checked:
//   - each result is within float rounding of the exact sum (in double): a sum of W terms in
//     any order is off by at most (W - 1) u sum|x| (u = 2^-24 for float32, 2^-8 for bfloat16),
//     plus one rounding of the result for avg; so the two results differ by at most twice that;
//   - every rank holds the same bits (FNV-1a hashes, allgathered);
//   - how many elements differ from the flat ring's in the last bits is printed (the sums are
//     added up in another order: within a host first, then across hosts).
// Every rank can compute every rank's values (they are a closed form of rank and index), so the
// exact sums need no communication.

#include "vs_flat.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nanoddp/comm/gloo_process_group.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/engine/tensor.h"
#include "support/worst_error.h"

using nanoddp::DType;
using nanoddp::Tensor;
using nanoddp::comm::ProcessGroup;
using nanoddp::comm::ReduceOp;

namespace {

// Magnitudes from 1e-4 to 1e4 and both signs: sums whose rounding depends on the order.
float value(int rank, std::int64_t i) {
  return std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(rank)) *
         std::pow(10.0f, static_cast<float>((i + rank) % 9) - 4.0f);
}

std::uint16_t to_bf16(float v) {  // round to nearest even (the values are finite)
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
  return static_cast<std::uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}
float from_bf16(std::uint16_t v) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}

// Every rank's inputs, computed once: each rank fills its tensor from its own row, and the exact
// result comes from all rows (value() computed twice might round differently where the compiler
// contracts a*b+c into one fused multiply-add in one place and not in the other).
struct Inputs {
  std::vector<std::vector<double>> rows;  // rows[r][i]: rank r's input i as the op sees it
  Tensor mine;
};

Inputs make_inputs(int rank, int world, std::int64_t n, DType dtype) {
  Inputs in;
  in.mine = Tensor::empty({n}, nanoddp::Device::cpu(), dtype);
  in.rows.assign(static_cast<std::size_t>(world), std::vector<double>(static_cast<std::size_t>(n)));
  for (int r = 0; r < world; ++r) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = value(r, i);
      const std::uint16_t h = to_bf16(v);
      in.rows[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] =
          dtype == DType::kF32 ? static_cast<double>(v) : static_cast<double>(from_bf16(h));
      if (r != rank) continue;
      if (dtype == DType::kF32) {
        in.mine.data()[i] = v;
      } else {
        static_cast<std::uint16_t*>(in.mine.raw_data())[i] = h;
      }
    }
  }
  return in;
}

double element(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::kF32 ? t.data()[i]
                                  : from_bf16(static_cast<const std::uint16_t*>(t.raw_data())[i]);
}

std::uint64_t fnv1a(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Whether every rank's `t` has the same bits.
bool same_bits_everywhere(ProcessGroup& pg, const Tensor& t) {
  const std::uint64_t mine = fnv1a(t.raw_data(), t.nbytes());
  Tensor hash = Tensor::empty({2});
  std::memcpy(hash.data(), &mine, sizeof mine);
  Tensor all = Tensor::empty({2 * pg.size()});
  pg.allgather(hash, all)->wait();
  for (int r = 0; r < pg.size(); ++r) {
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, all.data() + 2 * r, sizeof theirs);
    if (theirs != mine) return false;
  }
  return true;
}

// One comparison; returns the number of failed checks (0 = all passed).
int compare(ProcessGroup& group, ProcessGroup& flat, std::int64_t n, DType dtype, ReduceOp op) {
  const int rank = group.rank();
  const int world = group.size();
  const Inputs in = make_inputs(rank, world, n, dtype);
  Tensor a = in.mine.clone();
  Tensor b = in.mine.clone();
  group.allreduce(a, op)->wait();
  flat.allreduce(b, op)->wait();
  const double u = dtype == DType::kF32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  const bool average = op == ReduceOp::kAvg;
  int failures = 0;
  std::int64_t differing = 0;
  double worst = 0;  // the largest |a - b| as a fraction of the rounding bound
  for (std::int64_t i = 0; i < n; ++i) {
    const auto at = [&](int r) {
      return in.rows[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
    };
    double exact = at(0);
    double magnitude = std::fabs(at(0));
    for (int r = 1; r < world; ++r) {
      exact = op == ReduceOp::kMax ? std::max(exact, at(r)) : exact + at(r);
      magnitude += std::fabs(at(r));
    }
    if (average) {
      exact /= world;
      magnitude /= world;
    }
    // max is exact; a sum of W terms is within (W - 1) u sum|x|; avg adds one rounding.
    const double bound = op == ReduceOp::kMax
                             ? 0.0
                             : (world - 1) * u * magnitude + (average ? u * std::fabs(exact) : 0.0);
    const double x = element(a, i);
    const double y = element(b, i);
    if (x != y) ++differing;
    if (x != y) worst = nanoddp::test::worse(worst, std::fabs(x - y) / (2 * bound));
    // Written as "not within", so that a NaN fails.
    if (!(std::fabs(x - exact) <= bound) || !(std::fabs(y - exact) <= bound) ||
        !(std::fabs(x - y) <= 2 * bound)) {
      if (failures++ < 3) {
        fmt::print(stderr, "rank {}: {} {} n={} element {}: group {} flat {} exact {} (bound {})\n",
                   rank, nanoddp::dtype_name(dtype), nanoddp::comm::reduce_op_name(op), n, i, x, y,
                   exact, bound);
      }
    }
  }
  const bool same = same_bits_everywhere(group, a);
  if (!same) {
    ++failures;
    fmt::print(stderr, "rank {}: {} {} n={}: the group's result differs bitwise across ranks\n",
               rank, nanoddp::dtype_name(dtype), nanoddp::comm::reduce_op_name(op), n);
  }
  if (rank == 0) {
    fmt::print(
        "vs-flat {} {} n={}: {} element(s) differ from the flat ring in the last bits (largest "
        "difference {:.2f} of the rounding bound); same bits on every rank: {}\n",
        nanoddp::dtype_name(dtype), nanoddp::comm::reduce_op_name(op), n, differing, worst,
        same ? "yes" : "NO");
  }
  return failures;
}

}  // namespace

int run_vs_flat(nanoddp::comm::Distributed& dist) {
  ProcessGroup& group = *dist.group;
  // Every rank turns the hierarchical path off for the second group only.
  setenv("NANODDP_HIER", "0", 1);
  nanoddp::comm::ProcessGroupOptions options;
  options.name = "flat";
  options.master_addr = dist.world.master_addr;
  options.timeout = dist.store->timeout();
  auto flat =
      nanoddp::comm::make_gloo_process_group(dist.store, group.rank(), group.size(), options);
  if (group.rank() == 0) {
    fmt::print("vs-flat: group backend {}, flat backend {}\n", group.backend_name(),
               flat->backend_name());
    if (const auto* gloo = dynamic_cast<const nanoddp::comm::GlooProcessGroup*>(&group)) {
      fmt::print("vs-flat: group transport {}\n", gloo->allreduce_transport());
    }
  }
  int failures = 0;
  // Sizes across the shared-memory chunk (512 KiB) and the broadcast piece (1 MiB) boundaries.
  for (std::int64_t n : {1, 1237, 300007}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      failures += compare(group, *flat, n, DType::kF32, op);
    }
    failures += compare(group, *flat, n, DType::kBF16, ReduceOp::kSum);
  }
  failures += compare(group, *flat, 300007, DType::kF32, ReduceOp::kMax);
  // Several pipelined pieces (4 MiB each) and a short last one.
  failures += compare(group, *flat, 3000017, DType::kF32, ReduceOp::kAvg);
  failures += compare(group, *flat, 3000017, DType::kBF16, ReduceOp::kSum);
  group.barrier()->wait();
  fmt::print("rank {} of {}: vs-flat {}\n", group.rank(), group.size(),
             failures == 0 ? "ok" : fmt::format("FAILED ({} checks)", failures));
  return failures == 0 ? 0 : 1;
}
