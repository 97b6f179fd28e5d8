#include "driver.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/cli.h"
#include "common/load.h"
#include "common/machine_info.h"
#include "common/output_files.h"
#include "common/provenance.h"
#include "common/results_file.h"
#include "common/stats.h"
#include "launch.h"
#include "nanoddp/kernels/error.h"
#include "table.h"

namespace nanoddp::bench_ddp {

namespace {

namespace fs = std::filesystem;

// One point of the sweep: the value of each list flag (world = processes per node).
struct Point {
  int world = 1;
  std::int64_t hidden = 0, layers = 0, batch = 0;
  std::int64_t in = 0, out = 0;
  std::string activation;
  double bucket_cap_mb = 0, first_bucket_mb = 0;
  bool overlap = true;
  bool optimizer_in_backward = false;
  std::string comm_hook;
  int zero = 0;
  bool zero_overlap_gather = false;
  int threads = 1;
};

// The cartesian product, the world size varying fastest so that a configuration's world sizes
// follow one another in the table.
std::vector<Point> expand(const Options& o) {
  std::vector<Point> points;
  // No --in / --out: the hidden width (0 here, resolved per point).
  const std::vector<std::int64_t> ins = o.in.empty() ? std::vector<std::int64_t>{0} : o.in;
  const std::vector<std::int64_t> outs = o.out.empty() ? std::vector<std::int64_t>{0} : o.out;
  for (const auto hidden : o.hidden)
    for (const auto layers : o.layers)
      for (const auto in : ins)
        for (const auto out : outs)
          for (const auto& activation : o.activation)
            for (const auto batch : o.batch)
              for (const auto bucket : o.bucket_cap_mb)
                for (const auto first : o.first_bucket_mb)
                  for (const bool overlap : o.overlap)
                    for (const bool in_backward : o.optimizer_in_backward)
                      for (const auto& hook : o.comm_hook)
                        for (const int zero : o.zero)
                          for (const bool gather : o.zero_overlap_gather)
                            for (const int threads : o.threads)
                              for (const int world : o.world)
                                // No ZeRO, no parameter all-gather to overlap: a --zero 0 point
                                // runs once, off, whatever the list (with "on" alone it was
                                // dropped without a word).
                                if (zero > 0 || gather == o.zero_overlap_gather.front())
                                  points.push_back(Point{.world = world,
                                                         .hidden = hidden,
                                                         .layers = layers,
                                                         .batch = batch,
                                                         .in = in == 0 ? hidden : in,
                                                         .out = out == 0 ? hidden : out,
                                                         .activation = activation,
                                                         .bucket_cap_mb = bucket,
                                                         .first_bucket_mb = first,
                                                         .overlap = overlap,
                                                         .optimizer_in_backward = in_backward,
                                                         .comm_hook = hook,
                                                         .zero = zero,
                                                         .zero_overlap_gather = zero > 0 && gather,
                                                         .threads = threads});
  return points;
}

// The point's flags, without the world size: also the key of its 1-rank baseline.
std::vector<std::string> config_flags(const Options& o, const Point& p) {
  std::vector<std::string> f = {
      "--hidden", std::to_string(p.hidden), "--layers", std::to_string(p.layers),
      "--in",     std::to_string(p.in),     "--out",    std::to_string(p.out)};
  f.insert(f.end(), {"--activation",
                     p.activation,
                     "--batch",
                     std::to_string(p.batch),
                     "--scaling",
                     scaling_name(o.scaling),
                     "--bucket-cap-mb",
                     fmt::format("{}", p.bucket_cap_mb),
                     "--first-bucket-mb",
                     fmt::format("{}", p.first_bucket_mb),
                     "--overlap",
                     p.overlap ? "on" : "off",
                     "--optimizer-in-backward",
                     p.optimizer_in_backward ? "on" : "off",
                     "--comm-hook",
                     p.comm_hook,
                     "--zero",
                     std::to_string(p.zero),
                     "--zero-overlap-gather",
                     p.zero_overlap_gather ? "on" : "off",
                     "--threads",
                     std::to_string(p.threads),
                     "--backend",
                     o.backend,
                     "--device",
                     o.device,
                     "--steps",
                     std::to_string(o.steps),
                     "--warmup",
                     std::to_string(o.warmup)});
  return f;
}

// The baseline's flags: what a plain 1-process run depends on (no DDP: no buckets, overlap, hook,
// optimizer-in-backward or ZeRO stage), so every configuration sharing the model and batch shares
// it.
std::vector<std::string> baseline_flags(const Options& o, const Point& p) {
  return {"--hidden",     std::to_string(p.hidden),
          "--layers",     std::to_string(p.layers),
          "--in",         std::to_string(p.in),
          "--out",        std::to_string(p.out),
          "--activation", p.activation,
          "--batch",      std::to_string(p.batch),
          "--scaling",    scaling_name(o.scaling),
          "--threads",    std::to_string(p.threads),
          "--backend",    o.backend,
          "--device",     o.device,
          "--steps",      std::to_string(o.steps),
          "--warmup",     std::to_string(o.warmup)};
}

// A list of numbers as JSON.
nlohmann::ordered_json numbers(const std::vector<double>& v) {
  return nlohmann::ordered_json(v);
}

// Fewer launches than this and no confidence interval over launches is reported: below it a
// percentile bootstrap's 95 % interval of their median is exactly their min and max, which reads
// as an interval but is only the range (common::min_values_for_median_ci: 6; with 5 launches the
// resampled median is the fastest launch 5.8 % of the time, more than the 2.5 % tail).
const std::size_t kMinLaunchesForCi = common::min_values_for_median_ci(0.95);

// One record from the records of `repeats` separate launches of a point: the launch with the
// median step time (the lower middle one) gives the breakdown (its median step's parts, which
// add up), every launch's steps pooled give the median, p10 and p90. Two intervals, each with
// one meaning whatever --repeats is: step_ms_ci95_steps bootstraps the median over the pooled
// steps (it sees step-to-step noise only), step_ms_ci95_launches over the launches' medians
// (launch-to-launch spread, the larger one on a shared machine), null below kMinLaunchesForCi.
nlohmann::ordered_json combine_repeats(const std::vector<nlohmann::ordered_json>& runs) {
  std::vector<double> medians, pooled, samples_per_s;
  for (const auto& r : runs) {
    medians.push_back(r["step_ms_median"].get<double>());
    samples_per_s.push_back(r["samples_per_s"].get<double>());
    for (const auto& v : r["samples"]["step_ms"]) pooled.push_back(v.get<double>());
  }
  std::vector<std::size_t> order(runs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return medians[a] < medians[b]; });
  nlohmann::ordered_json out = runs[order[(runs.size() - 1) / 2]];
  const double median = common::median(pooled);
  const double scale = median > 0 ? out["step_ms_median"].get<double>() / median : 1.0;
  out["repeats"] = runs.size();
  out["step_ms_median"] = median;
  out["step_ms_p10"] = common::quantile(pooled, 0.1);
  out["step_ms_p90"] = common::quantile(pooled, 0.9);
  out.erase("step_ms_ci95");
  const common::Interval steps_ci = common::bootstrap_median_ci(pooled);
  out["step_ms_ci95_steps"] = {steps_ci.lo, steps_ci.hi};
  if (runs.size() >= kMinLaunchesForCi) {
    const common::Interval ci = common::bootstrap_median_ci(medians);
    out["step_ms_ci95_launches"] = {ci.lo, ci.hi};
    out["ci95_launches_note"] = "";
  } else {
    out["step_ms_ci95_launches"] = nullptr;
    out["ci95_launches_note"] = fmt::format(
        "{} launch(es): a bootstrap interval over launches needs --repeats {} or more (with "
        "fewer its 95 % interval is only their min and max); see repeat_step_ms_median",
        runs.size(), kMinLaunchesForCi);
  }
  // samples/s and GFLOP/s follow the pooled median (they were the median launch's).
  out["samples_per_s"] = out["samples_per_s"].get<double>() * scale;
  out["gflops"] = out["gflops"].get<double>() * scale;
  out["repeat_step_ms_median"] = numbers(medians);
  out["repeat_samples_per_s"] = numbers(samples_per_s);
  nlohmann::ordered_json per_launch = nlohmann::ordered_json::array();
  for (const auto& r : runs) per_launch.push_back(r["samples"]);
  out["samples"] = per_launch;
  return out;
}

using common::load_1m;

struct Paths {
  std::string self;         // this executable
  std::string launcher;     // nanoddp-run next to it
  std::string scratch_dir;  // result and log files of the jobs
};

Paths find_paths() {
  Paths paths;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot read /proc/self/exe to find this executable: {}", ec.message());
  paths.self = self.string();
  paths.launcher = (self.parent_path() / "nanoddp-run").string();
  if (::access(paths.launcher.c_str(), X_OK) != 0) {
    fail(
        "nanoddp-run is not next to this executable (looked for {}): the benchmark starts its "
        "jobs with it; build it (it is part of the project) or install both together",
        paths.launcher);
  }
  std::string pattern = (fs::temp_directory_path() / "nanoddp-bench-ddp.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    fail("cannot create a scratch directory under {}", fs::temp_directory_path().string());
  }
  paths.scratch_dir = pattern;
  return paths;
}

class Sweep {
 public:
  Sweep(const Options& o, Paths paths, nlohmann::ordered_json provenance)
      : o_(o), paths_(std::move(paths)), provenance_(std::move(provenance)) {}
  ~Sweep() {
    std::error_code ec;
    fs::remove_all(paths_.scratch_dir, ec);
  }
  Sweep(const Sweep&) = delete;
  Sweep& operator=(const Sweep&) = delete;

