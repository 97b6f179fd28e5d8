#include "benchmarks/sim/report.h"

#include <fmt/format.h>

#include <cmath>

#include "benchmarks/sim/checks.h"
#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string fabric_line(const Fabric& f, const Cluster& c) {
  std::string line =
      fmt::format("{}: intra {:.3g} GB/s, {:.3g} us/step", f.name, f.intra_bw_gbs, f.intra_lat_us);
  if (c.nodes > 1) {
    line += fmt::format("; inter {:.3g} GB/s per GPU ({:.3g} per node), {:.3g} us/step",
                        f.inter_bw_gbs, f.inter_bw_gbs * c.gpus_per_node, f.inter_lat_us);
  }
  if (f.launch_us > 0) line += fmt::format("; {:.3g} us per collective", f.launch_us);
  return line;
}

// A fabric fitted to a measured transport (shared memory, a TCP ring): one algorithm, no NVLink,
// no NVSwitch. The ring-vs-tree band and the NVLink SHARP caveat describe NCCL on GPUs only.
bool fitted(const Fabric& f) {
  return f.measured_ranks > 0;
}

double pct(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

}  // namespace

const char* const kNvlsCaveat =
    "NVLink SHARP (NVLS) and CollNet are not modelled: on NVLink4 NVSwitch nodes (H100, H200) "
    "NCCL's default all-reduce reaches ~480 GB/s busbw where this model's ring reaches ~370, so "
    "communication inside a node is up to ~23 % pessimistic (docs/simulator.md)";

// The sweeps' "ring" and "tree" columns: the efficiency with that algorithm forced. A fitted
// transport is one measured algorithm (a fit is a ring), so there the columns are "-" (null in
// JSON) rather than a fit relabelled as two algorithms.
std::string algorithm_column(const StepOptions& o, double efficiency) {
  return fitted(o.fabric) ? std::string("-") : fmt::format("{:.1f}%", efficiency * 100.0);
}

nlohmann::json algorithm_value(const StepOptions& o, double efficiency) {
  return fitted(o.fabric) ? nlohmann::json(nullptr) : nlohmann::json(efficiency);
}

std::string algorithm_columns_note(const StepOptions& o) {
  return fitted(o.fabric) ? "(ring, tree: not modelled apart for a fitted transport; a fit is the "
                            "one algorithm it measured)\n"
                          : "(ring, tree: the efficiency with that algorithm forced)\n";
}

