// nanoddp-run: the launcher, what torchrun is for PyTorch. Starts PROGRAM once per local rank
// with torchrun's environment variables, relays each worker's output prefixed with its rank,
// stops every worker when one fails or when the launcher is signalled, and restarts the group
// while --max-restarts allows.
//
// Exit codes:
//   0        all workers exited 0
//   1        (--rdzv-endpoint) the job failed outside this node's workers, or this launcher did
//            not take part: the job was over, or it waited as a standby (the job full at MAX
//            nodes) until the job ended or --rdzv-join-timeout passed
//   2        bad flags, a missing PROGRAM, an unusable --master-addr or --log-dir; settings that
//            differ from the job's at the rendezvous, or another --rdzv-id on its store; a
//            worker's exit code 2 (a usage error: never restarted)
//   126/127  PROGRAM is not executable / not found (checked before any worker starts, as shells do)
//   128 + S  the launcher got signal S (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)
//   other    the last attempt failed: the exit code of the worker that failed first, or
//            128 + S when signal S ended it (e.g. 137 for SIGKILL)

#include <fmt/format.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <random>

#include "common/output_files.h"
#include "elastic.h"
#include "launcher.h"
#include "log_files.h"
#include "nanoddp/nn/file_io.h"
#include "options.h"
#include "output.h"
#include "program_path.h"
#include "report.h"

namespace {

using nanoddp::run::Console;

// Waits until both consoles have written what they hold, or until `until`, or until a SIGINT,
// SIGTERM or SIGHUP arrives: returns that signal, still blocked, else 0 with the signals as
// they were. The consoles' writer threads block every signal, so this thread is the one that
// takes them.
int wait_for_consoles(std::chrono::steady_clock::time_point until) {
  sigset_t stops;
  sigset_t previous;
  sigemptyset(&stops);
  for (const int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, s);
  ::pthread_sigmask(SIG_BLOCK, &stops, &previous);
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const auto slice = std::min(until, now + std::chrono::milliseconds(50));
    const bool written = Console::out().flush(slice) && Console::err().flush(slice);
    const timespec zero{};
    const int signo = ::sigtimedwait(&stops, nullptr, &zero);
    if (signo > 0) return signo;
    if (written || std::chrono::steady_clock::now() >= until) break;
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace nanoddp::run;
  nanoddp::common::open_closed_standard_fds();  // its workers inherit them
  int exit_code = 0;
  std::optional<RunOptions> options = parse_options(argc, argv, exit_code);
  if (!options) return exit_code;

  const ProgramLookup program = find_program(options->command.front());
  if (program.path.empty()) {
    std::cerr << "nanoddp-run: error: " << program.error << "\n";
    return program.exit_code;
  }
  if (!options->log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options->log_dir, error);
    if (error) {
      std::cerr << fmt::format("nanoddp-run: error: --log-dir '{}': {}\n", options->log_dir,
                               error.message());
      return 2;
    }
    if (const auto problem = unusable_log_entry(options->log_dir)) {
      std::cerr << "nanoddp-run: error: " << *problem << "\n";
      return 2;
    }
    Console::out().set_drop_hint("; the --log-dir files have every line");
    Console::err().set_drop_hint("; the --log-dir files have every line");
  } else {
    Console::out().set_drop_hint("; --log-dir keeps every line in files");
    Console::err().set_drop_hint("; --log-dir keeps every line in files");
  }
  LaunchPlan plan;
  plan.program_path = program.path;
  plan.master_addr = options->master_addr.empty() ? "127.0.0.1" : options->master_addr;
  plan.master_port = options->master_port;
  if (options->nnodes == 1) {
    // Beside a token the user set, not instead of it: two jobs that inherited the same
    // NANODDP_STORE_TOKEN stay apart too.
    const char* user_token = std::getenv("NANODDP_STORE_TOKEN");
    std::random_device random;
    plan.store_token =
        fmt::format("{}{:08x}{:08x}{:08x}{:08x}", user_token ? std::string(user_token) + "/" : "",
                    random(), random(), random(), random());
  }
  plan.options = std::move(*options);
  try {
    exit_code = plan.options.rdzv_endpoint.empty() ? run_launcher(plan) : run_elastic(plan);
  } catch (const std::exception& e) {
    Console::err().write(
        fmt::format("nanoddp-run: error: {}\n", nanoddp::nn::escape_controls(e.what(), true)),
        false);
    exit_code = 2;
  }
  // At most 10 s in all: the job's outcome is its exit code, and a reader that never reads
  // again must not keep a finished launcher alive. A SIGINT, SIGTERM or SIGHUP ends the wait at
  // once, as it ends the launcher, but after the note on what was not written: it used to end
  // the launcher with no word of the lines it dropped.
  const int signo = wait_for_consoles(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  if (signo != 0) {
    Console::err().write(
        fmt::format("nanoddp-run: got {} while writing the last of the output: exiting now\n",
                    signal_name(signo)),
        false);
  }
  const bool out_written = Console::out().flush(std::chrono::steady_clock::now());
  const bool err_written = Console::err().flush(std::chrono::steady_clock::now());
  // A reader that stopped for good: what it missed is said on the other stream, when that one
  // still takes lines (not when both are one stuck pipe), rather than lost without a word.
  if (out_written != err_written) {
    Console& stuck = out_written ? Console::err() : Console::out();
    Console& other = out_written ? Console::out() : Console::err();
    other.write(stuck.unwritten_note(signo != 0 ? "on " + signal_name(signo)
                                                : std::string("after waiting 10 s")),
                false);
    other.flush(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  }
  if (signo != 0) {
    // Ended by the signal, as the caller expects of it (a shell sees 128 + S).
    ::signal(signo, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signo);
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    ::raise(signo);
  }
  return exit_code;
}
