#pragma once
// What a figure needs to be reproduced or distrusted: the "provenance" object of every
// benchmark's JSON line, and the line its tables and charts print.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace nanoddp::common {

// The commit the program was built from ("unknown" outside a git checkout) and whether tracked
// files differed from it at build time: "yes", "no" or "unknown". (Generated: cmake/GitInfo.cmake.)
const char* git_commit();
const char* git_dirty();

// Now, UTC, ISO 8601 to the second: 2026-12-01T15:30:00Z.
std::string utc_now();

// {"commit", "dirty", "command" (what the user typed: argv joined, shell-quoted where needed;
//  under nanoddp-run, the launcher's command line, read from /proc, with this worker's own in
//  "worker_command"), "cwd" (the directory it ran in), "utc", "environment" (every NANODDP_*,
//  OMP_* and NCCL_* variable), "load_average" ([1, 5, 15 min])}. Secrets are never recorded:
//  see redact().
nlohmann::ordered_json provenance(int argc, const char* const* argv);

// Secrets never go into a results file. A variable whose name holds TOKEN, SECRET, PASSWORD or
// KEY (NANODDP_STORE_TOKEN above all) is recorded as "<redacted>", and its value (and each
// '/'-separated part of it: nanoddp-run hands its workers "<user token>/<random>") is replaced
// by "<redacted>" wherever it appears in a string: the command line, a transport description.
bool is_secret_name(std::string_view name);
std::string redact(std::string text);
// redact() on every string of `value`, keys included, recursively.
void redact_strings(nlohmann::ordered_json& value);
inline constexpr const char* kRedacted = "<redacted>";

// The command as a shell reads it back (each argument quoted where needed).
std::string command_line(int argc, const char* const* argv);

// One line for a table or chart: "commit 1a2b3c4 (dirty), 2026-12-01T15:30:00Z, load 1.2".
std::string provenance_line(const nlohmann::ordered_json& provenance);

}  // namespace nanoddp::common
