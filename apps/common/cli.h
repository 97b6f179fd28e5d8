#pragma once
// How nanoddp's executables (apps/ and benchmarks/) parse their command line with CLI11, in
// one place: --help prints the usage and exits 0; any other parse error prints
// "<program>: error: <what>" and a hint on stderr and exits 2. (CLI11's own exit codes, 105 to
// 109, mean nothing to a shell script or a launcher's summary; 2 is the usage-error convention.)
//
// Header-only: CLI11 is a dependency of the executables, not of the library.

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

namespace nanoddp::cli {

// Parses argv into `app`. Returns nullopt when the program should go on; otherwise the exit
// code to return now (0 after --help, 2 after a bad flag or value).
inline std::optional<int> parse(CLI::App& app, int argc, const char* const* argv,
                                const char* program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << program << ": error: " << e.what() << "\n"
              << "Run '" << program << " --help' for the list of flags.\n";
    return 2;
  }
  return std::nullopt;
}

// For checks after parsing: prints "<program>: error: <problem>" and returns 2.
inline int usage_error(const char* program, const std::string& problem) {
  std::cerr << program << ": error: " << problem << "\n";
  return 2;
}

}  // namespace nanoddp::cli
