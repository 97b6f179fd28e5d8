#include "options.h"

#include "common/cli.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <iostream>

namespace nanoddp::run {

namespace {

// Checks that CLI11's validators cannot express (relations between flags).
std::string check(const RunOptions& o) {
  if (o.node_rank >= o.nnodes) {
    return fmt::format("--node-rank {} must be smaller than --nnodes {}", o.node_rank, o.nnodes);
  }
  if (o.nnodes > 1 && o.master_addr.empty()) {
    return "--master-addr is required with --nnodes > 1 (the address of node 0, reachable from "
           "every node)";
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    return "--master-port is required with --nnodes > 1 (every node must use the same port)";
  }
  if (o.command.empty()) return "missing PROGRAM: give the program to run after the flags";
  return {};
}

}  // namespace

std::optional<RunOptions> parse_options(int argc, char** argv, int& exit_code) {
  RunOptions o;
  CLI::App app{
      "nanoddp-run: start PROGRAM once per local rank with torchrun's environment variables\n"
      "(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,\n"
      "NANODDP_RESTART_COUNT), prefix each output line with its rank, stop every worker when\n"
      "one fails, and restart the group while restarts remain. PROGRAM is executed directly,\n"
      "never through a shell.\n\n"
      "Usage: nanoddp-run [FLAGS] PROGRAM [ARGS...]"};
  app.get_formatter()->column_width(34);
  // Everything from PROGRAM on belongs to the program, including its own flags.
  app.prefix_command();

  app.add_option("--nproc-per-node", o.nproc_per_node, "workers on this node")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--nnodes", o.nnodes, "nodes in the job")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--node-rank", o.node_rank, "this node's index in 0..nnodes-1")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--master-addr", o.master_addr,
                 "address of rank 0's store (default 127.0.0.1 on one node)");
  app.add_option("--master-port", o.master_port,
                 "port of rank 0's store (default on one node: a free port)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--max-restarts", o.max_restarts, "restarts of the whole group after a failure")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--log-dir", o.log_dir,
                 "also write each rank's output to DIR/rank_R.log (appended, one header per "
                 "attempt)");
  app.add_option("--grace-period", o.grace_period_s,
                 "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();

  if (const std::optional<int> code = cli::parse(app, argc, argv, "nanoddp-run")) {
    exit_code = *code;
    return std::nullopt;
  }
  o.command = app.remaining();
  // prefix_command() hands an unknown flag over as if it were PROGRAM: catch it here.
  if (!o.command.empty() && o.command.front().size() > 1 && o.command.front()[0] == '-' &&
      o.command.front() != "--") {
    std::cerr << "nanoddp-run: error: unknown flag " << o.command.front() << "\n"
              << "Run 'nanoddp-run --help' for the list of flags (put PROGRAM after them).\n";
    exit_code = 2;
    return std::nullopt;
  }
  // CLI11 keeps a leading "--" (the conventional end of the launcher's flags); drop it.
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (std::string problem = check(o); !problem.empty()) {
    std::cerr << "nanoddp-run: error: " << problem << "\n";
    exit_code = 2;
    return std::nullopt;
  }
  exit_code = 0;
  return o;
}

}  // namespace nanoddp::run
