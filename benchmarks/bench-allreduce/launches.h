#pragma once
// --nproc-per-node W [--repeats N]: nanoddp-bench-allreduce as its own launcher. It runs the same
// measurement as N separate `nanoddp-run --nproc-per-node W` jobs (fresh processes, connections
// and shared memory each time: the launch-to-launch spread a single run cannot show), passes
// every launch's output through, tags each JSON line with "launch" and "launches", and ends with
// the median and min-max over the launches per size and column set.

#include <string>

namespace nanoddp::bench_allreduce {

// `argv` is this program's command line; the launcher flags and --json are taken out of what
// the jobs get. Returns the exit code (1 when a launch failed).
int run_launches(int argc, char** argv, int nproc, int repeats, const std::string& json_path);

}  // namespace nanoddp::bench_allreduce
