// nanoddp-train: the main job. Trains an MLP regression with MSE loss, on one process or, when
// started by a launcher (nanoddp-run, torchrun, mpirun, srun), as one rank of a DDP job.
//
// Exit codes: 0 done; 1 failed while training, or a communication failure while setting up (a
// peer died or did not answer, the store is gone); 2 bad flags, values, files or devices (found
// before the first step).

#include <fmt/format.h>
#include <signal.h>

#include <memory>
#include <string>

#include "common/error_file.h"
#include "common/output_files.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/nn/file_io.h"
#include "options.h"
#include "trainer.h"

namespace {

// Tells the launcher why this rank failed, and whether another rank's failure caused it
// (common/error_file.h): it then names the rank that failed first, not the first to exit.
void record(const std::exception& e) {
  if (const auto* peer = dynamic_cast<const nanoddp::comm::PeerFailedError*>(&e)) {
    nanoddp::common::record_failure(e.what(), true, peer->rank());
  } else {
    // A peer that died or stopped answering: which one, the message says.
    nanoddp::common::record_failure(e.what(), nanoddp::comm::is_communication_failure(e));
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace nanoddp::train;
  // Gloo's TCP transport writes to peers without MSG_NOSIGNAL: when a peer dies, the write
  // raised SIGPIPE and this rank died silently (killed by SIGPIPE, no message) instead of
  // reporting the failed collective. Ignored, the write fails with EPIPE and the process group
  // names the op and the peer.
  ::signal(SIGPIPE, SIG_IGN);
  nanoddp::common::open_closed_standard_fds();
  int exit_code = 0;
  std::string problem;
  const std::optional<TrainOptions> options = parse_options(argc, argv, exit_code, &problem);
  if (!options) {
    // A rank with a bad flag: the others are told, or they would wait their whole timeout for it.
    if (exit_code != 0) {
      std::fflush(stderr);
      nanoddp::common::record_failure(
          problem.empty() ? "its command line was refused (see its output)" : problem, false);
      nanoddp::comm::tell_peers_setup_failed(
          problem.empty() ? "its command line was refused (see its output)" : problem);
    }
    return exit_code;
  }
  std::unique_ptr<Trainer> trainer;
  try {
    trainer = std::make_unique<Trainer>(*options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "nanoddp-train: error: {}\n", nanoddp::nn::escape_controls(e.what(), true));
    record(e);
    if (dynamic_cast<const FailedBeforeJoining*>(&e) != nullptr) {
      std::fflush(stderr);
      nanoddp::comm::tell_peers_setup_failed(e.what());
      return 2;
    }
    // A dead or silent peer is no usage error: exit 2 would keep a launcher from restarting.
    return nanoddp::comm::is_communication_failure(e) ? 1 : 2;
  }
  try {
    return trainer->run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "nanoddp-train: error: {}\n", nanoddp::nn::escape_controls(e.what(), true));
    record(e);
    return 1;
  }
}
