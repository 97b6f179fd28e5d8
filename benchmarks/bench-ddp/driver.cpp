#include "driver.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "launch.h"
#include "common/machine_info.h"
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
                        for (const int threads : o.threads)
                          for (const int world : o.world)
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
  Sweep(const Options& o, Paths paths) : o_(o), paths_(std::move(paths)) {}
  ~Sweep() {
    std::error_code ec;
    fs::remove_all(paths_.scratch_dir, ec);
  }
  Sweep(const Sweep&) = delete;
  Sweep& operator=(const Sweep&) = delete;

  int run() {
    const auto machine = common::machine_info();
    const auto build = common::build_info();
    if (!o_.quiet) print_header(o_, machine, build);
    bool all_ok = true;
    for (const Point& p : expand(o_)) all_ok &= run_point(p);
    return all_ok ? 0 : 1;
  }

  // False when --json names a file that cannot be written (checked before any job runs).
  bool open_json() {
    if (o_.json_path.empty()) return true;
    json_.open(o_.json_path, std::ios::trunc);
    return json_.is_open();
  }

 private:
  // Runs one job (world ranks per node; multi-node flags when `multinode`); returns rank 0's
  // record when this node has rank 0, an empty object on other nodes, nullopt on failure
  // (after printing why).
  std::optional<nlohmann::ordered_json> run_job_for(const Point& p, int world, bool multinode,
                                                    const std::string& what) {
    const std::string id = std::to_string(++jobs_);
    const std::string result = paths_.scratch_dir + "/result-" + id + ".json";
    const std::string log = paths_.scratch_dir + "/log-" + id + ".txt";
    std::vector<std::string> argv = {paths_.launcher, "--nproc-per-node", std::to_string(world)};
    const int nnodes = multinode ? o_.nnodes : 1;
    if (multinode && o_.nnodes > 1) {
      argv.insert(argv.end(), {"--nnodes", std::to_string(o_.nnodes), "--node-rank",
                               std::to_string(o_.node_rank), "--master-addr", o_.master_addr,
                               "--master-port", std::to_string(o_.master_port)});
    } else if (multinode && o_.master_port != 0) {
      argv.insert(argv.end(), {"--master-port", std::to_string(o_.master_port)});
    }
    argv.insert(argv.end(), {paths_.self, "--worker", "--world", std::to_string(world), "--nnodes",
                             std::to_string(nnodes)});
    const std::vector<std::string> flags = config_flags(o_, p);
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--result", result});

    const JobOutcome outcome = run_job(argv, log, std::chrono::duration<double>(o_.timeout_s));
    const std::string point =
        fmt::format("--world {} (x {} node(s)) {}", world, nnodes, fmt::join(flags, " "));
    if (!outcome.ok) {
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
      fmt::print(stderr,
                 "nanoddp-bench-ddp: error: {} succeeded but its result file {} is unreadable "
                 "({})\n  point: {}\n",
                 what, result, e.what(), point);
      return std::nullopt;
    }
    return record;
  }

  // samples/s of the point's 1-rank run (run once per distinct configuration).
  std::optional<double> baseline(const Point& p) {
    const std::string key = fmt::format("{}", fmt::join(config_flags(o_, p), " "));
    if (auto it = baselines_.find(key); it != baselines_.end()) return it->second;
    const auto record = run_job_for(p, 1, false, "the 1-rank baseline run");
    std::optional<double> value;
    if (record) value = (*record)["samples_per_s"].get<double>();
    baselines_[key] = value;
    if (record) baseline_records_[key] = *record;  // also the world-1 point, if the sweep has one
    return value;
  }

  bool run_point(const Point& p) {
    const bool is_baseline = p.world == 1 && o_.nnodes == 1;
    nlohmann::ordered_json record;
    if (is_baseline) {
      // The world-1 point is its own baseline: one run serves both.
      const auto samples = baseline(p);
      if (!samples) return false;
      record = baseline_records_.at(fmt::format("{}", fmt::join(config_flags(o_, p), " ")));
      record["scaling_efficiency"] = 1.0;
    } else {
      // Node 0 computes the efficiency; the other nodes only take part in the jobs.
      std::optional<double> base;
      if (o_.node_rank == 0) base = baseline(p);
      const bool no_baseline = o_.node_rank == 0 && !base;
      if (no_baseline) {
        fmt::print(
            stderr,
            "nanoddp-bench-ddp: error: no scaling efficiency for --world {} {}: its 1-rank "
            "baseline failed (above){}\n",
            p.world, fmt::join(config_flags(o_, p), " "),
            o_.nnodes > 1 ? "; running the job anyway, the other nodes wait for it" : "; skipped");
        // Alone, skip the point; with other nodes, take part so they are not left waiting.
        if (o_.nnodes == 1) return false;
      }
      const auto result = run_job_for(p, p.world, true, "the job");
      if (!result || no_baseline) return false;
      if (o_.node_rank != 0) {
        if (!o_.quiet) {
          fmt::print("# --world {} done on node {} (figures on node 0)\n", p.world, o_.node_rank);
        }
        return true;
      }
      record = *result;
      const double ranks = record["config"]["world_size"].get<double>();
      record["scaling_efficiency"] = record["samples_per_s"].get<double>() / (ranks * *base);
    }
    if (!o_.quiet) print_row(record);
    if (json_.is_open()) {
      json_ << record.dump() << "\n";
      json_.flush();
    }
    return true;
  }

  const Options& o_;
  Paths paths_;
  std::ofstream json_;
  std::map<std::string, std::optional<double>> baselines_;
  std::map<std::string, nlohmann::ordered_json> baseline_records_;
  int jobs_ = 0;
};

}  // namespace

int run_driver(const Options& options) {
  Sweep sweep(options, find_paths());
  if (!sweep.open_json()) {
    fmt::print(stderr, "nanoddp-bench-ddp: error: --json {}: cannot open the file for writing\n",
               options.json_path);
    return 2;
  }
  return sweep.run();
}

}  // namespace nanoddp::bench_ddp