  int run() {
    cores_ = machine_["cores"].get<int>();
    for (const std::string& note : o_.notes)
      fmt::print(stderr, "nanoddp-bench-ddp: note: {}\n", note);
    if (!o_.quiet) print_header(o_, machine_, build_, provenance_);
    bool all_ok = true;
    for (const Point& p : expand(o_)) {
      all_ok &= run_point(p);
      if (write_failed()) break;
    }
    if (!close_outputs()) return 1;
    return all_ok ? 0 : 1;
  }

  // The problem with a file that cannot be written, or "" (checked before any job runs).
  std::string open_outputs() {
    std::error_code ec;
    if (!o_.json_path.empty()) provenance_["json"] = fs::absolute(o_.json_path, ec).string();
    if (!o_.csv_path.empty()) provenance_["csv"] = fs::absolute(o_.csv_path, ec).string();
    if (!o_.json_path.empty()) {
      if (std::string problem = json_.open(o_.json_path); !problem.empty()) return problem;
    }
    if (!o_.csv_path.empty()) {
      if (std::string problem = csv_.open(o_.csv_path); !problem.empty()) return problem;
      csv_.write_line(csv_header());
    }
    return {};
  }

  // The results are only as good as their files: a write that failed (a full disk, /dev/full)
  // is an error naming the file (common/results_file.h), found after every row and at the close.
  bool check_outputs() {
    const bool json_ok = json_.flush();
    const bool csv_ok = csv_.flush();
    return json_ok && csv_ok;
  }
  bool close_outputs() {
    const bool json_ok = json_.close();
    const bool csv_ok = csv_.close();
    return json_ok && csv_ok;
  }
  bool write_failed() const { return json_.failed() || csv_.failed(); }

