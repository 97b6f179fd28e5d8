// nanoddp-bench-ddp: the DDP training step as a benchmark, swept the way a scaling study sweeps
// it (world size, model size, batch, bucket size, overlap, optimizer in backward, comm hook) —
// nccl-tests for a whole DDP step instead of one collective.
//
//   nanoddp-bench-ddp --world 1,2 --hidden 1024 --layers 3 --batch 64 --bucket-cap-mb 1,25
//                     --overlap on,off --json ddp.jsonl
//
// One executable, two roles: the driver (driver.h) expands the sweep and starts each point as
// `nanoddp-run --nproc-per-node W nanoddp-bench-ddp --worker ...`; the worker (worker.h) is one
// rank of that job.
//
// Exit codes: 0 every point ran; 1 a point (or a worker) failed; 2 bad flags or values.

#include <fmt/format.h>
#include <signal.h>

#include <cstdlib>

#include "common/provenance.h"
#include "driver.h"
#include "nanoddp/nn/file_io.h"
#include "options.h"
#include "worker.h"

int main(int argc, char** argv) {
  using namespace nanoddp::bench_ddp;
  // As in nanoddp-train: a peer's death must surface as a failed collective (EPIPE), not kill
  // this rank silently with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  int exit_code = 0;
  const std::optional<Options> options = parse_options(argc, argv, exit_code);
  if (!options) return exit_code;
  try {
    return options->worker ? run_worker(*options)
                           : run_driver(*options, nanoddp::common::provenance(argc, argv));
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    if (options->worker) {
      fmt::print(stderr, "nanoddp-bench-ddp: worker (rank {}): error: {}\n",
                 rank != nullptr ? rank : "0", nanoddp::nn::escape_controls(e.what(), true));
    } else {
      fmt::print(stderr, "nanoddp-bench-ddp: error: {}\n",
                 nanoddp::nn::escape_controls(e.what(), true));
    }
    return 1;
  }
}
