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

TEST_CASE("common: below min_values_for_median_ci the bootstrap interval is only the range") {
  // An outside tester's finding: with --repeats 5, bench-ddp's step_ms_ci95_launches was exactly
  // [min, max] of the launch medians (the median of 5 draws is the smallest value 5.8 % of the
  // time, more than the 2.5 % tail), yet the threshold was 5.
  const std::size_t n = nanoddp::common::min_values_for_median_ci(0.95);
  CHECK(n == 6);
  const std::vector<double> five = {10.0, 11.0, 12.0, 13.0, 14.0};
  const auto range = bootstrap_median_ci(five);
  CHECK(range.lo == 10.0);
  CHECK(range.hi == 14.0);
  const std::vector<double> six = {10.0, 11.0, 12.0, 13.0, 14.0, 15.0};
  const auto interval = bootstrap_median_ci(six);
  CHECK(interval.lo > 10.0);
  CHECK(interval.hi < 15.0);
  // A wider interval asks for more values: at 99 % the tail is 0.5 %.
  CHECK(nanoddp::common::min_values_for_median_ci(0.99) > n);
}

TEST_CASE("common: spread is the median, min, p10, p90 and max of the values") {
  const auto s = nanoddp::common::spread({5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0});
  CHECK(s.median == 6.0);
  CHECK(s.min == 1.0);
  CHECK(s.p10 == 2.0);
  CHECK(s.p90 == 10.0);
  CHECK(s.max == 11.0);
  const auto empty = nanoddp::common::spread({});
  CHECK(empty.median == 0.0);
  CHECK(empty.max == 0.0);
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