std::string format_report(const SimReport& r) {
  const ComputeProfile& prof = *r.profile;
  const StepOptions& o = r.options;
  const StepPrediction& p = r.prediction;
  std::string out;
  out += "nanoddp-sim: one DDP training step, predicted\n";
  out += fmt::format("profile   {}\n", prof.source);
  out += fmt::format("          {:.2f} MiB of gradients ({} bytes per element on the wire)\n",
                     static_cast<double>(prof.numel()) * o.grad_bytes / kMiB, o.grad_bytes);
  out +=
      fmt::format("cluster   {} node(s) x {} GPU(s) = {} rank(s); all-reduce {}\n", o.cluster.nodes,
                  o.cluster.gpus_per_node, p.world_size, algorithm_name(o.algorithm));
  // A fitted hierarchical run: this fabric is one host's; the leaders' comes below.
  const bool two_fits = o.algorithm == Algorithm::kHierarchical && o.inter_fabric.has_value();
  out += fmt::format(
      "fabric    {}\n",
      fabric_line(o.fabric, two_fits ? Cluster{.nodes = 1, .gpus_per_node = o.cluster.gpus_per_node}
                                     : o.cluster));
  if (!o.fabric.description.empty()) out += fmt::format("          {}\n", o.fabric.description);
  if (o.algorithm == Algorithm::kHierarchical) {
    const Fabric& inter = o.inter_fabric.value_or(o.fabric);
    out += fmt::format(
        "hier      within a host: ring over its {} ranks ({}); across: ring over {} leaders ({}: "
        "{:.3g} GB/s, {:.3g} us/step); 4 MiB pieces, the leaders' ring one piece behind\n",
        o.cluster.gpus_per_node, o.fabric.name, o.cluster.nodes, inter.name, inter.inter_bw_gbs,
        inter.inter_lat_us);
    if (o.inter_fabric && !inter.description.empty()) {
      out += fmt::format("          leaders: {}\n", inter.description);
    }
  }
  out += fmt::format(
      "buckets   first {} MiB, then {} MiB -> {} bucket(s); overlap {}{}{}{}\n", o.first_bucket_mb,
      o.bucket_cap_mb, p.buckets.size(), o.overlap ? "on" : "off",
      o.optimizer_in_backward ? "; optimizer in backward (each bucket updated after its wait)" : "",
      o.overlap_slowdown > 0
          ? fmt::format("; backward and all-reduce x{:.2f} slower together", 1 + o.overlap_slowdown)
          : "",
      o.compute_scale != 1 ? fmt::format("; compute x{:.2f}", o.compute_scale) : "");
  if (o.cores > 0) {
    const ReplayRates& q = p.rates;
    out += fmt::format(
        "cores     {} CPU core(s) per node shared by {} compute + {} communication threads: "
        "speed x{:.3g} compute alone, x{:.3g} beside a collective; collective x{:.3g} alone, "
        "x{:.3g} beside backward\n",
        o.cores, o.cluster.gpus_per_node, p.world_size > 1 ? comm_threads(o) : 0, q.compute_alone,
        q.compute_shared, q.comm_alone, q.comm_shared);
    if (o.algorithm == Algorithm::kHierarchical && across_scale(o) != 1) {
      out += fmt::format(
          "          the leaders' ring: x{:.3g} alone, x{:.3g} beside backward (its fit ran one "
          "rank per host)\n",
          q.comm_alone / across_scale(o), q.comm_shared / across_scale(o));
    }
  }
  if (o.opt_contention) {
    out += fmt::format(
        "mem bus   optimizer x{:.3g} slower on a node of several ranks "
        "(--opt-contention)\n",
        *o.opt_contention);
  }
  if (o.mem_contention != 1) {
    out += fmt::format(
        "mem bus   compute x{:.3g} slower on a node whose ranks compute together "
        "(--mem-contention){}\n",
        o.mem_contention, o.cluster.gpus_per_node > 1 ? "" : ": not applied, one rank per node");
  }
  if (o.peers) out += "peers     each collective waits for the slowest traced rank\n";
  if (r.memory) {
    const MemoryEstimate& m = *r.memory;
    out += fmt::format(
        "memory    {:.3g} GB of {:.3g} GB per GPU ({:.1f} %): parameters {:.3g}, gradients "
        "{:.3g}, optimizer state {:.3g}, activations {:.3g} GB (a lower bound)\n",
        m.total() / 1e9, m.gpu / 1e9, pct(m.total(), m.gpu), m.parameters / 1e9, m.gradients / 1e9,
        m.optimizer_state / 1e9, m.activations / 1e9);
  }
  out += "\n";
  out += fmt::format("{:>6} {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>5}\n", "bucket",
                     "params", "MiB", "ready", "all ready", "launch", "start", "end", "all-reduce",
                     "algo");
  for (std::size_t b = 0; b < p.buckets.size(); ++b) {
    const BucketTiming& t = p.timeline.buckets[b];
    out += fmt::format(
        "{:>6} {:>6} {:>10.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>12.3f} {:>5}\n", b,
        p.buckets[b].count, static_cast<double>(p.buckets[b].numel) * o.grad_bytes / kMiB,
        t.ready_ms, t.peers_ready_ms, t.launch_ms, t.start_ms, t.end_ms, p.collectives[b].ms,
        algorithm_name(p.collectives[b].algorithm));
  }
  out += "(ms from the start of backward; all ready: the slowest rank's, with --peers traced)\n\n";
  out += fmt::format("step                 {:>10.3f} ms\n", p.step_ms);
  const auto row = [&](const char* what, double ms) {
    out += fmt::format("  {:<18} {:>10.3f} ms  {:>5.1f} %\n", what, ms, pct(ms, p.step_ms));
  };
  row("forward", p.forward_ms);
  row("backward", p.backward_ms);
  row("exposed comm", p.exposed_comm_ms);
  row("sync all-reduce", p.sync_ms);
  row("optimizer", p.optimizer_ms);
  row("other", p.other_ms);
  out +=
      fmt::format("compute              {:>10.3f} ms  (forward + backward + optimizer + other)\n",
                  p.compute_ms());
  out += fmt::format("communication        {:>10.3f} ms  (sum of the buckets' all-reduces)\n",
                     p.comm_ms);
  out += fmt::format(
      "exposed comm         {:>10.3f} ms  overlap {:.1f} % of the communication ran during "
      "backward{}\n",
      p.exposed_comm_ms, p.overlap_fraction * 100.0,
      o.overlap ? "" : " (overlap off: every bucket starts after it)");
  if (o.optimizer_in_backward && p.timeline.exposed_comm_ms > p.exposed_comm_ms) {
    out += fmt::format(
        "                                 --optimizer-in-backward: {:.3f} ms of the all-reduce "
        "after backward ran beside the bucket updates (not counted as overlap, as in "
        "nanoddp-bench-ddp)\n",
        p.timeline.exposed_comm_ms - p.exposed_comm_ms);
  }
  if (r.no_efficiency) {
    out += fmt::format("1-GPU step           {:>10} ms  scaling efficiency n/a\n", "n/a");
  } else {
    out += fmt::format("1-GPU step           {:>10.3f} ms  scaling efficiency {:.1f} % ({})\n",
                       p.single_gpu_step_ms, p.scaling_efficiency * 100.0,
                       r.global_batch > 0
                           ? fmt::format("strong: global batch {} fixed, the 1-GPU step runs all "
                                         "of it; T1 / (n x Tn)",
                                         r.global_batch)
                           : std::string("batch per GPU fixed"));
  }
  out += fmt::format("                                 1-GPU step = {}\n", r.baseline);
  if (p.world_size > 1 && !r.no_efficiency && o.algorithm != Algorithm::kHierarchical &&
      !fitted(o.fabric)) {
    const AlgorithmBand& band = r.band;
    out += fmt::format(
        "algorithm band       ring {:.3f} ms ({:.1f} %) .. tree {:.3f} ms ({:.1f} %): the "
        "all-reduce algorithm alone moves the efficiency by {:.1f} points\n",
        band.ring_step_ms, band.ring_efficiency * 100.0, band.tree_step_ms,
        band.tree_efficiency * 100.0,
        std::abs(band.ring_efficiency - band.tree_efficiency) * 100.0);
  }
  if (!fitted(o.fabric)) out += fmt::format("caveat: {}\n", kNvlsCaveat);
  for (const std::string& w : r.warnings) out += fmt::format("warning: {}\n", w);
  if (prof.measured) {
    const MeasuredStep& m = *prof.measured;
    out += fmt::format(
        "traced run           {:>10.3f} ms  measured with {} rank(s), median of {} steps "
        "(p10 {:.3f}, p90 {:.3f})",
        m.step_ms, m.world_size, m.steps, m.step_p10_ms, m.step_p90_ms);
    if (m.world_size > 1) {
      out += fmt::format(": comm {:.3f} ms, exposed {:.3f} ms", m.comm_ms, m.exposed_comm_ms);
    }
    out += "\n";
  }
  if (!r.sweep.empty()) {
    out += fmt::format("\nbucket-cap sweep (first bucket {} MiB, overlap {})\n", o.first_bucket_mb,
                       o.overlap ? "on" : "off");
    out += fmt::format("{:>10} {:>8} {:>10} {:>10} {:>11}\n", "cap MiB", "buckets", "step ms",
                       "comm ms", "exposed ms");
    const SweepRow& best = best_row(r.sweep);
    for (const SweepRow& s : r.sweep) {
      out +=
          fmt::format("{:>10g} {:>8} {:>10.3f} {:>10.3f} {:>11.3f}{}\n", s.bucket_cap_mb, s.buckets,
                      s.step_ms, s.comm_ms, s.exposed_comm_ms, &s == &best ? "  <- best" : "");
    }
    out += fmt::format(
        "best bucket cap: {:g} MiB (step {:.3f} ms; {} MiB gives {:.3f} ms, {:+.1f} %)\n",
        best.bucket_cap_mb, best.step_ms, o.bucket_cap_mb, p.step_ms,
        pct(p.step_ms - best.step_ms, best.step_ms));
  }
  if (!r.scaling.empty()) {
    out += fmt::format("\nscaling ({} GPU(s) per node, {})\n", o.cluster.gpus_per_node,
                       r.global_batch > 0 ? fmt::format("global batch {} fixed", r.global_batch)
                                          : std::string("batch per GPU fixed"));
    out += fmt::format("{:>6} {:>6} {:>10} {:>10} {:>11} {:>11} {:>9} {:>9}\n", "nodes", "ranks",
                       "step ms", "comm ms", "exposed ms", "efficiency", "ring", "tree");
    for (std::size_t i = 0; i < r.scaling.size(); ++i) {
      const ScalingRow& s = r.scaling[i];
      out += fmt::format("{:>6} {:>6} {:>10.3f} {:>10.3f} {:>11.3f} {:>10.1f}% {:>9} {:>9}\n",
                         s.nodes, s.world_size, s.step_ms, s.comm_ms, s.exposed_comm_ms,
                         s.scaling_efficiency * 100.0,
                         algorithm_column(o, r.scaling_ring.at(i).scaling_efficiency),
                         algorithm_column(o, r.scaling_tree.at(i).scaling_efficiency));
    }
    out += algorithm_columns_note(o);
  }
  if (!r.parameter_sweep.empty()) {
    out += fmt::format("\n{} sweep (the rest of the command line unchanged)\n",
                       r.parameter_sweep_flag);
    out += fmt::format("{:>12} {:>14} {:>10} {:>10} {:>11} {:>11} {:>9} {:>9} {:>10}\n",
                       r.parameter_sweep_flag, "parameters", "step ms", "comm ms", "exposed ms",
                       "efficiency", "ring", "tree", "memory GB");
    for (const ParameterSweepRow& s : r.parameter_sweep) {
      out += fmt::format(
          "{:>12g} {:>14} {:>10.3f} {:>10.3f} {:>11.3f} {:>10.1f}% {:>9} {:>9} {:>10.3g}\n",
          s.value, s.parameters, s.step_ms, s.comm_ms, s.exposed_comm_ms,
          s.scaling_efficiency * 100.0, algorithm_column(o, s.ring_efficiency),
          algorithm_column(o, s.tree_efficiency), s.memory_bytes / 1e9);
    }
    out += algorithm_columns_note(o);
  }
  return out;
}

