// nanoddp-provenance: the "provenance", "machine" and "build" objects every C++ benchmark writes
// into its JSON lines, for a benchmark that is a script (benchmarks/vs-pytorch.sh), as one JSON
// object on stdout. The same helpers (apps/common) fill them, so a script's lines carry the same
// commit, dirty flag, redaction of secrets and machine description as the programs' lines, not
// a shell re-implementation that drifts from them.
//
//   nanoddp-provenance [--json FILE] -- COMMAND [ARG...]
//
// COMMAND is what the user typed (a script passes "$0" "$@"): provenance.command. --json names
// the results file the script writes: provenance.json, as an absolute path. The time and the
// load average are this program's, so a script calls it before it measures.
//
// Exit codes: 0 printed; 2 bad flags.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/machine_info.h"
#include "common/provenance.h"

int main(int argc, char** argv) {
  std::vector<std::string> command;
  std::string json_path;
  CLI::App app{
      "nanoddp-provenance: the provenance, machine and build objects of nanoddp's benchmarks, "
      "for a script's results (one JSON object on stdout)"};
  app.add_option("--json", json_path, "the results file the script writes (provenance.json)")
      ->check(nanoddp::cli::non_empty_path());
  app.add_option("command", command, "the command the user typed, after --")->required();
  if (const std::optional<int> code = nanoddp::cli::parse(app, argc, argv, "nanoddp-provenance")) {
    return *code;
  }
  std::vector<const char*> args;
  for (const std::string& a : command) args.push_back(a.c_str());
  nlohmann::ordered_json provenance =
      nanoddp::common::provenance(static_cast<int>(args.size()), args.data());
  if (!json_path.empty()) {
    std::error_code ec;
    provenance["json"] = std::filesystem::absolute(json_path, ec).string();
  }
  nlohmann::ordered_json out = {{"provenance", provenance},
                                {"machine", nanoddp::common::machine_info()},
                                {"build", nanoddp::common::build_info()}};
  nanoddp::common::redact_strings(out);
  fmt::print("{}\n", out.dump());
  return 0;
}
