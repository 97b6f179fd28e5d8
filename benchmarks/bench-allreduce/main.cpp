// nanoddp-bench-allreduce: all-reduce bandwidth the way nccl-tests' all_reduce_perf reports it,
// through nanoddp's process groups — and, with --raw, straight on the Gloo API, so that the
// engine's own overhead (Work objects, the worker thread hand-off, dtype dispatch) can be read
// off by comparing the two runs. --vs-raw does both in one run, interleaved round by round, so
// that the comparison holds even on a busy machine (two separate runs see different loads).
//
// Transport. When every rank is on this host, the process group's allreduce goes through shared
// memory (backend "gloo+shm"; NANODDP_SHM=0 turns that off), while --raw always runs Gloo's TCP
// ring: the header's "transport" line says which one a run measured, so the two can be compared.
//
// Run it as a worker under a launcher (it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// e.g. two processes on one machine:
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 nanoddp-bench-allreduce &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 nanoddp-bench-allreduce
// Rank 0 prints.
//
// What is measured (per size), as nccl-tests' all_reduce_perf: out of place (a send and a receive
// buffer), then in place (one buffer), each `-w` warm-up ops, then `-r` rounds of: a barrier,
// `-n` ops issued back to back and waited for. A round's time is each rank's elapsed / n,
// averaged over the ranks (nccl-tests' default -a 1); a row reports the median round, and the
// JSON also the fastest and slowest round and every round's time. The process group's
// allreduce works in place, so out of place is a copy into the receive buffer, then the op, and
// the next op waits for it (what a caller of an in-place API pays); --raw calls Gloo with its own
// input and output pointers. Sizes are whole elements, never more than -e.
//   algbw = bytes / time                    (what the caller sees)
//   busbw = algbw * 2 (n - 1) / n           (what each link carries in a ring all-reduce:
//                                            comparable across world sizes, and with nccl-tests)
// With -c 1 a separate op on freshly filled data (element i of rank r is (r + 1) * (i % 4 + 1))
// is compared with its closed-form result; #wrong counts mismatching elements over all ranks.
// Buffers are allocated once at the largest size and viewed for smaller ones.
//
// --collective reduce_scatter | allgather measures those instead, as nccl-tests'
// reduce_scatter_perf and all_gather_perf do: size = the whole buffer (the reduce-scatter's
// input, the all-gather's output), count = elements per rank, algbw = size / time, busbw =
// algbw * (n - 1) / n. Out of place: separate input and output; in place: the output is this
// rank's block of the input (reduce_scatter), the input this rank's block of the output
// (allgather). The check compares every element with its closed form, as for all-reduce.
// (--op stays the reduction, as nccl-tests' -o.)

#include <fmt/format.h>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/load.h"
#include "common/machine_info.h"
#include "common/provenance.h"
#include "common/results_file.h"
#include "common/stats.h"
#include "launches.h"
#include "nanoddp/comm/gloo_context.h"
#include "nanoddp/comm/gloo_process_group.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/engine/allocator.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/bf16.h"
#include "nanoddp/kernels/error.h"
#include "raw_gloo.h"
#include "values.h"

namespace {

using nanoddp::DType;
using nanoddp::Tensor;
using nanoddp::comm::ReduceOp;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string min_bytes = "8";
  std::string max_bytes = "64M";
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string op = "sum";
  std::string collective = "allreduce";
  std::string dtype = "float";
  std::string backend = "gloo";
  std::string json_path;
  bool raw = false;
  bool vs_raw = false;
  int rounds = 0;  // 0: 1, or 5 with --vs-raw
  int nproc = 0;   // > 0: be the launcher (launches.h)
  int repeats = 1;
};

using nanoddp::bench_allreduce::Collective;
using nanoddp::bench_allreduce::RawGloo;
using nanoddp::kernels::float_to_bf16;
using namespace nanoddp::bench_allreduce;  // flag values and closed forms (values.h)

// ---- one rank's view of the job --------------------------------------------------------------

enum class Mode { kEngine, kRaw };

struct Runner {
  nanoddp::comm::WorldInfo world;
  nanoddp::Device device = nanoddp::Device::cpu();
  // The job: its store and check-in, and the process group except under --raw.
  std::optional<nanoddp::comm::Distributed> dist;
  std::optional<RawGloo> raw;  // --raw (and --vs-raw: a second connection of its own)
  std::string transport;
  std::string raw_transport;

  int rank() const { return world.rank; }
  int size() const { return world.world_size; }
  // The mode of plain runs: --raw, or the process group.
  Mode default_mode() const { return has_group() ? Mode::kEngine : Mode::kRaw; }
  bool has_group() const { return dist && dist->group != nullptr; }