nlohmann::json report_json(const SimReport& r) {
  using nlohmann::json;
  const ComputeProfile& prof = *r.profile;
  const StepOptions& o = r.options;
  const StepPrediction& p = r.prediction;
  const auto efficiency = [&](double e) { return r.no_efficiency ? json(nullptr) : json(e); };
  json j;
  if (!r.provenance.is_null()) j["provenance"] = r.provenance;
  if (!r.build.is_null()) j["build"] = r.build;
  if (!r.inputs.is_null()) j["inputs"] = r.inputs;
  j["profile"] = {{"source", prof.source},
                  {"parameters", prof.numel()},
                  {"forward_ms", prof.forward_ms},
                  {"backward_ms", prof.backward_ms()},
                  {"optimizer_ms", prof.optimizer_ms},
                  {"other_ms", prof.other_ms},
                  {"data_ms", prof.data_ms}};
  json grads = json::array();
  for (const GradientWork& g : prof.grads) {
    grads.push_back({{"name", g.name}, {"numel", g.numel}, {"work_ms", g.work_ms}});
  }
  j["profile"]["gradients"] = grads;
  if (!prof.peers_ready_ms.empty()) j["profile"]["peers_ready_ms"] = prof.peers_ready_ms;
  if (prof.measured) {
    const MeasuredStep& m = *prof.measured;
    j["profile"]["measured"] = {{"world_size", m.world_size},
                                {"step_ms", m.step_ms},
                                {"steps", m.steps},
                                {"step_p10_ms", m.step_p10_ms},
                                {"step_p90_ms", m.step_p90_ms},
                                {"comm_ms", m.comm_ms},
                                {"exposed_comm_ms", m.exposed_comm_ms},
                                {"bucket_numel", m.bucket_numel},
                                {"bucket_allreduce_ms", m.bucket_allreduce_ms}};
  }
  j["cluster"] = {{"nodes", o.cluster.nodes},
                  {"gpus_per_node", o.cluster.gpus_per_node},
                  {"world_size", p.world_size}};
  j["fabric"] = {{"name", o.fabric.name},
                 {"description", o.fabric.description},
                 {"intra_bw_gbs", o.fabric.intra_bw_gbs},
                 {"intra_lat_us", o.fabric.intra_lat_us},
                 {"inter_bw_gbs", o.fabric.inter_bw_gbs},
                 {"inter_lat_us", o.fabric.inter_lat_us},
                 {"launch_us", o.fabric.launch_us}};
  if (o.inter_fabric) {
    j["inter_fabric"] = {{"name", o.inter_fabric->name},
                         {"description", o.inter_fabric->description},
                         {"inter_bw_gbs", o.inter_fabric->inter_bw_gbs},
                         {"inter_lat_us", o.inter_fabric->inter_lat_us}};
  }
  j["options"] = {{"algo", algorithm_name(o.algorithm)},
                  {"bucket_cap_mb", o.bucket_cap_mb},
                  {"first_bucket_mb", o.first_bucket_mb},
                  {"overlap", o.overlap},
                  {"optimizer_in_backward", o.optimizer_in_backward},
                  {"grad_bytes", o.grad_bytes},
                  {"sync_allreduce", o.sync_allreduce},
                  {"overlap_slowdown", o.overlap_slowdown},
                  {"compute_scale", o.compute_scale},
                  {"cores", o.cores},
                  {"measured_cores", o.measured_cores},
                  {"mem_contention", o.mem_contention},
                  {"network_ranks", o.network_ranks},
                  {"inter_network_ranks", o.inter_network_ranks},
                  {"peers", o.peers ? "traced" : "identical"}};
  j["rates"] = {{"compute_alone", p.rates.compute_alone},
                {"compute_shared", p.rates.compute_shared},
                {"comm_alone", p.rates.comm_alone},
                {"comm_shared", p.rates.comm_shared},
                {"comm_threads", p.world_size > 1 ? comm_threads(o) : 0}};
  if (o.algorithm == Algorithm::kHierarchical) {
    // The leaders' ring against its own fit (the rates above are the intra fit's).
    j["rates"]["across_alone"] = p.rates.comm_alone / across_scale(o);
    j["rates"]["across_shared"] = p.rates.comm_shared / across_scale(o);
  }
  json buckets = json::array();
  for (std::size_t b = 0; b < p.buckets.size(); ++b) {
    const BucketTiming& t = p.timeline.buckets[b];
    buckets.push_back({{"index", b},
                       {"parameters", p.buckets[b].count},
                       {"numel", p.buckets[b].numel},
                       {"bytes", static_cast<double>(p.buckets[b].numel) * o.grad_bytes},
                       {"ready_ms", t.ready_ms},
                       {"peers_ready_ms", t.peers_ready_ms},
                       {"launch_ms", t.launch_ms},
                       {"start_ms", t.start_ms},
                       {"end_ms", t.end_ms},
                       {"allreduce_ms", p.collectives[b].ms},
                       {"algo", algorithm_name(p.collectives[b].algorithm)}});
  }
  j["buckets"] = buckets;
  j["step"] = {{"step_ms", p.step_ms},
               {"forward_ms", p.forward_ms},
               {"backward_ms", p.backward_ms},
               {"exposed_comm_ms", p.exposed_comm_ms},
               {"sync_ms", p.sync_ms},
               {"optimizer_ms", p.optimizer_ms},
               {"other_ms", p.other_ms},
               {"compute_ms", p.compute_ms()},
               {"comm_ms", p.comm_ms},
               {"overlap_fraction", p.overlap_fraction},
               {"single_gpu_step_ms",
                r.no_efficiency ? nlohmann::json(nullptr) : nlohmann::json(p.single_gpu_step_ms)},
               {"baseline", r.baseline},
               {"scaling", r.global_batch > 0 ? "strong" : "weak"},
               {"scaling_efficiency", efficiency(p.scaling_efficiency)}};
  if (fitted(o.fabric)) {
    j["algorithm_band"] = nullptr;  // one measured transport: no choice of algorithm
  } else {
    j["algorithm_band"] = {{"ring_step_ms", r.band.ring_step_ms},
                           {"ring_efficiency", efficiency(r.band.ring_efficiency)},
                           {"tree_step_ms", r.band.tree_step_ms},
                           {"tree_efficiency", efficiency(r.band.tree_efficiency)}};
  }
  if (r.memory) {
    const MemoryEstimate& m = *r.memory;
    j["memory"] = {{"parameters_bytes", m.parameters},
                   {"gradients_bytes", m.gradients},
                   {"optimizer_state_bytes", m.optimizer_state},
                   {"activations_bytes", m.activations},
                   {"total_bytes", m.total()},
                   {"gpu_bytes", m.gpu}};
  }
  if (!r.parameter_sweep.empty()) {
    json rows = json::array();
    for (const ParameterSweepRow& s : r.parameter_sweep) {
      rows.push_back({{"value", s.value},
                      {"parameters", s.parameters},
                      {"step_ms", s.step_ms},
                      {"comm_ms", s.comm_ms},
                      {"exposed_comm_ms", s.exposed_comm_ms},
                      {"scaling_efficiency", s.scaling_efficiency},
                      {"ring_efficiency", algorithm_value(o, s.ring_efficiency)},
                      {"tree_efficiency", algorithm_value(o, s.tree_efficiency)},
                      {"memory_bytes", s.memory_bytes}});
    }
    j["parameter_sweep"] = {{"flag", r.parameter_sweep_flag}, {"rows", rows}};
  }
  j["caveats"] = fitted(o.fabric) ? json::array() : json::array({kNvlsCaveat});
  j["warnings"] = r.warnings;
  if (!r.sweep.empty()) {
    json rows = json::array();
    for (const SweepRow& s : r.sweep) {
      rows.push_back({{"bucket_cap_mb", s.bucket_cap_mb},
                      {"buckets", s.buckets},
                      {"step_ms", s.step_ms},
                      {"comm_ms", s.comm_ms},
                      {"exposed_comm_ms", s.exposed_comm_ms}});
    }
    j["sweep"] = rows;
    j["best_bucket_cap_mb"] = best_row(r.sweep).bucket_cap_mb;
  }
  if (!r.scaling.empty()) {
    json rows = json::array();
    for (const ScalingRow& s : r.scaling) {
      rows.push_back({{"nodes", s.nodes},
                      {"world_size", s.world_size},
                      {"step_ms", s.step_ms},
                      {"comm_ms", s.comm_ms},
                      {"exposed_comm_ms", s.exposed_comm_ms},
                      {"scaling_efficiency", s.scaling_efficiency},
                      {"ring_efficiency",
                       algorithm_value(o, r.scaling_ring.at(rows.size()).scaling_efficiency)},
                      {"tree_efficiency",
                       algorithm_value(o, r.scaling_tree.at(rows.size()).scaling_efficiency)}});
    }
    j["scaling"] = rows;
  }
  return j;
}