 private:
  // Runs one job (world ranks per node; multi-node flags when `multinode`); returns rank 0's
  // record when this node has rank 0, an empty object on other nodes, nullopt on failure
  // (after printing why).
  std::optional<nlohmann::ordered_json> run_job_for(const Point& p, int world, bool multinode,
                                                    const std::string& what, bool plain = false) {
    const std::string id = std::to_string(++jobs_);
    const std::string result = paths_.scratch_dir + "/result-" + id + ".json";
    const std::string log = paths_.scratch_dir + "/log-" + id + ".txt";
    std::vector<std::string> argv = {paths_.launcher, "--nproc-per-node", std::to_string(world)};
    const int nnodes = multinode ? o_.nnodes : 1;
    if (plain) {
      // The baseline: this executable alone, no launcher, no process group.
      argv = {paths_.self, "--worker", "--plain", "--world", "1", "--nnodes", "1"};
      const std::vector<std::string> flags = baseline_flags(o_, p);
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"--result", result});
    } else if (multinode && o_.nnodes > 1) {
      argv.insert(argv.end(), {"--nnodes", std::to_string(o_.nnodes), "--node-rank",
                               std::to_string(o_.node_rank), "--master-addr", o_.master_addr,
                               "--master-port", std::to_string(o_.master_port)});
    } else if (multinode && o_.master_port != 0) {
      argv.insert(argv.end(), {"--master-port", std::to_string(o_.master_port)});
    }
    const std::vector<std::string> flags = plain ? baseline_flags(o_, p) : config_flags(o_, p);
    if (!plain) {
      argv.insert(argv.end(), {paths_.self, "--worker", "--world", std::to_string(world),
                               "--nnodes", std::to_string(nnodes)});
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"--result", result});
    }

    const JobOutcome outcome = run_job(argv, log, std::chrono::duration<double>(o_.timeout_s));
    const std::string point = fmt::format("--world {} (x {} node(s)) {}{}", world, nnodes,
                                          plain ? "--plain " : "", fmt::join(flags, " "));
    if (!outcome.ok) {
      last_problem_ = fmt::format("{} failed: {}", what, outcome.problem);
      fmt::print(stderr,
                 "nanoddp-bench-ddp: error: {} failed: {}\n  point: {}\n  last lines of its "
                 "output:\n{}",
                 what, outcome.problem, point, tail_of_file(log, 20, "    "));
      std::fflush(stderr);
      return std::nullopt;
    }
    if (multinode && o_.node_rank != 0) return nlohmann::ordered_json::object();
    std::ifstream in(result);
    nlohmann::ordered_json record;
    try {
      record = nlohmann::ordered_json::parse(in);
    } catch (const std::exception& e) {
      last_problem_ =
          fmt::format("{} succeeded but its result file is unreadable ({})", what, e.what());
      fmt::print(stderr,
                 "nanoddp-bench-ddp: error: {} succeeded but its result file {} is unreadable "
                 "({})\n  point: {}\n",
                 what, result, e.what(), point);
      return std::nullopt;
    }
    return record;
  }

  // Runs a point (or its baseline) --repeats times, as separate launches; nullopt when one
  // failed. On the nodes other than 0 (several nodes), an empty object.
  std::optional<nlohmann::ordered_json> run_repeats(const Point& p, int world, bool multinode,
                                                    const std::string& what, bool plain) {
    std::vector<nlohmann::ordered_json> runs;
    for (int i = 0; i < o_.repeats; ++i) {
      const std::string label =
          o_.repeats > 1 ? fmt::format("{} (launch {} of {})", what, i + 1, o_.repeats) : what;
      auto record = run_job_for(p, world, multinode, label, plain);
      if (!record) return std::nullopt;
      if (record->empty()) return record;  // another node's: the figures are on node 0
      runs.push_back(std::move(*record));
    }
    return combine_repeats(runs);
  }

  // The plain 1-process run (no DDP) of the point's model and batch: run once per distinct
  // model and batch, shared by every configuration of the sweep, and printed and written once.
  const nlohmann::ordered_json* baseline(const Point& p) {
    const std::string key = fmt::format("{}", fmt::join(baseline_flags(o_, p), " "));
    if (auto it = baselines_.find(key); it != baselines_.end()) {
      return it->second ? &*it->second : nullptr;
    }
    const double load_start = load_1m();
    auto record = run_repeats(p, 1, false, "the plain 1-process baseline run", true);
    if (!record) emit_failure(p, 1, true, last_problem_);
    if (record) {
      note_load(*record, load_start, 1);
      if (!o_.zero_at_world_1_note.empty()) (*record)["zero_note"] = o_.zero_at_world_1_note;
      (*record)["scaling_efficiency"] = 1.0;
      (*record)["scaling_efficiency_repeats"] =
          std::vector<double>(static_cast<std::size_t>(o_.repeats), 1.0);
      emit(*record);
    }
    auto& slot = baselines_[key];
    slot = std::move(record);
    return slot ? &*slot : nullptr;
  }

  bool run_point(const Point& p) {
    if (p.world == 1 && o_.nnodes == 1) {
      // One rank is the baseline itself: no DDP, shared by the configurations of the sweep.
      return baseline(p) != nullptr;
    }
    // Node 0 computes the efficiency; the other nodes only take part in the jobs.
    const nlohmann::ordered_json* base = nullptr;
    if (o_.node_rank == 0) base = baseline(p);
    const bool no_baseline = o_.node_rank == 0 && base == nullptr;
    if (no_baseline) {
      fmt::print(
          stderr,
          "nanoddp-bench-ddp: error: no scaling efficiency for --world {} {}: its plain "
          "1-process baseline failed (above){}\n",
          p.world, fmt::join(config_flags(o_, p), " "),
          o_.nnodes > 1 ? "; running the job anyway, the other nodes wait for it" : "; skipped");
      emit_failure(p, p.world, false,
                   "not run: its plain 1-process baseline failed (no scaling efficiency)");
      // Alone, skip the point; with other nodes, take part so they are not left waiting.
      if (o_.nnodes == 1) return false;
    }
    const double load_start = load_1m();
    const auto result = run_repeats(p, p.world, true, "the job", false);
    if (!result) {
      if (o_.node_rank == 0) emit_failure(p, p.world, false, last_problem_);
      return false;
    }
    if (no_baseline) return false;
    if (o_.node_rank != 0) {
      if (!o_.quiet) {
        fmt::print("# --world {} done on node {} (figures on node 0)\n", p.world, o_.node_rank);
      }
      return true;
    }
    nlohmann::ordered_json record = *result;
    note_load(record, load_start, p.world * p.threads);
    const double ranks = record["config"]["world_size"].get<double>();
    const double base_samples = (*base)["samples_per_s"].get<double>();
    std::vector<double> efficiencies;
    for (const auto& v : record["repeat_samples_per_s"]) {
      efficiencies.push_back(v.get<double>() / (ranks * base_samples));
    }
    record["scaling_efficiency"] = record["samples_per_s"].get<double>() / (ranks * base_samples);
    record["scaling_efficiency_repeats"] = efficiencies;
    emit(record);
    return true;
  }

  // Flags what a reader must not miss, then prints the row and writes the JSON and CSV lines.
  void emit(nlohmann::ordered_json& record) {
    std::vector<std::string> warnings;
    const double efficiency = record["scaling_efficiency"].get<double>();
    if (efficiency > 1.0) {
      warnings.push_back(fmt::format(
          "efficiency {:.3f} above 1: faster per rank than the plain 1-process run (noise, "
          "caches, or a baseline that ran slower; rerun with --repeats)",
          efficiency));
    }
    const int ranks_here = record["config"]["nproc_per_node"].get<int>();
    const int threads = record["config"]["threads"].get<int>();
    if (ranks_here * threads > cores_) {
      warnings.push_back(fmt::format(
          "{} rank(s) x {} GEMM thread(s) on {} core(s): more threads than cores, the ranks "
          "time-share (plus one communication thread each)",
          ranks_here, threads, cores_));
    }
    if (record.contains("load_warning")) {
      warnings.push_back(record["load_warning"].get<std::string>());
      record.erase("load_warning");
    }
    if (record.contains("zero_note")) {
      warnings.push_back(record["zero_note"].get<std::string>());
      record.erase("zero_note");
    }
    record["warnings"] = warnings;
    write(record);
  }

  void write(nlohmann::ordered_json& record) {
    record["provenance"] = provenance_;
    common::redact_strings(record);
    if (!o_.quiet) print_row(record);
    json_.write_line(record.dump());
    csv_.write_line(csv_row(record));
    check_outputs();
  }

  // A point that did not run (or whose baseline did not) is still a row of the results, with
  // its configuration and an "error": a sweep's files say what is missing and why.
  void emit_failure(const Point& p, int world, bool plain, const std::string& problem) {
    nlohmann::ordered_json config = {{"world_size", world * (plain ? 1 : o_.nnodes)},
                                     {"nnodes", plain ? 1 : o_.nnodes},
                                     {"nproc_per_node", world},
                                     {"device", o_.device},
                                     {"backend", o_.backend},
                                     {"in", p.in},
                                     {"out", p.out},
                                     {"hidden", p.hidden},
                                     {"layers", p.layers},
                                     {"activation", p.activation},
                                     {"scaling", scaling_name(o_.scaling)},
                                     {"ddp", !plain}};
    if (!plain) {
      config["bucket_cap_mb"] = p.bucket_cap_mb;
      config["first_bucket_mb"] = p.first_bucket_mb;
      config["overlap"] = p.overlap;
      config["optimizer_in_backward"] = p.optimizer_in_backward;
      config["comm_hook"] = p.comm_hook;
      config["zero_stage"] = p.zero;
      config["zero_overlap_gather"] = p.zero_overlap_gather;
    }
    config["threads"] = p.threads;
    nlohmann::ordered_json record = {
        {"bench", "ddp"},      {"machine", machine_},
        {"build", build_},     {"config", config},
        {"baseline", plain},   {"steps", o_.steps},
        {"warmup", o_.warmup}, {"repeats", o_.repeats},
        {"error", problem},    {"warnings", nlohmann::ordered_json::array()}};
    write(record);
  }

  // Other processes competing for the cores slow every figure of a point without a trace in
  // them: a 1-minute load average above the cores at the start or the end of the point is said.
  void note_load(nlohmann::ordered_json& record, double load_start, int threads_here) {
    const double load_end = load_1m();
    record["load_average_1m"] = {load_start, load_end};
    if (const auto warning =
            common::load_warning(load_start, load_end, cores_, threads_here, "this point")) {
      record["load_warning"] = *warning;
    }
  }

  const Options& o_;
  Paths paths_;
  nlohmann::ordered_json provenance_;
  // Where the sweep runs: in every row, a failed point's too (its CSV columns are not left empty).
  const nlohmann::ordered_json machine_ = common::machine_info();
  const nlohmann::ordered_json build_ = common::build_info();
  common::ResultsFile json_{"nanoddp-bench-ddp", "--json"};
  common::ResultsFile csv_{"nanoddp-bench-ddp", "--csv"};
  std::map<std::string, std::optional<nlohmann::ordered_json>> baselines_;
  int jobs_ = 0;
  int cores_ = 1;
  std::string last_problem_;
};

}  // namespace

int run_driver(const Options& options, const nlohmann::ordered_json& provenance) {
  if (common::same_file(options.json_path, options.csv_path)) {
    fmt::print(stderr,
               "nanoddp-bench-ddp: error: --json {} and --csv {} are the same file: each would "
               "overwrite the other; give two paths\n",
               options.json_path, options.csv_path);
    return 2;
  }
  Sweep sweep(options, find_paths(), provenance);
  if (const std::string problem = sweep.open_outputs(); !problem.empty()) {
    return cli::usage_error("nanoddp-bench-ddp", problem);
  }
  return sweep.run();
}

}  // namespace nanoddp::bench_ddp