  // Issues `count` ops and waits for all (nanoddp: back to back, then wait in order). With
  // `input`: out of place, from `input` into `t`.
  void run_ops(Mode mode, Tensor& t, ReduceOp op, int count, const Tensor* input = nullptr) {
    if (mode == Mode::kRaw) {
      for (int i = 0; i < count; ++i) raw->allreduce(t, op, input);
      return;
    }
    if (input != nullptr) {
      // The process group reduces in place: copy, reduce, and let the next copy wait for it.
      for (int i = 0; i < count; ++i) {
        t.copy_from(*input);
        dist->group->allreduce(t, op)->wait();
      }
      if (device.is_cuda()) nanoddp::Stream::compute(device).synchronize();
      return;
    }
    // Ops complete in issue order, so waiting for the last one waits for all of them (and
    // wakes this thread once, not once per op).
    std::shared_ptr<nanoddp::comm::Work> last;
    for (int i = 0; i < count; ++i) {
      last = dist->group->allreduce(t, op);
    }
    if (last != nullptr) last->wait();
    if (device.is_cuda()) nanoddp::Stream::compute(device).synchronize();
  }
  // reduce_scatter or allgather through the process group, `count` back to back.
  void run_scatter_gather(Collective c, const Tensor& input, Tensor& output, ReduceOp op,
                          int count) {
    std::shared_ptr<nanoddp::comm::Work> last;
    for (int i = 0; i < count; ++i) {
      last = c == Collective::kReduceScatter ? dist->group->reduce_scatter(input, output, op)
                                             : dist->group->allgather(input, output);
    }
    if (last != nullptr) last->wait();
    if (device.is_cuda()) nanoddp::Stream::compute(device).synchronize();
  }
  void barrier() {
    if (!has_group()) {
      raw->barrier();
    } else {
      dist->group->barrier()->wait();
    }
  }
  std::int64_t sum_across(std::int64_t value) {
    Tensor t = Tensor::full({1}, static_cast<float>(value));
    if (!has_group()) {
      raw->allreduce(t, ReduceOp::kSum);
    } else if (device.is_cuda()) {
      Tensor g = t.to(device);
      dist->group->allreduce(g, ReduceOp::kSum)->wait();
      t = g.to(nanoddp::Device::cpu());
    } else {
      dist->group->allreduce(t, ReduceOp::kSum)->wait();
    }
    return static_cast<std::int64_t>(t.item());
  }
  // Every rank's values, averaged element by element over the ranks.
  std::vector<double> mean_across(const std::vector<double>& values) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())});
    for (std::size_t i = 0; i < values.size(); ++i) t.data()[i] = static_cast<float>(values[i]);
    if (!has_group()) {
      raw->allreduce(t, ReduceOp::kSum);
    } else if (device.is_cuda()) {
      Tensor g = t.to(device);
      dist->group->allreduce(g, ReduceOp::kSum)->wait();
      t = g.to(nanoddp::Device::cpu());
    } else {
      dist->group->allreduce(t, ReduceOp::kSum)->wait();
    }
    std::vector<double> mean(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) mean[i] = t.data()[i] / size();
    return mean;
  }
};

// Every rank must measure the same thing. Ranks started by hand with different -e, -n or -w ran
// different numbers of ops: the one with more waited out its timeout, and with -e the other
// printed its rows and exited 0 (an outside tester's). Each rank publishes what it will measure
// (sizes as bytes, so "1K" and "1024" agree) and compares every other rank's with its own, before
// anything is measured. Returns the difference, naming both ranks, or "".
std::string plan_mismatch(nanoddp::comm::Store& store, int rank, int size,
                          const std::string& plan) {
  store.set(fmt::format("bench-allreduce/plan/{}", rank), plan);
  for (int other = 0; other < size; ++other) {
    if (other == rank) continue;
    const std::string theirs = store.get_string(fmt::format("bench-allreduce/plan/{}", other));
    if (theirs != plan) {
      // "FLAG VALUE" pairs: name only those that differ.
      const auto pairs = [](const std::string& text) {
        std::vector<std::string> words;
        for (std::size_t at = 0; at < text.size();) {
          const std::size_t end = std::min(text.find(' ', at), text.size());
          words.push_back(text.substr(at, end - at));
          at = end + 1;
        }
        return words;
      };
      const std::vector<std::string> a = pairs(plan), b = pairs(theirs);
      std::string mine, their;
      for (std::size_t i = 0; i + 1 < std::min(a.size(), b.size()); i += 2) {
        if (a[i] == b[i] && a[i + 1] == b[i + 1]) continue;
        mine += (mine.empty() ? "" : " ") + a[i] + " " + a[i + 1];
        their += (their.empty() ? "" : " ") + b[i] + " " + b[i + 1];
      }
      if (mine.empty()) mine = plan, their = theirs;  // another build's plan: say it whole
      const bool sizes = (" " + mine).find(" -b ") != std::string::npos ||
                         (" " + mine).find(" -e ") != std::string::npos;
      return fmt::format(
          "the ranks disagree on what to measure: rank {} has {}, but rank {} has {}{}; give "
          "every rank the same flags",
          rank, mine, other, their, sizes ? " (sizes in bytes)" : "");
    }
  }
  return "";
}

// How far a run came before it ended: main tells the other ranks of a job started by hand
// about a refusal before this rank joined (`refusal`: its text, empty for CLI11's own).
struct Outcome {
  std::string refusal;
  bool joining = false;  // set-up started: its check-in tells the others itself
};