std::vector<BusbwRow> busbw_table(const Cluster& cluster, const Fabric& fabric, double min_bytes,
                                  double max_bytes) {
  check_fabric(fabric, cluster);
  if (!(min_bytes >= 1) || !(max_bytes >= min_bytes)) {
    fail("--busbw sizes: need 1 <= min <= max bytes (got {} and {})", min_bytes, max_bytes);
  }
  if (max_bytes > kMaxBusbwBytes) {
    fail(
        "--busbw-max {:.0f} bytes: at most 1T ({:.0f} bytes), far past any message a DDP step "
        "sends",
        max_bytes, kMaxBusbwBytes);
  }
  std::vector<BusbwRow> rows;
  const int n = cluster.world_size();
  // Below 2^40 the doubled sizes are exact: no row is rounded past max_bytes.
  for (double bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    BusbwRow row;
    row.bytes = bytes;
    row.ring_ms = ring_allreduce_ms(cluster, fabric, bytes);
    row.tree_ms = tree_allreduce_ms(cluster, fabric, bytes);
    row.ring_busbw_gbs = bus_bandwidth_gbs(bytes, row.ring_ms, n);
    row.tree_busbw_gbs = bus_bandwidth_gbs(bytes, row.tree_ms, n);
    rows.push_back(row);
  }
  return rows;
}

