#include "options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <stdexcept>

#include "common/cli.h"
#include "common/machine_info.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/device.h"

namespace nanoddp::bench_ddp {

const char* scaling_name(Scaling scaling) {
  return scaling == Scaling::kWeak ? "weak" : "strong";
}

namespace {

// A usage error: the message names the flag; main turns it into exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void usage_error(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

std::vector<std::string> split(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  if (const std::string problem = cli::split_list(flag, text, items); !problem.empty()) {
    usage_error("{}", problem);
  }
  return items;
}

std::int64_t parse_int(const std::string& flag, const std::string& item, std::int64_t lo,
                       std::int64_t hi) {
  // Each element as a single-valued flag is read (common/cli.h): decimal, no leading zero, so
  // "--hidden 010" is refused here as in nanoddp-sim, never 10 in one tool and 8 in another.
  std::int64_t value = 0;
  if (const std::string problem = cli::detail::read_integer(item, value); !problem.empty()) {
    usage_error("{}: {}", flag, problem);
  }
  if (value < lo || value > hi) usage_error("{}: {} is out of range [{}, {}]", flag, value, lo, hi);
  return value;
}

double parse_positive(const std::string& flag, const std::string& item) {
  if (const std::string problem = cli::detail::check_finite(item); !problem.empty()) {
    usage_error("{}: {}", flag, problem);
  }
  const double value = std::strtod(item.c_str(), nullptr);
  if (!(value > 0) || !std::isfinite(value) || value > 1e6) {
    usage_error("{}: {} must be > 0 (MiB, at most 1e6)", flag, item);
  }
  return value;
}

std::string parse_choice(const std::string& flag, const std::string& item,
                         const std::vector<std::string>& choices) {
  for (const std::string& c : choices) {
    if (item == c) return item;
  }
  usage_error("{}: '{}' is not one of {}", flag, item, fmt::join(choices, ", "));
}

template <typename T, typename Parse>
std::vector<T> parse_list(const std::string& flag, const std::string& text, Parse parse) {
  std::vector<T> values;
  for (const std::string& item : split(flag, text)) values.push_back(parse(item));
  return values;
}

// Keeps each value's first occurrence; a value given twice is measured once, and said so.
template <typename T>
void deduplicate(const std::string& flag, const std::string& text, std::vector<T>& values,
                 std::vector<std::string>& notes) {
  if (std::string note = cli::deduplicate(flag, text, values); !note.empty()) {
    notes.push_back(std::move(note));
  }
}

struct ListFlags {
  std::string world, hidden, layers, in, out, activation, batch, bucket_cap_mb, first_bucket_mb,
      overlap, optimizer_in_backward, comm_hook, zero, zero_overlap_gather, threads;
};

void convert_lists(const ListFlags& f, Options& o) {
  using I = std::int64_t;
  const auto ints = [](const std::string& flag, const std::string& text, I lo, I hi) {
    return parse_list<I>(flag, text,
                         [&](const std::string& s) { return parse_int(flag, s, lo, hi); });
  };
  if (!f.world.empty()) {
    o.world.clear();
    for (I w : ints("--world", f.world, 1, 4096)) o.world.push_back(static_cast<int>(w));
  }
  if (!f.hidden.empty()) o.hidden = ints("--hidden", f.hidden, 1, I{1} << 20);
  if (!f.layers.empty()) o.layers = ints("--layers", f.layers, 0, 1000);
  if (!f.in.empty()) o.in = ints("--in", f.in, 1, I{1} << 20);
  if (!f.out.empty()) o.out = ints("--out", f.out, 1, I{1} << 20);
  if (!f.batch.empty()) o.batch = ints("--batch", f.batch, 1, I{1} << 24);
  if (!f.threads.empty()) {
    o.threads.clear();
    for (I t : ints("--threads", f.threads, 1, 1024)) o.threads.push_back(static_cast<int>(t));
  }
  if (!f.zero.empty()) {
    o.zero.clear();
    for (I z : ints("--zero", f.zero, 0, 2)) o.zero.push_back(static_cast<int>(z));
  }
  if (!f.activation.empty()) {
    o.activation = parse_list<std::string>("--activation", f.activation, [](const std::string& s) {
      return parse_choice("--activation", s, {"relu", "gelu"});
    });
  }
  if (!f.comm_hook.empty()) {
    o.comm_hook = parse_list<std::string>("--comm-hook", f.comm_hook, [](const std::string& s) {
      return parse_choice("--comm-hook", s, {"allreduce", "bf16"});
    });
  }
  if (!f.overlap.empty()) {
    o.overlap = parse_list<bool>("--overlap", f.overlap, [](const std::string& s) {
      return parse_choice("--overlap", s, {"on", "off"}) == "on";
    });
  }
  if (!f.optimizer_in_backward.empty()) {
    o.optimizer_in_backward = parse_list<bool>(
        "--optimizer-in-backward", f.optimizer_in_backward, [](const std::string& s) {
          return parse_choice("--optimizer-in-backward", s, {"on", "off"}) == "on";
        });
  }
  if (!f.zero_overlap_gather.empty()) {
    o.zero_overlap_gather =
        parse_list<bool>("--zero-overlap-gather", f.zero_overlap_gather, [](const std::string& s) {
          return parse_choice("--zero-overlap-gather", s, {"on", "off"}) == "on";
        });
  }
  if (!f.bucket_cap_mb.empty()) {
    o.bucket_cap_mb = parse_list<double>(
        "--bucket-cap-mb", f.bucket_cap_mb,
        [](const std::string& s) { return parse_positive("--bucket-cap-mb", s); });
  }
  if (!f.first_bucket_mb.empty()) {
    o.first_bucket_mb = parse_list<double>(
        "--first-bucket-mb", f.first_bucket_mb,
        [](const std::string& s) { return parse_positive("--first-bucket-mb", s); });
  }
  deduplicate("--world", f.world, o.world, o.notes);
  deduplicate("--hidden", f.hidden, o.hidden, o.notes);
  deduplicate("--layers", f.layers, o.layers, o.notes);
  deduplicate("--in", f.in, o.in, o.notes);
  deduplicate("--out", f.out, o.out, o.notes);
  deduplicate("--batch", f.batch, o.batch, o.notes);
  deduplicate("--threads", f.threads, o.threads, o.notes);
  deduplicate("--zero", f.zero, o.zero, o.notes);
  deduplicate("--activation", f.activation, o.activation, o.notes);
  deduplicate("--comm-hook", f.comm_hook, o.comm_hook, o.notes);
  deduplicate("--bucket-cap-mb", f.bucket_cap_mb, o.bucket_cap_mb, o.notes);
  deduplicate("--first-bucket-mb", f.first_bucket_mb, o.first_bucket_mb, o.notes);
  deduplicate("--overlap", f.overlap, o.overlap, o.notes);
  deduplicate("--optimizer-in-backward", f.optimizer_in_backward, o.optimizer_in_backward, o.notes);
  deduplicate("--zero-overlap-gather", f.zero_overlap_gather, o.zero_overlap_gather, o.notes);
}

// One rank alone is the plain 1-process baseline (no DDP, nothing to shard): a ZeRO stage
// asked at --world 1 is not measured there, which the note (and the baseline's record) says.
void note_zero_at_world_1(Options& o) {
  const bool any_zero = std::any_of(o.zero.begin(), o.zero.end(), [](int z) { return z > 0; });
  if (any_zero && o.nnodes == 1 && !o.worker &&
      std::find(o.world.begin(), o.world.end(), 1) != o.world.end()) {
    o.notes.push_back(fmt::format(
        "--zero {} at --world 1: one rank has no DDP and nothing to shard, so the 1-rank point is "
        "the plain 1-process baseline (recorded with zero_stage 0), shared by every stage; ZeRO "
        "stages are measured at --world 2 and up",
        fmt::join(o.zero, ",")));
    o.zero_at_world_1_note = o.notes.back();
  }
}

// Checks between flags (what one flag's validator cannot see).
void check_relations(const Options& o) {
  // (A worker finds the master through the launcher's variables.)
  if (!o.worker && o.nnodes > 1 && (o.master_addr.empty() || o.master_port == 0)) {
    usage_error(
        "--nnodes {}: several nodes need --master-addr and --master-port (node 0's "
        "address and a port free there), the same on every node",
        o.nnodes);
  }
  if (o.node_rank >= o.nnodes) {
    usage_error("--node-rank {} is not below --nnodes {}", o.node_rank, o.nnodes);
  }
  if (o.backend == "nccl" && o.device == "cpu") {
    usage_error(
        "--backend nccl needs --device cuda (NCCL reduces GPU tensors; use gloo on the "
        "CPU)");
  }
  if (o.backend == "gloo" && o.device == "cuda") {
    usage_error("--backend gloo reduces CPU tensors: with --device cuda use nccl (or auto)");
  }
  if (o.device == "cuda") {
    try {
      require_device(Device::cuda(0));
    } catch (const std::exception& e) {
      usage_error("--device cuda: {}", e.what());
    }
  }
  if (o.scaling == Scaling::kStrong) {
    for (const std::int64_t batch : o.batch) {
      for (const int w : o.world) {
        const std::int64_t ranks = static_cast<std::int64_t>(w) * o.nnodes;
        if (batch % ranks != 0) {
          usage_error(
              "--batch {} with --scaling strong: the global batch {} does not divide "
              "evenly over {} ranks (--world {} x --nnodes {}); give a --batch that "
              "every world size divides",
              batch, batch, ranks, w, o.nnodes);
        }
      }
    }
  }
  // Points whose model cannot fit in this machine's memory: refused before any job runs, as
  // nanoddp-bench-gemm does (an outside tester's --hidden 65536 ran a point that needed twice
  // the memory until its timeout). Per rank: the parameters, their gradients and AdamW's two
  // moments, and each layer's activation and its gradient; the node holds --world ranks.
  if (!o.worker) {
    const double available = nanoddp::common::available_memory_bytes();
    for (const std::int64_t hidden : o.hidden) {
      for (const std::int64_t layers : o.layers) {
        for (const std::int64_t batch : o.batch) {
          for (const int w : o.world) {
            const double h = double(hidden);
            const double in =
                o.in.empty() ? h : double(*std::max_element(o.in.begin(), o.in.end()));
            const double out =
                o.out.empty() ? h : double(*std::max_element(o.out.begin(), o.out.end()));
            const double linears = double(std::max<std::int64_t>(layers, 1));
            const double params = in * h + double(std::max<std::int64_t>(layers - 1, 0)) * h * h +
                                  h * out + linears * h + out;
            const double per_rank = 4.0 * (4.0 * params + 2.0 * double(batch) * h * (linears + 1));
            const double need = per_rank * double(w);
            if (available > 0 && need > available) {
              const double gib = 1024.0 * 1024.0 * 1024.0;
              usage_error(
                  "--hidden {} --layers {} --batch {} at --world {}: the parameters, gradients, "
                  "optimizer state and activations need about {:.1f} GiB ({:.1f} GiB per rank), "
                  "more than the {:.1f} GiB this machine has available (MemAvailable); give a "
                  "smaller model",
                  hidden, layers, batch, w, need / gib, per_rank / gib, available / gib);
            }
          }
        }
      }
    }
  }
  // What the library refuses (Reducer::set_bucket_reduced_hook under ZeRO), said before any job
  // runs instead of as a failed point: under ZeRO each rank updates its shard after backward
  // and the ranks then all-gather the parameters, so there is no per-bucket update to fuse.
  const bool any_zero = std::any_of(o.zero.begin(), o.zero.end(), [](int z) { return z > 0; });
  const bool any_in_backward = std::any_of(o.optimizer_in_backward.begin(),
                                           o.optimizer_in_backward.end(), [](bool b) { return b; });
  if (any_zero && any_in_backward) {
    usage_error(
        "--zero {} cannot be combined with --optimizer-in-backward on: under ZeRO each rank "
        "updates its shard after backward and the ranks then all-gather the parameters; sweep "
        "them in two runs (--zero 0 with --optimizer-in-backward on,off)",
        fmt::join(o.zero, ","));
  }
  const bool any_gather_overlap = std::any_of(
      o.zero_overlap_gather.begin(), o.zero_overlap_gather.end(), [](bool b) { return b; });
  if (any_gather_overlap && !any_zero) {
    usage_error(
        "--zero-overlap-gather on overlaps ZeRO's parameter all-gather with the next forward: it "
        "needs --zero 1 or 2 (a --zero 0 point of a sweep with both runs without it)");
  }
  if (o.worker) {
    if (o.result_path.empty()) usage_error("--worker needs --result FILE");
    const std::vector<std::pair<const char*, std::size_t>> sizes = {
        {"--world", o.world.size()},
        {"--hidden", o.hidden.size()},
        {"--layers", o.layers.size()},
        {"--in", o.in.size()},
        {"--out", o.out.size()},
        {"--activation", o.activation.size()},
        {"--batch", o.batch.size()},
        {"--bucket-cap-mb", o.bucket_cap_mb.size()},
        {"--first-bucket-mb", o.first_bucket_mb.size()},
        {"--overlap", o.overlap.size()},
        {"--optimizer-in-backward", o.optimizer_in_backward.size()},
        {"--comm-hook", o.comm_hook.size()},
        {"--zero", o.zero.size()},
        {"--zero-overlap-gather", o.zero_overlap_gather.size()},
        {"--threads", o.threads.size()}};
    for (const auto& [flag, n] : sizes) {
      if (n != 1) usage_error("--worker runs one point, but {} has {} values", flag, n);
    }
  }
}

}  // namespace

std::optional<Options> parse_options(int argc, const char* const* argv, int& exit_code) {
  Options o;
  ListFlags lists;
  std::string scaling = "weak";
  CLI::App app{
      "nanoddp-bench-ddp: the DDP training step as a benchmark, swept like a scaling study.\n"
      "Runs every combination of the list flags (comma-separated) as a DDP job under "
      "nanoddp-run,\nplus the 1-rank run of each configuration as the scaling-efficiency "
      "baseline; prints a table\nand, with --json, one JSON line per point."};
  app.get_formatter()->column_width(30);
  const auto list_option = [&app](const std::string& name, std::string& target,
                                  const std::string& help) {
    return app.add_option(name, target, help)->type_name("LIST");
  };

  list_option("--world", lists.world, "processes per node (list; default 1,2)");
  app.add_option("--nnodes", o.nnodes, "nodes (run the same command on each)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--node-rank", o.node_rank, "this node's index")
      ->check(CLI::Range(0, 4095))
      ->capture_default_str();
  app.add_option("--master-addr", o.master_addr, "node 0's address (several nodes)");
  app.add_option("--master-port", o.master_port, "the rendezvous port (several nodes)")
      ->check(CLI::Range(1, 65535));
  list_option("--hidden", lists.hidden, "hidden width (list; default 1024)");
  list_option("--layers", lists.layers, "hidden layers L: L+1 Linear modules (list; default 3)");
  list_option("--in", lists.in, "input features (list; default: the hidden width)");
  list_option("--out", lists.out, "output features (list; default: the hidden width)");
  list_option("--activation", lists.activation, "relu or gelu (list; default relu)");
  list_option("--batch", lists.batch,
              "samples per step: per rank with --scaling weak, global with strong (list; "
              "default 64)");
  app.add_option("--scaling", scaling, "weak (fixed batch per rank) or strong (fixed global batch)")
      ->check(CLI::IsMember({"weak", "strong"}))
      ->capture_default_str();
  list_option("--bucket-cap-mb", lists.bucket_cap_mb, "DDP bucket cap in MiB (list; default 25)");
  list_option("--first-bucket-mb", lists.first_bucket_mb,
              "cap of the first bucket in MiB (list; default 1)");
  list_option("--overlap", lists.overlap,
              "on: reduce buckets during backward; off: after it (list; default on)");
  list_option("--optimizer-in-backward", lists.optimizer_in_backward,
              "on: update each bucket's parameters as its all-reduce completes; off: one "
              "optimizer step after backward (list; default off)");
  list_option("--comm-hook", lists.comm_hook, "allreduce (float32) or bf16 (list)");
  list_option("--zero", lists.zero,
              "ZeRO stage: 0 plain DDP, 1 optimizer state sharded over the ranks, 2 the "
              "averaged gradients too (list; default 0)");
  list_option("--zero-overlap-gather", lists.zero_overlap_gather,
              "on: ZeRO's parameter all-gathers run during the next forward, each waited for "
              "before the first layer that reads it; off: after the step (list; default off)");
  list_option("--threads", lists.threads, "GEMM threads per rank (list; default 1)");
  app.add_option("--backend", o.backend, "gloo, nccl or auto (by device)")
      ->check(CLI::IsMember({"auto", "gloo", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda (each rank uses cuda:LOCAL_RANK)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "measured steps per point")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "steps run before the measured ones")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "seconds one point's job may take before it is stopped")
      ->check(CLI::Range(1.0, 1e7))
      ->capture_default_str();
  app.add_option("--repeats", o.repeats,
                 "launch every point (and every baseline) N times: the spread between launches "
                 "is reported beside the steps' (p10/p90, a bootstrap CI of the median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--json", o.json_path, "write one JSON line per point to FILE (truncated)")
      ->check(cli::non_empty_path());
  app.add_option("--csv", o.csv_path, "write one CSV row per point to FILE (truncated)")
      ->check(cli::non_empty_path());
  app.add_flag("--quiet", o.quiet, "print nothing but errors");
  // The worker role: started by the driver through nanoddp-run, one point per job.
  app.add_flag("--worker", o.worker)->group("");
  app.add_flag("--plain", o.plain)->group("");
  app.add_option("--result", o.result_path)->group("");

  if (const std::optional<int> code = cli::parse(app, argc, argv, "nanoddp-bench-ddp")) {
    exit_code = *code;
    return std::nullopt;
  }
  try {
    // A list flag given with nothing ("--world ''") is a mistake, not a request for the default.
    for (const auto& [flag, text] : std::vector<std::pair<const char*, const std::string*>>{
             {"--world", &lists.world},
             {"--hidden", &lists.hidden},
             {"--layers", &lists.layers},
             {"--in", &lists.in},
             {"--out", &lists.out},
             {"--activation", &lists.activation},
             {"--batch", &lists.batch},
             {"--bucket-cap-mb", &lists.bucket_cap_mb},
             {"--first-bucket-mb", &lists.first_bucket_mb},
             {"--overlap", &lists.overlap},
             {"--optimizer-in-backward", &lists.optimizer_in_backward},
             {"--comm-hook", &lists.comm_hook},
             {"--zero", &lists.zero},
             {"--zero-overlap-gather", &lists.zero_overlap_gather},
             {"--threads", &lists.threads}}) {
      if (app.count(flag) > 0 && text->empty()) {
        usage_error(
            "{} '': an empty list (expected e.g. {} 1,2,4; leave the flag out for its "
            "default)",
            flag, flag);
      }
    }
    o.scaling = scaling == "strong" ? Scaling::kStrong : Scaling::kWeak;
    convert_lists(lists, o);
    check_relations(o);
    note_zero_at_world_1(o);
  } catch (const UsageError& e) {
    exit_code = cli::usage_error("nanoddp-bench-ddp", e.what());
    return std::nullopt;
  }
  exit_code = 0;
  return o;
}

}  // namespace nanoddp::bench_ddp
