// nanoddp-sim: predicts a DDP training step on clusters nobody can run here (8 to 4096 GPUs):
// a compute profile (from a nanoddp trace, or a FLOP model of the MLP on a named GPU), the
// Reducer's buckets, an alpha-beta model of ring and tree all-reduce, and a replay of backward
// overlapped with the bucketed all-reduces. See docs/simulator.md.
//
// Exit codes: 0 done; 2 bad flags, values or input files; 1 a results file that could not be
// written, or anything unexpected.

#include <fmt/format.h>

#include "benchmarks/sim/cli.h"
#include "benchmarks/sim/error.h"
#include "nanoddp/nn/file_io.h"

int main(int argc, char** argv) {
  using namespace nanoddp::sim;
  int exit_code = 0;
  const std::optional<CliOptions> options = parse_cli(argc, argv, exit_code);
  if (!options) return exit_code;
  try {
    return run_cli(*options);
  } catch (const SimError& e) {
    fmt::print(stderr, "nanoddp-sim: error: {}\n", nanoddp::nn::escape_controls(e.what(), true));
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "nanoddp-sim: internal error: {}\n",
               nanoddp::nn::escape_controls(e.what(), true));
    return 1;
  }
}