std::string format_busbw(const Cluster& cluster, const Fabric& fabric,
                         const std::vector<BusbwRow>& rows) {
  std::string out = fmt::format(
      "nanoddp-sim: all-reduce model, {} node(s) x {} GPU(s), fabric {}\n"
      "busbw = bytes / time * 2(n-1)/n (nccl-tests' definition)\n",
      cluster.nodes, cluster.gpus_per_node, fabric_line(fabric, cluster));
  if (!fitted(fabric)) out += fmt::format("caveat: {}\n", kNvlsCaveat);
  out += fmt::format("{:>14} {:>12} {:>12} {:>12} {:>12}\n", "size (B)", "ring us", "ring busbw",
                     "tree us", "tree busbw");
  for (const BusbwRow& r : rows) {
    out += fmt::format("{:>14.0f} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f}\n", r.bytes,
                       r.ring_ms * 1000.0, r.ring_busbw_gbs, r.tree_ms * 1000.0, r.tree_busbw_gbs);
  }
  return out;
}

nlohmann::json busbw_json(const Cluster& cluster, const Fabric& fabric,
                          const std::vector<BusbwRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const BusbwRow& r : rows) {
    out.push_back({{"nodes", cluster.nodes},
                   {"gpus_per_node", cluster.gpus_per_node},
                   {"fabric", fabric.name},
                   {"bytes", r.bytes},
                   {"ring_us", r.ring_ms * 1000.0},
                   {"ring_busbw_gbs", r.ring_busbw_gbs},
                   {"tree_us", r.tree_ms * 1000.0},
                   {"tree_busbw_gbs", r.tree_busbw_gbs}});
  }
  return out;
}

}  // namespace nanoddp::sim
