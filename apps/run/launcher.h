#pragma once
// Runs the local workers of a job: start them, relay their output, watch them end, stop the
// whole group when one fails or when the launcher is signalled, remove the shared-memory
// segments that workers killed mid-set-up left (shm_cleanup.h), and restart the group while
// restarts remain.

#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "nanoddp/comm/unique_fd.h"
#include "options.h"
#include "signals.h"

namespace nanoddp::run {

struct LaunchPlan {
  RunOptions options;
  std::string program_path;  // PROGRAM, resolved in PATH
  std::string master_addr;
  int master_port = 0;  // 0: pick a free port on master_addr for every attempt
  // The store's shared secret for this job's workers (NANODDP_STORE_TOKEN): on one node a random
  // one (after the user's token, if set), so a second job started on the same --master-port
  // cannot join this job's store (its workers are refused at the handshake) and kill it. Empty
  // on several nodes: every node's launcher would draw another; set NANODDP_STORE_TOKEN there.
  std::string store_token;
};

// Ends a round from outside its poll loop (the elastic agent's monitor thread, elastic.h):
// request() keeps the first reason and wakes the loop through a pipe.
class StopRequest {
 public:
  StopRequest();
  void request(const std::string& reason);
  std::optional<std::string> reason() const;
  int fd() const { return read_end_.get(); }

 private:
  mutable std::mutex mutex_;
  std::optional<std::string> reason_;
  comm::UniqueFd read_end_;
  comm::UniqueFd write_end_;
};

// One round of this node's workers: where its ranks sit in the job, and how it is watched.
struct RoundSpec {
  int node_rank = 0;
  int rank_offset = 0;  // the global rank of this node's local rank 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string store_token;
  int restart_count = 0;
  std::string label;  // "attempt 1 of 2", "round 3": in messages and log headers
  const StopRequest* stop = nullptr;
  // Called once, at the first local worker that fails, with what happened to it ("rank 3
  // failed: exit code 1", followed by ", after a communication failure" or ", because rank R
  // failed" when the worker said another rank's failure caused its own) and its exit code
  // (exit_code_of: 128 + S for a signal).
  std::function<void(const std::string&, int exit_code)> on_failure;
  // Elastic rounds: called when a local worker failed because of another rank and the launcher
  // waits for another node's verdict (the elastic agent then reads the round's end often).
  std::function<void()> on_settle;
};

enum class Outcome { kSucceeded, kFailed, kInterrupted, kEnded };

struct AttemptOutcome {
  Outcome outcome = Outcome::kSucceeded;
  int exit_code = 0;
  std::string reason;  // kEnded: the StopRequest's reason
};

// Runs one round of this node's workers to its end. kEnded: `stop` ended it.
AttemptOutcome run_round(const LaunchPlan& plan, const RoundSpec& round, SignalInbox& signals);

// Makes this launcher a child subreaper: the orphans of its workers (a worker's child whose
// parent was killed) become its children, so that it reaps them and their process groups empty
// at once. Without it they wait for init to reap them, which in a container may be never, and a
// round's stop waited its whole SIGKILL grace for them (an outside operator's finding).
void adopt_orphans();

// A worker's exit code 2 is a usage error (bad flags, values or inputs, as nanoddp's programs
// and most command-line tools use it): a restart would fail the same way, so none is made.
inline constexpr int kUsageExitCode = 2;

// Returns the launcher's exit code:
//   0        every worker of an attempt exited 0;
//   2        the worker that failed first exited 2 (a usage error: never restarted);
//   128 + S  the launcher got signal S (SIGINT, SIGTERM, SIGHUP) and stopped the workers;
//   else     the last attempt failed: the exit code of the worker that failed first (128 + S
//            when a signal ended it; 127/126 when it could not be started).
int run_launcher(const LaunchPlan& plan);

}  // namespace nanoddp::run