int run(int argc, char** argv, Outcome& outcome) {
  // Every refusal below comes before this rank joins the job.
  const auto refuse = [&](const std::string& why) {
    outcome.refusal = why;
    return nanoddp::cli::usage_error("nanoddp-bench-allreduce", why);
  };
  Options opt;
  CLI::App app{"nanoddp-bench-allreduce: all-reduce time, algbw and busbw (nccl-tests style)"};
  app.add_option("-b,--minbytes", opt.min_bytes, "smallest size in bytes (8, 1K, 16M, ...)");
  app.add_option("-e,--maxbytes", opt.max_bytes, "largest size in bytes");
  app.add_option("-f,--stepfactor", opt.factor, "size multiplier between rows")
      ->check(CLI::Range(1.01, 1e6));
  app.add_option("-n,--iters", opt.iters, "timed ops per size")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", opt.warmup, "untimed ops per size first")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", opt.check, "check results against closed-form values (0/1)")
      ->check(CLI::Range(0, 1));
  auto* op_flag = app.add_option("--op", opt.op, "reduction: sum, avg, max, min");
  app.add_option("--collective", opt.collective,
                 "allreduce, reduce_scatter or allgather (nccl-tests' all_reduce_perf, "
                 "reduce_scatter_perf, all_gather_perf)");
  app.add_option("--dtype", opt.dtype, "float or bf16")->check(CLI::IsMember({"float", "bf16"}));
  app.add_option("--backend", opt.backend, "gloo or nccl")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--json", opt.json_path, "also write one JSON object per row to FILE")
      ->check(nanoddp::cli::non_empty_path());
  app.add_option("-r,--rounds", opt.rounds,
                 "timed rounds of -n ops per size; the median round is reported (default 1, "
                 "5 with --vs-raw)")
      ->check(CLI::PositiveNumber);
  auto* raw_flag = app.add_flag(
      "--raw", opt.raw,
      "Gloo only: call gloo::allreduce directly (same connection set-up, no process group, no "
      "worker thread) to show the engine's overhead");
  app.add_flag("--vs-raw", opt.vs_raw,
               "Gloo only: the process group and raw gloo::allreduce in one run, alternating "
               "rounds, with their ratio per size (set NANODDP_SHM=0 NANODDP_TCP_RING=0 to "
               "compare the same TCP ring, Gloo's)")
      ->excludes(raw_flag);
  app.add_option("--nproc-per-node", opt.nproc,
                 "run the measurement itself as nanoddp-run jobs of W ranks (started without a "
                 "launcher)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--repeats", opt.repeats,
                 "with --nproc-per-node: N separate launches, each line tagged with its launch, "
                 "then the median and min-max over them")
      ->check(CLI::Range(1, 1000));
  if (const std::optional<int> code =
          nanoddp::cli::parse(app, argc, argv, "nanoddp-bench-allreduce", &outcome.refusal)) {
    return *code;
  }
  if (opt.repeats > 1 && opt.nproc == 0) {
    return refuse(
        "--repeats N launches the job N times: give --nproc-per-node W too, and start "
        "nanoddp-bench-allreduce without a launcher");
  }
  // The values CLI11 cannot check itself: a mistake here is a usage error (exit 2), like a bad
  // flag, not a failure of the run; checked before --nproc-per-node launches anything, so the
  // driver says it once, at once, rather than every rank after the job started.
  ReduceOp op{};
  Collective collective{};
  std::int64_t min_bytes = 0, max_bytes = 0;
  try {
    op = parse_op(opt.op);
    collective = parse_collective(opt.collective);
    if (collective == Collective::kAllgather && op_flag->count() > 0) {
      nanoddp::fail("--op {}: an allgather reduces nothing; drop --op", opt.op);
    }
    if ((opt.raw || opt.vs_raw) && collective != Collective::kAllreduce) {
      nanoddp::fail(
          "--raw and --vs-raw measure gloo::allreduce: give them without "
          "--collective {}",
          opt.collective);
    }
    // Each size error names its flag (an outside tester's -b 2T -e 2T named neither).
    const auto bytes_of = [](const char* flag, const std::string& text) {
      try {
        return parse_bytes(text);
      } catch (const nanoddp::Error& e) {
        nanoddp::fail("{}: {}", flag, e.what());
      }
    };
    min_bytes = bytes_of("-b/--minbytes", opt.min_bytes);
    max_bytes = bytes_of("-e/--maxbytes", opt.max_bytes);
    if (min_bytes < 1 || max_bytes < min_bytes) {
      nanoddp::fail("-b {} -e {}: need 1 <= minbytes <= maxbytes", opt.min_bytes, opt.max_bytes);
    }
    if ((opt.raw || opt.vs_raw) && opt.backend != "gloo") {
      nanoddp::fail("--raw and --vs-raw are for the gloo backend only (got --backend {})",
                    opt.backend);
    }
  } catch (const nanoddp::Error& e) {
    return refuse(e.what());
  }
  // Said here, in this program's flags (the library's message would name nanoddp-train's), and
  // before --nproc-per-node launches ranks that would each fail on it.
  if (opt.backend == "nccl" && nanoddp::cuda_device_count() == 0) {
    return refuse(
        fmt::format("--backend nccl needs a CUDA GPU per rank, but {}; use --backend gloo",
                    nanoddp::cuda_status()));
  }
  // Refused before any rank allocates: `-e 1T` passed every check and then failed in the
  // ranks, out of memory (an outside tester's). Each rank on this host holds two host buffers of
  // the largest size (the in-place one and out of place's send buffer).
  const auto memory_problem = [&](int ranks_here) -> std::string {
    const double need = 2.0 * static_cast<double>(max_bytes) * ranks_here;
    const double available = nanoddp::common::available_memory_bytes();
    if (available <= 0 || need <= available) return "";
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return fmt::format(
        "-e {}: {} rank(s) on this host each hold two buffers of the largest size, {:.1f} GiB "
        "in all, more than the {:.1f} GiB this machine has available (MemAvailable); give a "
        "smaller -e",
        opt.max_bytes, ranks_here, need / kGiB, available / kGiB);
  };
  if (opt.nproc > 0) {
    if (const std::string problem = memory_problem(opt.nproc); !problem.empty()) {
      return refuse(problem);
    }
    if (std::getenv("NANODDP_LAUNCHER_PID") != nullptr || std::getenv("RANK") != nullptr) {
      return refuse(
          "--nproc-per-node starts its own nanoddp-run jobs: run it without a launcher (or drop "
          "--nproc-per-node and --repeats under one)");
    }
    return nanoddp::bench_allreduce::run_launches(argc, argv, opt.nproc, opt.repeats,
                                                  opt.json_path);
  }
  if (opt.rounds == 0) opt.rounds = opt.vs_raw ? 5 : 1;

  const DType dtype = opt.dtype == "float" ? DType::kF32 : DType::kBF16;
  const std::size_t elem = nanoddp::dtype_size(dtype);
  const auto world_env = nanoddp::comm::world_from_env();
  nanoddp::check_allocator_environment();
  // The ranks on this host: as the launcher says. Started by hand without LOCAL_WORLD_SIZE, the
  // world's default puts every rank on one host, which would refuse a job spread over several:
  // this rank alone is counted then.
  const bool local_given = std::getenv("LOCAL_WORLD_SIZE") != nullptr ||
                           std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE") != nullptr;
  if (const std::string problem =
          memory_problem(local_given ? std::max(world_env.local_world_size, 1) : 1);
      !problem.empty()) {
    return refuse(problem);
  }
  const bool all_reduce = collective == Collective::kAllreduce;
  // reduce_scatter and allgather: the whole buffer is `ranks` blocks of equal size.
  const std::int64_t blocks = all_reduce ? 1 : std::max(world_env.world_size, 1);
  const std::int64_t unit = static_cast<std::int64_t>(elem) * blocks;
  // Whole elements (whole blocks), never above -e: a row is as large as asked or smaller.
  std::vector<std::int64_t> counts;
  std::int64_t rounded = 0, dropped = 0;  // asked sizes not shown as asked (said below)
  for (double bytes_d = static_cast<double>(min_bytes); bytes_d <= static_cast<double>(max_bytes);
       bytes_d *= opt.factor) {
    const auto asked = static_cast<std::int64_t>(bytes_d);
    const auto count = asked / unit * blocks;
    if (count >= 1 && (counts.empty() || counts.back() != count)) {
      counts.push_back(count);
      rounded += count * static_cast<std::int64_t>(elem) != asked;
    } else {
      ++dropped;
    }
  }
  // nccl-tests rounds the same way, silently; an outside tester read "-b 13" reported as 12 and
  // a 4-byte row missing on 3 ranks as bugs: say it once.
  if (world_env.rank == 0 && (rounded > 0 || dropped > 0)) {
    fmt::print(stderr,
               "nanoddp-bench-allreduce: note: sizes are whole {}{} ({} bytes): {} size(s) "
               "rounded down, {} skipped (smaller than that, or equal to the row before)\n",
               all_reduce ? "elements" : "elements per rank x ",
               all_reduce ? std::string() : std::to_string(blocks) + " ranks", unit, rounded,
               dropped);
  }
  if (counts.empty()) {
    return refuse(
        all_reduce
            ? fmt::format("-b {} -e {}: no size holds one {} element ({} bytes); give -e {} or "
                          "more",
                          opt.min_bytes, opt.max_bytes, opt.dtype, elem, elem)
            : fmt::format("-b {} -e {}: no size holds one {} element per rank ({} ranks: {} "
                          "bytes); give -e {} or more",
                          opt.min_bytes, opt.max_bytes, opt.dtype, blocks, unit, unit));
  }
  // The results file is opened (on rank 0) before the process group forms: a path that cannot
  // be written is a usage error now, not a failure after the connections are up.
  nanoddp::common::ResultsFile json("nanoddp-bench-allreduce", "--json");
  if (world_env.rank == 0 && !opt.json_path.empty()) {
    if (const std::string problem = json.open(opt.json_path); !problem.empty()) {
      return refuse(problem);
    }
  }
  nlohmann::ordered_json provenance = nanoddp::common::provenance(argc, argv);
  if (!opt.json_path.empty()) {
    std::error_code ec;
    provenance["json"] = std::filesystem::absolute(opt.json_path, ec).string();
  }
  const nlohmann::ordered_json machine = nanoddp::common::machine_info();
  const nlohmann::ordered_json build = nanoddp::common::build_info();

  Runner runner;
  runner.world = world_env;
  // A failure after joining: rank 0 does not hold the store up for peers that may be dead
  // (~Distributed), as nanoddp-train does; during the connections' set-up only briefly.
  struct AbandonOnFailure {
    Runner& runner;
    bool connected = false;
    int exceptions = std::uncaught_exceptions();
    ~AbandonOnFailure() {
      if (std::uncaught_exceptions() <= exceptions || !runner.dist) return;
      connected ? runner.dist->abandon() : runner.dist->abandon_setup();
    }
  } on_failure{runner};
  const std::string plan = fmt::format(
      "-b {} -e {} -f {} -n {} -w {} --rounds {} -c {} --op {} --dtype {} --collective {} "
      "--mode {}",
      min_bytes, max_bytes, opt.factor, opt.iters, opt.warmup, opt.rounds, opt.check, opt.op,
      opt.dtype, opt.collective,
      opt.raw      ? "raw"
      : opt.vs_raw ? "vs-raw"
                   : "process-group");
  // Checked as soon as every rank has checked in, before any other connection waits for a
  // rank that might be measuring something else (--raw against the process group included).
  const auto disagrees = [&](nanoddp::comm::Store& store) {
    const std::string problem = plan_mismatch(store, runner.rank(), runner.size(), plan);
    if (!problem.empty()) fmt::print(stderr, "nanoddp-bench-allreduce: error: {}\n", problem);
    return !problem.empty();  // bad input, after joining: nothing to tell (every rank finds it)
  };
  const auto timeout = nanoddp::comm::default_timeout();
  outcome.joining = true;
  if (opt.backend == "nccl") {
    // One GPU per local rank (modulo the visible devices), current before anything touches CUDA.
    runner.device =
        nanoddp::choose_device("cuda", runner.world.local_rank, nanoddp::cuda_device_count())
            .device;
    nanoddp::set_current_device(runner.device);
  }
  nanoddp::comm::DistributedOptions dopt;
  dopt.backend = opt.backend;
  dopt.device = runner.device;
  dopt.timeout = timeout;
  // Every mode joins the job (store, token, check-in) and compares plans before any
  // connection: --raw then connects Gloo itself through connect_gloo, the very function the
  // process group uses, so both modes talk over identically built connections, and a --raw
  // rank beside a process-group one is told of the difference at once rather than both waiting
  // out their timeouts in Gloo's connect.
  dopt.make_group = false;
  try {
    runner.dist.emplace(nanoddp::comm::init_distributed(runner.world, dopt));
    if (disagrees(*runner.dist->store)) return 2;
    if (!opt.raw) nanoddp::comm::create_group(*runner.dist, dopt);
  } catch (const std::exception& e) {
    // The set-up refused (another rank's refusal, another WORLD_SIZE, a RANK given twice):
    // bad input, exit 2, as nanoddp-train says it. A peer that died or did not answer is not.
    if (nanoddp::comm::is_communication_failure(e)) throw;
    fmt::print(stderr, "nanoddp-bench-allreduce: error: {}\n",
               nanoddp::nn::escape_controls(e.what(), true));
    return 2;
  }
  if (opt.raw) {
    nanoddp::comm::ProcessGroupOptions po;
    po.timeout = timeout;
    po.master_addr = runner.world.master_addr;
    auto connection =
        nanoddp::comm::connect_gloo(runner.dist->store, runner.rank(), runner.size(), po);
    runner.transport = connection.device_description;
    runner.raw.emplace(RawGloo{std::move(connection), timeout});
  } else {
    if (auto* gloo = dynamic_cast<nanoddp::comm::GlooProcessGroup*>(runner.dist->group.get())) {
      runner.transport = gloo->allreduce_transport();
    }
    if (opt.vs_raw) {
      // A second, bare connection through the same store, under its own key prefix: raw ops
      // never share sockets (or tags) with the process group's.
      nanoddp::comm::ProcessGroupOptions po;
      po.timeout = timeout;
      po.master_addr = runner.world.master_addr;
      po.name = "bench-raw";
      auto connection =
          nanoddp::comm::connect_gloo(runner.dist->store, runner.rank(), runner.size(), po);
      runner.raw_transport = connection.device_description;
      runner.raw.emplace(RawGloo{std::move(connection), timeout});
    }
  }

  on_failure.connected = true;

  const std::int64_t max_count = counts.back();
  // One buffer at the largest size, viewed for smaller ones (fresh memory is slow to touch), and
  // a send buffer for out of place.
  Tensor host = Tensor::empty({max_count}, nanoddp::Device::cpu(), dtype);
  Tensor buffer = runner.device.is_cuda() ? Tensor::empty({max_count}, runner.device, dtype) : host;
  Tensor send_host = Tensor::empty({max_count}, nanoddp::Device::cpu(), dtype);
  Tensor send =
      runner.device.is_cuda() ? Tensor::empty({max_count}, runner.device, dtype) : send_host;
  fill_for_check(host, buffer, runner.rank(), max_count);
  fill_for_check(send_host, send, runner.rank(), max_count);

  const std::string mode_text = opt.raw      ? "raw gloo::allreduce"
                                : opt.vs_raw ? "nanoddp ProcessGroup vs raw gloo::allreduce"
                                             : "nanoddp ProcessGroup";
  std::string algorithm;
  if (opt.backend == "gloo" && opt.raw) {
    algorithm =
        fmt::format("ring allreduce as used by gloo::allreduce; transport: Gloo's TCP ring ({})",
                    runner.transport);
  } else if (opt.backend == "gloo" && all_reduce) {
    // "shared memory (same host; ...)": copy in, each rank reduces 1/n, copy out (see
    // comm/shm_allreduce.cpp); "TCP ring (...)": nanoddp's (comm/tcp_ring.cpp); or
    // "Gloo's TCP ring (...)": gloo::allreduce.
    algorithm = fmt::format("process group allreduce; transport: {}", runner.transport);
  } else if (opt.backend == "gloo") {
    // comm/shm_collectives.cpp on one host; else comm/gloo_collectives.cpp: nanoddp's ring,
    // Gloo's, or in a hierarchical group its all-reduce, cut (reduce-scatter), and
    // gloo::allgather, flat (allgather).
    const bool shm = runner.transport.rfind("shared memory", 0) == 0;
    const bool own_ring = runner.transport.rfind("TCP ring", 0) == 0;
    const bool hier = runner.transport.rfind("hierarchical", 0) == 0;
    const bool scatter = collective == Collective::kReduceScatter;
    algorithm = fmt::format(
        "process group {}; transport: {}", opt.collective,
        shm || own_ring ? runner.transport
        : hier && scatter
            ? runner.transport + ": its all-reduce of the whole buffer, then each rank's block"
            : fmt::format("TCP ({}, flat)",
                          scatter ? "ring on Gloo's unbound buffers" : "gloo::allgather"));
  } else {
    const char* algo = std::getenv("NCCL_ALGO");
    const char* proto = std::getenv("NCCL_PROTO");
    algorithm = fmt::format(
        "NCCL_ALGO={} NCCL_PROTO={} (unset = NCCL picks per size: ring, "
        "tree, NVLS...)",
        algo != nullptr ? algo : "auto", proto != nullptr ? proto : "auto");
  }
  // --vs-raw: the raw side's own description (its JSON lines carry it).
  const std::string raw_algorithm =
      fmt::format("ring allreduce as used by gloo::allreduce; transport: Gloo's TCP ring ({})",
                  runner.raw_transport);
  const bool spread = opt.rounds > 1;  // min and max columns
  // Whatever a run records or prints passes redact(): a transport description or a command line
  // must not carry the store's token.
  algorithm = nanoddp::common::redact(algorithm);
  std::vector<std::string> warnings;
  if (opt.vs_raw && runner.transport.rfind("shared memory", 0) == 0) {
    warnings.push_back(
        "--vs-raw: the process group reduces through shared memory while raw Gloo runs its TCP "
        "ring, so busbw/raw compares two transports, not the engine's overhead; set "
        "NANODDP_SHM=0 NANODDP_TCP_RING=0 to compare the same TCP ring");
  } else if (opt.vs_raw && runner.transport.rfind("TCP ring", 0) == 0) {
    warnings.push_back(
        "--vs-raw: the process group all-reduces around nanoddp's TCP ring while raw Gloo runs "
        "Gloo's, so busbw/raw compares two rings, not the engine's overhead; set "
        "NANODDP_TCP_RING=0 to compare the same ring");
  }
  if (runner.rank() == 0) {
    fmt::print(
        "# nanoddp-bench-allreduce{}: backend {} via {}, {} ranks, {} iters x {} round{}, {} "
        "warm-up\n",
        all_reduce ? "" : " --collective " + opt.collective,
        runner.has_group() ? runner.dist->group->backend_name() : opt.backend, mode_text,
        runner.size(), opt.iters, opt.rounds, opt.rounds > 1 ? "s" : "", opt.warmup);
    fmt::print("# algorithm: {}\n", algorithm);
    if (opt.vs_raw) fmt::print("# raw: {} (in place)\n", raw_algorithm);
    fmt::print("# {}; {}\n", nanoddp::common::provenance_line(provenance),
               nanoddp::common::hostname());
    fmt::print("# time = wall time per op, averaged over the ranks{}; busbw = algbw * {}\n",
               spread ? ", median round" : "", all_reduce ? "2(n-1)/n" : "(n-1)/n");
    fmt::print(
        "# columns as nccl-tests' {}{}\n",
        all_reduce ? "all_reduce_perf (root -1: all-reduce has none)"
        : collective == Collective::kReduceScatter
            ? "reduce_scatter_perf (size: the whole input; count: elements per rank; root -1)"
            : "all_gather_perf (size: the whole output; count: elements per rank; root -1)",
        spread || opt.vs_raw ? "; after them: the fastest and slowest round per column set"
                               " (min, max), then --vs-raw's raw Gloo columns"
                             : "");
    for (const std::string& w : warnings) fmt::print("# warning: {}\n", w);
    if (!runner.has_group()) {
      fmt::print("# out of place: gloo::allreduce from a send buffer into a receive buffer\n");
    } else if (!all_reduce) {
      fmt::print(
          "# out of place: separate input and output; in place: the {} is this rank's "
          "block of the {}\n",
          collective == Collective::kReduceScatter ? "output" : "input",
          collective == Collective::kReduceScatter ? "input" : "output");
    } else {
      fmt::print(
          "# out of place: copy into the receive buffer, then the in-place op, one at a time\n");
    }
    // nccl-tests' layout, field for field (scripts written for all_reduce_perf split a row on
    // white space): size count type redop root, then time algbw busbw #wrong out of place and
    // in place; this benchmark's extra columns come after.
    fmt::print("# {:>10} {:>12} {:>8} {:>6} {:>7} {:^38} {:^38}\n", "", "", "", "", "",
               "out-of-place", "in-place");
    fmt::print("# {:>10} {:>12} {:>8} {:>6} {:>7}", "size", "count", "type", "redop", "root");
    for (int k = 0; k < 2; ++k) {
      fmt::print(" {:>10} {:>11} {:>11} {:>7}", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    if (spread) {
      fmt::print(" {:>8} {:>8} {:>8} {:>8}", "oop_min", "oop_max", "ip_min", "ip_max");
    }
    if (opt.vs_raw) {
      fmt::print(" {:>11} {:>11} {:>9} {:>10}", "raw(us)", "raw busbw", "busbw/raw", "raw #wrong");
    }
    fmt::print("\n");
  }

  // What one row measures: out of place and in place in the run's mode; --vs-raw adds raw Gloo
  // in place.
  struct Series {
    Mode mode;
    bool in_place;
  };
  std::vector<Series> series{{runner.default_mode(), false}, {runner.default_mode(), true}};
  if (opt.vs_raw) series.push_back({Mode::kRaw, true});
  const double n = runner.size();
  double busbw_sum = 0;
  int busbw_count = 0;
  std::int64_t wrong_total = 0;

  for (const std::int64_t count : counts) {
    const double load_start = nanoddp::common::load_1m();
    const std::int64_t bytes = count * static_cast<std::int64_t>(elem);
    Tensor view = buffer.view(0, {count});
    Tensor send_view = send.view(0, {count});
    const auto input_of = [&](const Series& x) { return x.in_place ? nullptr : &send_view; };
    // reduce_scatter and allgather: `count` is the whole buffer, `block` one rank's part of it;
    // in place, the block is this rank's part of `view` (nccl-tests' in-place offsets).
    const std::int64_t block = count / blocks;
    Tensor own_block, small_out, small_in;
    if (!all_reduce) {
      own_block = buffer.view(runner.rank() * block, {block});
      small_out = buffer.view(0, {block});
      small_in = send.view(0, {block});
    }
    const auto run_series = [&](const Series& x, int ops) {
      if (all_reduce) {
        runner.run_ops(x.mode, view, op, ops, input_of(x));
      } else if (collective == Collective::kReduceScatter) {
        runner.run_scatter_gather(collective, x.in_place ? view : send_view,
                                  x.in_place ? own_block : small_out, op, ops);
      } else {
        runner.run_scatter_gather(collective, x.in_place ? own_block : small_in, view, op, ops);
      }
    };
    // One op on fresh data: the elements that differ from their closed form (this rank's).
    const auto check_scatter_gather = [&](const Series& x) {
      Tensor host_view = host.view(0, {count});
      Tensor send_host_view = send_host.view(0, {count});
      const bool rs = collective == Collective::kReduceScatter;
      const std::int64_t inputs = rs ? count : block;
      Tensor& in_host = x.in_place ? host_view : send_host_view;
      const std::int64_t in_at = x.in_place && !rs ? runner.rank() * block : 0;
      for (std::int64_t i = 0; i < count; ++i) set_value(host_view, i, -1.0f);
      for (std::int64_t i = 0; i < inputs; ++i) {
        set_value(in_host, in_at + i, fill_value(runner.rank(), i));
      }
      if (!view.is_same(host_view)) view.copy_from(host_view);
      if (!x.in_place && !send_view.is_same(send_host_view)) send_view.copy_from(send_host_view);
      run_series(x, 1);
      if (!view.is_same(host_view)) host_view.copy_from(view);
      const std::int64_t outputs = rs ? block : count;
      const std::int64_t out_at = rs && x.in_place ? runner.rank() * block : 0;
      const float tolerance = dtype == DType::kF32 ? 1e-5f : 1e-2f;
      std::int64_t bad = 0;
      for (std::int64_t j = 0; j < outputs; ++j) {
        const float expected =
            scatter_gather_expected(collective, op, runner.rank(), runner.size(), block, j);
        const float actual = get_value(host_view, out_at + j);
        if (!(std::fabs(actual - expected) <= tolerance * std::max(1.0f, std::fabs(expected)))) {
          ++bad;
        }
      }
      return bad;
    };

    // This rank's per-op time in every round, per series.
    std::vector<std::vector<double>> round_seconds(series.size());
    for (const Series& x : series) run_series(x, opt.warmup);
    for (int round = 0; round < opt.rounds; ++round) {
      // Rotate which series goes first, so none always runs right after another.
      for (std::size_t k = 0; k < series.size(); ++k) {
        const std::size_t m = (k + static_cast<std::size_t>(round)) % series.size();
        runner.barrier();
        const auto start = Clock::now();
        run_series(series[m], opt.iters);
        round_seconds[m].push_back(std::chrono::duration<double>(Clock::now() - start).count() /
                                   opt.iters);
      }
    }
    // Averaged over the ranks, round by round (in microseconds: float precision suffices).
    std::vector<double> flat;
    for (const auto& rounds : round_seconds) {
      for (double t : rounds) flat.push_back(t * 1e6);
    }
    const std::vector<double> mean_us = runner.mean_across(flat);
    std::vector<std::vector<double>> rounds_us(series.size());
    for (std::size_t m = 0, i = 0; m < series.size(); ++m) {
      for (int r = 0; r < opt.rounds; ++r) rounds_us[m].push_back(mean_us[i++]);
    }

    // -c 1: each series also gets one op on fresh data, checked element by element.
    std::vector<std::int64_t> wrong(series.size(), -1);
    if (opt.check != 0) {
      for (std::size_t m = 0; m < series.size(); ++m) {
        if (!all_reduce) {
          wrong[m] = runner.sum_across(check_scatter_gather(series[m]));
          wrong_total += std::max<std::int64_t>(wrong[m], 0);
          continue;
        }
        Tensor host_view = host.view(0, {count});
        if (series[m].in_place) {
          fill_for_check(host_view, view, runner.rank(), count);
        } else {
          // The receive buffer starts with other values: the result must overwrite them all.
          for (std::int64_t i = 0; i < count; ++i) {
            if (host_view.dtype() == DType::kF32) {
              host_view.data()[i] = -1.0f;
            } else {
              static_cast<std::uint16_t*>(host_view.raw_data())[i] = float_to_bf16(-1.0f);
            }
          }
          if (!view.is_same(host_view)) view.copy_from(host_view);
        }
        runner.run_ops(series[m].mode, view, op, 1, input_of(series[m]));
        if (!view.is_same(host_view)) host_view.copy_from(view);
        wrong[m] = runner.sum_across(count_wrong(host_view, op, runner.size(), count));
        wrong_total += std::max<std::int64_t>(wrong[m], 0);
      }
    }
    if (runner.rank() == 0) {
      const auto bw = [&](double us) {
        const double algbw = static_cast<double>(bytes) / us / 1e3;
        return std::pair{algbw, algbw * (all_reduce ? 2.0 : 1.0) * (n - 1) / n};
      };
      const auto wrong_text = [&](std::size_t m) {
        return wrong[m] < 0 ? std::string("N/A") : std::to_string(wrong[m]);
      };
      // nccl-tests: count is per rank for reduce_scatter and allgather; allgather has no redop.
      const std::string redop = collective == Collective::kAllgather ? "none" : opt.op;
      const std::int64_t count_column = all_reduce ? count : block;
      fmt::print("  {:>10} {:>12} {:>8} {:>6} {:>7}", bytes, count_column, opt.dtype, redop, -1);
      for (std::size_t m = 0; m < 2; ++m) {
        const double us = nanoddp::common::median(rounds_us[m]);
        const auto [algbw, busbw] = bw(us);
        fmt::print(" {:>10.1f} {:>11.3f} {:>11.3f} {:>7}", us, algbw, busbw, wrong_text(m));
        busbw_sum += busbw;
        ++busbw_count;
      }
      if (spread) {
        for (std::size_t m = 0; m < 2; ++m) {
          fmt::print(" {:>8.1f} {:>8.1f}",
                     *std::min_element(rounds_us[m].begin(), rounds_us[m].end()),
                     *std::max_element(rounds_us[m].begin(), rounds_us[m].end()));
        }
      }
      if (opt.vs_raw) {
        // Same bytes, same ranks: the busbw ratio is the inverse time ratio (in place, both).
        const double us = nanoddp::common::median(rounds_us[2]);
        const double engine_us = nanoddp::common::median(rounds_us[1]);
        fmt::print(" {:>11.1f} {:>11.3f} {:>8.0f}% {:>10}", us, bw(us).second,
                   100.0 * us / engine_us, wrong_text(2));
      }
      fmt::print("\n");
      if (json.is_open()) {
        // The load around this size, as bench-ddp records it around a point (common/load.h):
        // this node's ranks count in the load at the end.
        const double load_end = nanoddp::common::load_1m();
        std::vector<std::string> line_warnings = warnings;
        if (const auto w =
                nanoddp::common::load_warning(load_start, load_end, machine["cores"].get<int>(),
                                              runner.world.local_world_size, "this size")) {
          line_warnings.push_back(*w);
        }
        // One line per series (out of place, in place; --vs-raw: then raw's in place).
        for (std::size_t m = 0; m < series.size(); ++m) {
          const double us = nanoddp::common::median(rounds_us[m]);
          const auto [algbw, busbw] = bw(us);
          nlohmann::ordered_json line = {
              {"benchmark", opt.collective},
              {"backend", opt.backend},
              {"mode", series[m].mode == Mode::kRaw ? "raw" : "nanoddp"},
              {"placement", series[m].in_place ? "in-place" : "out-of-place"},
              {"ranks", runner.size()},
              {"bytes", bytes},
              {"count", count_column},
              {"dtype", opt.dtype},
              {"op", redop},
              {"time_us", us},
              {"time_us_min", *std::min_element(rounds_us[m].begin(), rounds_us[m].end())},
              {"time_us_max", *std::max_element(rounds_us[m].begin(), rounds_us[m].end())},
              {"round_time_us", rounds_us[m]},
              {"time", "wall time per op, mean over ranks, median over rounds"},
              {"algbw_gbps", algbw},
              {"busbw_gbps", busbw},
              {"rounds", opt.rounds},
              {"iters", opt.iters},
              {"warmup", opt.warmup},
              {"wrong", wrong[m]},
              {"algorithm", series[m].mode == Mode::kRaw && opt.vs_raw ? raw_algorithm : algorithm},
              {"load_average_1m", {load_start, load_end}},
              {"warnings", line_warnings},
              {"machine", machine},
              {"build", build},
              {"provenance", provenance}};
          nanoddp::common::redact_strings(line);
          json.write_line(line.dump());
        }
        if (!json.flush()) return 1;
      }
    }
    std::fflush(stdout);
  }
  if (runner.rank() == 0) {
    fmt::print("# Out of bounds values : {} {}\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    fmt::print("# Avg bus bandwidth    : {:.6g}\n",
               busbw_count > 0 ? busbw_sum / busbw_count : 0.0);
    fmt::print("#\n");
  }
  return json.close() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Outcome outcome;
  int code = 0;
  try {
    code = run(argc, argv, outcome);
  } catch (const std::exception& e) {
    // Escaped: a message may quote a file's text (nn::escape_controls).
    fmt::print(stderr, "nanoddp-bench-allreduce: error: {}\n",
               nanoddp::nn::escape_controls(e.what(), true));
    // Before this rank joined it is bad input (a RANK outside the world, a NANODDP_TIMEOUT_S it
    // cannot read): exit 2, which a launcher does not restart. After, it is a failure (exit 1).
    code = outcome.joining ? 1 : 2;
    if (!outcome.joining) outcome.refusal = e.what();
  }
  // A refusal before this rank joined: a job started by hand (no launcher to stop the others)
  // is told through its store, or the others would wait their whole timeout for this rank
  // (reliability.md, row 12c).
  if (code == 2 && !outcome.joining) {
    std::fflush(stderr);
    nanoddp::comm::tell_peers_setup_failed(outcome.refusal.empty()
                                               ? "its command line was refused (see its output)"
                                               : outcome.refusal);
  }
  return code;
}
