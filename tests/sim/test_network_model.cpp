// The alpha-beta all-reduce model against its closed forms, worked out by hand, and the fit of a
// fabric to measured all-reduce times.

#include <doctest/doctest.h>

#include <fstream>

#include "benchmarks/sim/allreduce_fit.h"
#include "benchmarks/sim/error.h"
#include "benchmarks/sim/network_model.h"
#include "support/subprocess.h"

using namespace nanoddp::sim;

namespace {

// alpha = 5 us inside a node, 20 us across; B_intra = 100 GB/s, one NIC = 10 GB/s per GPU.
Fabric test_fabric(double launch_us = 0) {
  return Fabric{.name = "test",
                .intra_bw_gbs = 100.0,
                .intra_lat_us = 5.0,
                .inter_bw_gbs = 10.0,
                .inter_lat_us = 20.0,
                .launch_us = launch_us};
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

TEST_CASE("network: ring on one node is 2(n-1) alpha + 2(n-1)/n S beta") {
  const Fabric f = test_fabric();
  // n = 8, S = 1 MiB: 2*7*5 us = 70 us; 2*7/8 * 1048576 B / 100e9 B/s = 18.350080 us.
  CHECK(ring_allreduce_ms({.nodes = 1, .gpus_per_node = 8}, f, kMiB) ==
        doctest::Approx(0.070 + 0.01835008).epsilon(1e-12));
  // n = 2, S = 100 MB: 2 * 5 us + 1 * 1e8 / 1e11 s = 10 us + 1 ms.
  CHECK(ring_allreduce_ms({.nodes = 1, .gpus_per_node = 2}, f, 1e8) ==
        doctest::Approx(0.010 + 1.0).epsilon(1e-12));
  // The launch cost is added once per collective.
  CHECK(ring_allreduce_ms({.nodes = 1, .gpus_per_node = 2}, test_fabric(8.0), 1e8) ==
        doctest::Approx(0.008 + 0.010 + 1.0).epsilon(1e-12));
}

TEST_CASE("network: one rank costs nothing, whatever the algorithm and size") {
  const Cluster one{.nodes = 1, .gpus_per_node = 1};
  for (double bytes : {0.0, 4.0, 1e9}) {
    CHECK(ring_allreduce_ms(one, test_fabric(8.0), bytes) == 0.0);
    CHECK(tree_allreduce_ms(one, test_fabric(8.0), bytes) == 0.0);
    CHECK(allreduce_time(one, test_fabric(8.0), Algorithm::kAuto, bytes).ms == 0.0);
  }
  CHECK(bus_bandwidth_gbs(1e6, 0.0, 1) == 0.0);
}

TEST_CASE("network: the slowest link bounds the ring across nodes") {
  const Fabric f = test_fabric();
  // 2 nodes x 4 GPUs: n = 8, 2(n-1) = 14 steps, of which 2N = 4 cross nodes (NCCL's count):
  // 10 * 5 us + 4 * 20 us = 130 us. Bandwidth: min(100, 4 NICs * 10) = 40 GB/s:
  // 2*7/8 * 4e8 B / 40e9 B/s = 17.5 ms.
  CHECK(ring_allreduce_ms({.nodes = 2, .gpus_per_node = 4}, f, 4e8) ==
        doctest::Approx(0.130 + 17.5).epsilon(1e-12));
  // docs/simulator.md's formula, term by term: 2(n-1-N) intra hops (it once said 2(n-N)).
  const int n = 8, nodes = 2;
  CHECK(ring_allreduce_ms({.nodes = nodes, .gpus_per_node = 4}, f, 0.0) ==
        doctest::Approx((2 * (n - 1 - nodes) * 5.0 + 2 * nodes * 20.0) / 1000.0).epsilon(1e-12));
  // With fast NICs the NVLink side is the bound: min(100, 4 * 40) = 100 GB/s -> 7 ms.
  Fabric fast = f;
  fast.inter_bw_gbs = 40.0;
  CHECK(ring_allreduce_ms({.nodes = 2, .gpus_per_node = 4}, fast, 4e8) ==
        doctest::Approx(0.130 + 7.0).epsilon(1e-12));
  // One GPU per node: every step crosses nodes: 2*3 * 20 us + 2*3/4 * 4e8 / 10e9 s.
  CHECK(ring_allreduce_ms({.nodes = 4, .gpus_per_node = 1}, f, 4e8) ==
        doctest::Approx(0.120 + 60.0).epsilon(1e-12));
}

TEST_CASE("network: tree is a chain in the node and a double binary tree across nodes") {
  const Fabric f = test_fabric();
  // One node of 8: chain depth 7, up and down: 2*7*5 us = 70 us; 2S/B = 2e8 / 1e11 s = 2 ms.
  CHECK(tree_allreduce_ms({.nodes = 1, .gpus_per_node = 8}, f, 1e8) ==
        doctest::Approx(0.070 + 2.0).epsilon(1e-12));
  // 8 nodes x 4: latency 2*(3*5 + log2(8)*20) us = 150 us; bandwidth max(2S/100 GB/s = 2 ms,
  // 2S/(4*10 GB/s) = 5 ms) = 5 ms.
  CHECK(tree_allreduce_ms({.nodes = 8, .gpus_per_node = 4}, f, 1e8) ==
        doctest::Approx(0.150 + 5.0).epsilon(1e-12));
  // 5 nodes: depth ceil(log2 5) = 3.
  CHECK(tree_allreduce_ms({.nodes = 5, .gpus_per_node = 4}, f, 1e8) ==
        doctest::Approx(0.150 + 5.0).epsilon(1e-12));
  // Two nodes: each node sends S, not 2S, across: max(2 ms, 1e8/40e9 s = 2.5 ms); latency
  // 2*(3*5 + 1*20) us = 70 us. The ring needs 2*7/8 * 1e8 / 40e9 s = 4.375 ms here: on two
  // nodes with slow NICs the tree wins, as NCCL's does.
  const Cluster two{.nodes = 2, .gpus_per_node = 4};
  CHECK(tree_allreduce_ms(two, f, 1e8) == doctest::Approx(0.070 + 2.5).epsilon(1e-12));
  const CollectiveTime best = allreduce_time(two, f, Algorithm::kAuto, 1e8);
  CHECK(best.algorithm == Algorithm::kTree);
  CHECK(best.ms == doctest::Approx(0.070 + 2.5).epsilon(1e-12));
}

TEST_CASE("network: auto takes the faster algorithm per size") {
  const Fabric f = test_fabric();
  const Cluster big{.nodes = 64, .gpus_per_node = 8};
  // Small message on 512 ranks: the ring's 2(n-1) latency terms lose to the tree's log depth.
  const CollectiveTime small = allreduce_time(big, f, Algorithm::kAuto, 4096);
  CHECK(small.algorithm == Algorithm::kTree);
  CHECK(small.ms == doctest::Approx(tree_allreduce_ms(big, f, 4096)));
  CHECK(small.ms < ring_allreduce_ms(big, f, 4096));
  // One node, large message: the ring moves 2(n-1)/n S instead of 2S.
  const Cluster node{.nodes = 1, .gpus_per_node = 8};
  const CollectiveTime large = allreduce_time(node, f, Algorithm::kAuto, 1e9);
  CHECK(large.algorithm == Algorithm::kRing);
  CHECK(large.ms == doctest::Approx(ring_allreduce_ms(node, f, 1e9)));
}

TEST_CASE("network: busbw of the one-level ring tends to the link bandwidth") {
  const Fabric f = test_fabric();
  const Cluster node{.nodes = 1, .gpus_per_node = 8};
  const double bytes = 1e12;  // the 70 us of latency are 4e-6 of the 17.5 s
  const double ms = ring_allreduce_ms(node, f, bytes);
  CHECK(bus_bandwidth_gbs(bytes, ms, 8) == doctest::Approx(100.0).epsilon(1e-5));
  CHECK(bus_bandwidth_gbs(bytes, ms, 8) < 100.0);
}

TEST_CASE("network: named fabrics and bad values are checked with the flag's name") {
  CHECK(find_fabric("nvlink4-ib400").intra_bw_gbs > 0);
  CHECK_THROWS_WITH_AS(find_fabric("infiniband"), doctest::Contains("known: nvlink4-ib400"),
                       SimError);
  Fabric bad = test_fabric();
  bad.intra_bw_gbs = 0;
  CHECK_THROWS_WITH_AS(check_fabric(bad, {.nodes = 1, .gpus_per_node = 8}),
                       doctest::Contains("--intra-bw-gbs"), SimError);
  bad = test_fabric();
  bad.inter_lat_us = -1;
  CHECK_THROWS_WITH_AS(check_fabric(bad, {.nodes = 2, .gpus_per_node = 8}),
                       doctest::Contains("--inter-lat-us"), SimError);
  CHECK_THROWS_WITH_AS(parse_algorithm("nvls"), doctest::Contains("ring, tree, auto or hier"),
                       SimError);
}

TEST_CASE("network fit: a measured line becomes a ring with the same times") {
  // Times of a ring with alpha = 12 us and B = 2 GB/s on 4 ranks: a = 2*3*12 us = 72 us,
  // b = 2*3/4 / 2e9 s/B = 0.75 ns/B.
  std::vector<AllreduceSample> samples;
  for (double bytes = 1024; bytes <= 64.0 * 1024 * 1024; bytes *= 4) {
    samples.push_back({bytes, 0.072 + 0.75e-6 * bytes});
  }
  const Cluster four{.nodes = 1, .gpus_per_node = 4};
  const AllreduceFit fit = fit_allreduce(samples, four, 0, 1e18, "synthetic");
  CHECK(fit.samples == static_cast<int>(samples.size()));
  CHECK(fit.fabric.intra_lat_us == doctest::Approx(12.0).epsilon(1e-6));
  CHECK(fit.fabric.intra_bw_gbs == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(fit.max_rel_error < 1e-9);
  // Whatever the split into nodes, the ring model gives the measured line back.
  for (const Cluster c : {Cluster{1, 4}, Cluster{2, 2}, Cluster{4, 1}}) {
    const AllreduceFit f = fit_allreduce(samples, c, 0, 1e18, "synthetic");
    CHECK(ring_allreduce_ms(c, f.fabric, 8e6) == doctest::Approx(0.072 + 6.0).epsilon(1e-9));
  }
  // The size window is honoured; too few sizes in it is an error.
  CHECK_THROWS_WITH_AS(fit_allreduce(samples, four, 2e9, 4e9, "synthetic"),
                       doctest::Contains("need two or more sizes"), SimError);
}

TEST_CASE("network fit: reads nanoddp-bench-allreduce rows and rejects other files") {
  nanoddp::testing::TempDir dir;
  const std::string good = dir.file("ar.jsonl");
  {
    std::ofstream out(good);
    out << R"({"benchmark":"allreduce","ranks":2,"bytes":1024,"time_us":30.0})"
        << "\n"
        << R"({"benchmark":"allreduce","ranks":2,"bytes":1048576,"time_us":530.0})"
        << "\n";
  }
  const auto samples = read_bench_allreduce(good, 2);
  REQUIRE(samples.size() == 2);
  CHECK(samples[1].bytes == 1048576.0);
  CHECK(samples[1].ms == doctest::Approx(0.53));
  CHECK_THROWS_WITH_AS(read_bench_allreduce(good, 4), doctest::Contains("measured with 2 ranks"),
                       SimError);
  // The benchmark's out-of-place lines (a copy more than DDP's in-place buckets) are skipped.
  const std::string both = dir.file("both.jsonl");
  {
    std::ofstream out(both);
    out << R"({"benchmark":"allreduce","placement":"out-of-place","ranks":2,"bytes":1024,)"
        << R"("time_us":999.0})"
        << "\n"
        << R"({"benchmark":"allreduce","placement":"in-place","ranks":2,"bytes":1024,)"
        << R"("time_us":30.0})"
        << "\n";
  }
  const auto in_place = read_bench_allreduce(both, 2);
  REQUIRE(in_place.size() == 1);
  CHECK(in_place[0].ms == doctest::Approx(0.03));
  const std::string bad = dir.file("bad.jsonl");
  {
    std::ofstream out(bad);
    out << R"({"ranks":2,"bytes":1024})"
        << "\n";
  }
  CHECK_THROWS_WITH_AS(read_bench_allreduce(bad, 2), doctest::Contains("line 1"), SimError);
  CHECK_THROWS_WITH_AS(read_bench_allreduce(dir.file("missing.jsonl"), 2),
                       doctest::Contains("cannot open"), SimError);
}
