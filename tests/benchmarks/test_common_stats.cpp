// apps/common's statistics and provenance, which every benchmark's figures rest on.

#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "common/provenance.h"
#include "common/stats.h"

using nanoddp::common::bootstrap_median_ci;

TEST_CASE(
    "common: the bootstrap interval of the median holds it, is reproducible, and widens "
    "with the spread") {
  CHECK(bootstrap_median_ci({}).lo == 0.0);
  CHECK(bootstrap_median_ci({}).hi == 0.0);
  CHECK(bootstrap_median_ci({4.0}).lo == 4.0);
  CHECK(bootstrap_median_ci({4.0}).hi == 4.0);
  const auto flat = bootstrap_median_ci({2.0, 2.0, 2.0, 2.0, 2.0});
  CHECK(flat.lo == 2.0);
  CHECK(flat.hi == 2.0);

  const std::vector<double> tight = {10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.01, 9.99};
  const std::vector<double> wide = {10.0, 14.0, 6.0, 12.0, 8.0, 13.0, 7.0, 11.0, 9.0};
  const auto a = bootstrap_median_ci(tight), b = bootstrap_median_ci(wide);
  CHECK(a.lo <= 10.0);
  CHECK(a.hi >= 10.0);
  CHECK(b.lo <= 10.0);
  CHECK(b.hi >= 10.0);
  CHECK(b.hi - b.lo > 5 * (a.hi - a.lo));
  // Within the data's range, and the same twice (a fixed seed).
  CHECK(b.lo >= 6.0);
  CHECK(b.hi <= 14.0);
  const auto again = bootstrap_median_ci(wide);
  CHECK(again.lo == b.lo);
  CHECK(again.hi == b.hi);
}

TEST_CASE(
    "common: provenance holds the command, the UTC time and only the NANODDP_/OMP_/NCCL_ "
    "variables") {
  ::setenv("NANODDP_PROVENANCE_PROBE", "42", 1);
  ::setenv("NCCL_PROVENANCE_PROBE", "ring", 1);
  ::setenv("OTHER_PROVENANCE_PROBE", "no", 1);
  const char* argv[] = {"prog", "--flag", "a b", "it's"};
  const auto p = nanoddp::common::provenance(4, argv);
  CHECK(p["command"] == "prog --flag 'a b' 'it'\\''s'");
  CHECK(p["environment"]["NANODDP_PROVENANCE_PROBE"] == "42");
  CHECK(p["environment"]["NCCL_PROVENANCE_PROBE"] == "ring");
  CHECK_FALSE(p["environment"].contains("OTHER_PROVENANCE_PROBE"));
  CHECK_FALSE(p["environment"].contains("PATH"));
  const std::string utc = p["utc"].get<std::string>();
  CHECK(utc.size() == 20);
  CHECK(utc.back() == 'Z');
  CHECK(p["load_average"].size() == 3);
  const std::string commit = p["commit"].get<std::string>();
  CHECK((commit == "unknown" || commit.size() == 40));
  const std::string dirty = p["dirty"].get<std::string>();
  CHECK((dirty == "yes" || dirty == "no" || dirty == "unknown"));
  const std::string line = nanoddp::common::provenance_line(p);
  CHECK(line.find("commit " + commit.substr(0, 10)) == 0);
  CHECK(line.find(utc) != std::string::npos);
  CHECK(line.find("load average") != std::string::npos);
}
