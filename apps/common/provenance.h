#pragma once
// What a figure needs to be reproduced or distrusted: the "provenance" object of every
// benchmark's JSON line, and the line its tables and charts print.

#include <nlohmann/json.hpp>
#include <string>

namespace nanoddp::common {

// The commit the program was built from ("unknown" outside a git checkout) and whether tracked
// files differed from it at build time: "yes", "no" or "unknown". (Generated: cmake/GitInfo.cmake.)
const char* git_commit();
const char* git_dirty();

// Now, UTC, ISO 8601 to the second: 2026-12-01T15:30:00Z.
std::string utc_now();

// {"commit", "dirty", "command" (argv joined, shell-quoted where needed), "utc",
//  "environment" (every NANODDP_*, OMP_* and NCCL_* variable), "load_average" ([1, 5, 15 min])}.
nlohmann::ordered_json provenance(int argc, const char* const* argv);

// One line for a table or chart: "commit 1a2b3c4 (dirty), 2026-12-01T15:30:00Z, load 1.2".
std::string provenance_line(const nlohmann::ordered_json& provenance);

}  // namespace nanoddp::common
