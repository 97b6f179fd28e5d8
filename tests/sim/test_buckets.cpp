// The simulator cuts buckets as the real Reducer does: hand-worked cases, then the real
// comm::Reducer (over a real Gloo group of one process) on a few models and caps.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "benchmarks/sim/buckets.h"
#include "benchmarks/sim/error.h"
#include "benchmarks/sim/profile.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/comm/reducer.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"

using namespace nanoddp;
using sim::cut_buckets;
using sim::SimBucket;

TEST_CASE("buckets: a bucket closes once it holds at least its cap, never splitting a tensor") {
  // Caps: first 1/1024 MiB = 256 floats, then 2/1024 MiB = 512 floats.
  // Sizes 100, 200 -> 300 >= 256 closes bucket 0; 100, 300 -> 400 < 512, + 600 -> 1000 closes
  // bucket 1 (a tensor is never split, so a bucket may end far above its cap); 5 is the rest.
  const auto b = cut_buckets({100, 200, 100, 300, 600, 5}, 1.0 / 1024, 2.0 / 1024);
  REQUIRE(b.size() == 3);
  CHECK((b[0].first == 0 && b[0].count == 2 && b[0].numel == 300));
  CHECK((b[1].first == 2 && b[1].count == 3 && b[1].numel == 1000));
  CHECK((b[2].first == 5 && b[2].count == 1 && b[2].numel == 5));
  // A tensor larger than the cap gets a bucket of its own.
  const auto big = cut_buckets({10, 5000, 10, 10}, 1.0 / 1024, 1.0 / 1024);
  REQUIRE(big.size() == 2);
  CHECK(big[0].numel == 5010);
  CHECK(big[1].numel == 20);
  // The cap counts MiB of float32, floor'ed to whole elements, at least one.
  CHECK(sim::cap_elements(25.0) == 25 * 1024 * 1024 / 4);
  CHECK(sim::cap_elements(1e-9) == 1);
  CHECK_THROWS_WITH_AS(cut_buckets({1}, 0.0, 25.0), doctest::Contains("--first-bucket-mb"),
                       sim::SimError);
  CHECK_THROWS_WITH_AS(cut_buckets({1}, 1.0, -1.0), doctest::Contains("--bucket-cap-mb"),
                       sim::SimError);
}

TEST_CASE("buckets: the simulator's layout and buckets match the real Reducer's") {
  comm::Distributed dist =
      comm::init_distributed(comm::WorldInfo{}, {.backend = "gloo", .device = Device::cpu()});
  struct Case {
    sim::MlpShape shape;
    double first_mb;
    double cap_mb;
  };
  const std::vector<Case> cases = {
      {{.in = 64, .out = 64, .hidden = 64, .layers = 3}, 8.0 / 1024, 32.0 / 1024},
      {{.in = 32, .out = 8, .hidden = 1024, .layers = 3}, 1.0, 25.0},
      {{.in = 32, .out = 8, .hidden = 1024, .layers = 3}, 0.1, 0.5},
      {{.in = 32, .out = 8, .hidden = 1024, .layers = 3}, 4.0, 4.0},
      {{.in = 100, .out = 7, .hidden = 1, .layers = 0}, 0.001, 0.001},
      {{.in = 48, .out = 10, .hidden = 512, .layers = 5}, 0.5, 1.0},
      {{.in = 48, .out = 10, .hidden = 512, .layers = 5}, 0.001, 0.002},
  };
  for (const Case& c : cases) {
    CAPTURE(sim::describe(c.shape));
    CAPTURE(c.first_mb);
    CAPTURE(c.cap_mb);
    nn::Mlp model({.in_features = c.shape.in,
                   .out_features = c.shape.out,
                   .hidden = c.shape.hidden,
                   .layers = c.shape.layers});
    nn::FlatParameters params(model, Device::cpu());
    comm::Reducer reducer(params, dist.group,
                          {.bucket_cap_mb = c.cap_mb, .first_bucket_mb = c.first_mb});

    // Layout: the simulator's parameter list is FlatParameters' slots, name for name.
    const auto layout = sim::mlp_parameters(c.shape);
    const auto& slots = params.slots();
    REQUIRE(layout.size() == slots.size());
    std::vector<std::int64_t> numels;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      CHECK(layout[i].name == slots[i].name);
      CHECK(layout[i].numel == slots[i].numel);
      numels.push_back(layout[i].numel);
    }

    // Buckets: same count, same parameters, same sizes.
    const auto simulated = cut_buckets(numels, c.first_mb, c.cap_mb);
    const auto& real = reducer.buckets();
    REQUIRE(simulated.size() == real.size());
    for (std::size_t b = 0; b < real.size(); ++b) {
      CAPTURE(b);
      CHECK(simulated[b].first == real[b].slots.front());
      CHECK(simulated[b].count == real[b].slots.size());
      CHECK(simulated[b].numel == real[b].numel);
    }
  }
}
