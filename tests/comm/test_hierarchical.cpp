// The pure parts of the hierarchical all-reduce: grouping ranks by host and reading
// $NANODDP_HIER. The collective itself needs several hosts: tests/multinode/hierarchical.sh runs
// it on two network namespaces.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "nanoddp/comm/hierarchical_allreduce.h"
#include "nanoddp/comm/shm_allreduce.h"

using nanoddp::comm::group_by_host;
using nanoddp::comm::hierarchical_wanted_from_env;

TEST_CASE("hierarchical: ranks are grouped by host identity, hosts ordered by their lowest rank") {
  const auto layout = group_by_host({"b", "a", "b", "a", "c"});
  REQUIRE(layout.hosts.size() == 3);
  CHECK(layout.hosts[0] == std::vector<int>{0, 2});  // rank 0's host first: its leader is rank 0
  CHECK(layout.hosts[1] == std::vector<int>{1, 3});
  CHECK(layout.hosts[2] == std::vector<int>{4});
  CHECK(layout.host_of(3) == 1);
  CHECK(layout.host_of(4) == 2);
  CHECK(layout.host_of(7) == -1);
  CHECK(layout.describe() == "3 hosts: ranks 0,2 | 1,3 | 4");
  CHECK(group_by_host({"x", "x", "y", "y"}).describe() == "2 hosts: ranks 0-1 | 2-3");
  CHECK(group_by_host({"x"}).describe() == "1 host: ranks 0");
}

TEST_CASE("hierarchical: this process's host identity names the network namespace") {
  // Two network namespaces share the host name and the boot id; the identity must differ.
  const std::string identity = nanoddp::comm::shm_host_identity();
  CHECK(identity.find("boot ") != std::string::npos);
  CHECK(identity.find("net:[") != std::string::npos);
}

TEST_CASE("hierarchical: NANODDP_HIER is 0, 1 or unset, anything else is refused, named") {
  CHECK(hierarchical_wanted_from_env(nullptr));
  CHECK(hierarchical_wanted_from_env(""));
  CHECK(hierarchical_wanted_from_env("1"));
  CHECK_FALSE(hierarchical_wanted_from_env("0"));
  for (const char* bad : {"yes", "off", "2", " 0"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(hierarchical_wanted_from_env(bad), doctest::Contains("NANODDP_HIER='"),
                         nanoddp::Error);
  }
}
