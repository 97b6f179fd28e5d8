#include "options.h"

#include "common/cli.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

namespace nanoddp::run {

namespace {

// Checks that CLI11's validators cannot express (relations between flags).
std::string check(const RunOptions& o) {
  if (o.min_nodes < o.nnodes && o.rdzv_endpoint.empty()) {
    return fmt::format(
        "--nnodes {}:{} needs --rdzv-endpoint HOST:PORT (elastic rounds: the "
        "launchers meet in a store there)",
        o.min_nodes, o.nnodes);
  }
  if (!o.rdzv_endpoint.empty()) {
    if (o.node_rank != 0) {
      return "--node-rank is not used with --rdzv-endpoint: the rendezvous assigns the node ranks";
    }
    if (!o.master_addr.empty() || o.master_port != 0) {
      return "--master-addr/--master-port are not used with --rdzv-endpoint: node 0 of each round "
             "picks the workers' store address";
    }
    const auto colon = o.rdzv_endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 ||
        o.rdzv_endpoint.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
        colon + 1 == o.rdzv_endpoint.size() || colon + 7 < o.rdzv_endpoint.size() ||
        std::stoi(o.rdzv_endpoint.substr(colon + 1)) < 1 ||
        std::stoi(o.rdzv_endpoint.substr(colon + 1)) > 65535) {
      return fmt::format("--rdzv-endpoint '{}' is not HOST:PORT (e.g. 10.0.0.1:29400)",
                         o.rdzv_endpoint);
    }
    return o.command.empty() ? "missing PROGRAM: give the program to run after the flags" : "";
  }
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
  std::string nnodes = "1";
  app.add_option("--nnodes", nnodes,
                 "nodes in the job: N, or MIN:MAX with --rdzv-endpoint (elastic rounds)")
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
  app.add_option("--rdzv-endpoint", o.rdzv_endpoint,
                 "HOST:PORT where the launchers of all nodes meet (elastic rounds; the launcher on "
                 "HOST serves the store)");
  app.add_option("--rdzv-id", o.rdzv_id, "the job's name in the rendezvous store")
      ->check(CLI::Validator(
          [](const std::string& id) {
            // A part of store keys (nanoddp-run/<id>/r0/...): '/' could reach another job's.
            const bool ok = !id.empty() && id.size() <= 128 &&
                            id.find_first_not_of(
                                "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
                                "WXYZ0123456789_.-") == std::string::npos;
            return ok ? std::string() : "'" + id + "' must be 1 to 128 of [A-Za-z0-9_.-]";
          },
          "ID"))
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "seconds without a node's heartbeat before it is declared lost")
      ->check(CLI::Range(0.5, 3600.0))
      ->capture_default_str();
  app.add_option("--rdzv-join-timeout", o.join_timeout_s,
                 "seconds a round waits for MIN nodes before the job fails (a standby, "
                 "waiting while the job is full: before it leaves)")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--rdzv-last-call", o.last_call_s,
                 "seconds a round waits for more nodes once MIN have joined (from the last "
                 "arrival)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--grace-period", o.grace_period_s,
                 "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();

  if (const std::optional<int> code = cli::parse(app, argc, argv, "nanoddp-run")) {
    exit_code = *code;
    return std::nullopt;
  }
  // --nnodes N or MIN:MAX (torchrun's syntax).
  {
    int min = 0, max = 0;
    char extra = 0;
    const int fields = std::sscanf(nnodes.c_str(), "%d:%d%c", &min, &max, &extra);
    const bool single = nnodes.find(':') == std::string::npos &&
                        std::sscanf(nnodes.c_str(), "%d%c", &min, &extra) == 1;
    if (single) max = min;
    if (!(single || fields == 2) || min < 1 || max < min || max > 65536) {
      std::cerr << "nanoddp-run: error: --nnodes '" << nnodes
                << "' is not N or MIN:MAX with 1 <= MIN <= MAX <= 65536\n";
      exit_code = 2;
      return std::nullopt;
    }
    o.min_nodes = min;
    o.nnodes = max;
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
