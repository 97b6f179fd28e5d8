#pragma once
// The flags of nanoddp-bench-ddp, for both of its roles.
//
// The driver takes comma-separated lists (`--world 1,2,4 --hidden 256,1024`) and runs every
// point of their cartesian product. A worker is started by the driver (through nanoddp-run)
// with the same flags, each holding the one value of its point, plus `--worker --result FILE`:
// one parser and one set of names for both, so a point's command line reads like the sweep's.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nanoddp::bench_ddp {

enum class Scaling { kWeak, kStrong };
const char* scaling_name(Scaling scaling);

struct Options {
  // Sweep dimensions (each a list; a worker's have one element each).
  std::vector<int> world = {1, 2};  // processes per node
  std::vector<std::int64_t> hidden = {1024};
  std::vector<std::int64_t> layers = {3};
  // Empty: the hidden width (so that sweeping --hidden scales every layer of the MLP).
  std::vector<std::int64_t> in;
  std::vector<std::int64_t> out;
  std::vector<std::string> activation = {"relu"};
  std::vector<std::int64_t> batch = {64};  // per rank (weak) or global (strong)
  std::vector<double> bucket_cap_mb = {25.0};
  std::vector<double> first_bucket_mb = {1.0};
  std::vector<bool> overlap = {true};
  std::vector<bool> optimizer_in_backward = {false};
  std::vector<std::string> comm_hook = {"allreduce"};
  // ZeRO stage (comm/zero.h): 0 plain DDP, 1 optimizer state sharded, 2 the averaged gradients
  // too. The 1-rank baseline has no DDP, so it is shared by every stage.
  std::vector<int> zero = {0};
  // ZeRO's parameter all-gather overlapping the next forward (DdpOptions::zero_overlap_gather).
  std::vector<bool> zero_overlap_gather = {false};
  std::vector<int> threads = {1};

  // One value for the whole sweep.
  Scaling scaling = Scaling::kWeak;
  std::string backend = "auto";
  std::string device = "cpu";
  int steps = 20;
  int warmup = 5;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;  // 0: nanoddp-run picks a free one (single node only)
  double timeout_s = 600;
  int repeats = 1;  // separate launches of every point (and of every baseline)
  std::string json_path;
  std::string csv_path;
  bool quiet = false;
  // Said once on stderr by the driver: values given twice in a list, measured once.
  std::vector<std::string> notes;
  // The note above on --zero stages asked at --world 1 (also in the baseline's "warnings").
  std::string zero_at_world_1_note;

  // Worker role (hidden from --help).
  bool worker = false;
  // The scaling baseline: one process, no launcher, no process group, no DDP, the optimizer
  // step after backward; the same for every configuration that shares its model and batch.
  bool plain = false;
  std::string result_path;
};

// Parses argv. On --help, a usage error or a bad value, prints what to print (the message names
// the flag) and returns nullopt with `exit_code` set (0 for --help, 2 otherwise).
std::optional<Options> parse_options(int argc, const char* const* argv, int& exit_code);

}  // namespace nanoddp::bench_ddp
