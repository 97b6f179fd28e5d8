#include "table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/machine_info.h"
#include "common/provenance.h"

namespace nanoddp::bench_ddp {

namespace {

constexpr const char* kRowFormat =
    "{:>5} {:>5} {:>6} {:>6} {:>6} {:>6} {:>4} {:>9} {:>7} {:>8} {:>7} {:>7} {:>5} {:>3} {:>9} "
    "{:>4} {:>3} {:>9} {:>9} {:>9} "
    "{:>9} {:>10} {:>9} {:>9} {:>9} {:>5} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {}\n";

// Bytes as MiB with two decimals: a column of memory per rank that stays narrow.
std::string mib(const nlohmann::ordered_json& bytes) {
  return fmt::format("{:.2f}", bytes.get<double>() / (1024.0 * 1024.0));
}

}  // namespace

void print_header(const Options& o, const nlohmann::ordered_json& machine,
                  const nlohmann::ordered_json& build, const nlohmann::ordered_json& provenance) {
  fmt::print("# nanoddp-bench-ddp {} ({} build{}, {}) on {}: {}, {} cores, {}\n",
             build["version"].get<std::string>(), build["build_type"].get<std::string>(),
             build["native"].get<bool>() ? ", -march=native" : "",
             build["compiler"].get<std::string>(), machine["hostname"].get<std::string>(),
             machine["cpu"].get<std::string>(), machine["cores"].get<int>(),
             machine["os"].get<std::string>());
  fmt::print(
      "# device {}, backend {}, {} node(s), {} scaling (batch = {}), AdamW, MLP with "
      "MSE loss on a fixed synthetic batch\n",
      o.device, o.backend, o.nnodes, scaling_name(o.scaling),
      o.scaling == Scaling::kWeak ? "per rank" : "global");
  fmt::print("# {}\n", common::provenance_line(provenance));
  fmt::print(
      "# times in ms: median of {} steps (after {} warm-up), slowest rank per step, {} "
      "launch(es) pooled (rep); p10 and p90 over the same steps\n",
      o.steps, o.warmup, o.repeats);
  fmt::print(
      "# step = forward + backward + optimizer; the breakdown is the median step's own (of the "
      "median launch): mstep = compute + exposed, allreduce = hidden + exposed; exposed = the "
      "part of the all-reduce the step waited for (all of it with overlap off)\n");
  fmt::print(
      "# ranks 1 = the baseline: one plain process, no DDP (no buckets), shared by every "
      "configuration with its model and batch\n");
  fmt::print(
      "# optim: after = one optimizer step after backward, inbwd = --optimizer-in-backward "
      "(each bucket updated as soon as it is averaged)\n");
  fmt::print(
      "# zero = ZeRO stage: 1 shards the optimizer state, 2 the averaged gradients too (a "
      "reduce-scatter per bucket instead of an all-reduce); under ZeRO allreduce also holds the "
      "parameter all-gather after the step (all of it exposed); +ov: that all-gather runs during "
      "the next forward (--zero-overlap-gather on), exposed only where the forward waits\n");
  fmt::print(
      "# ovl = hidden / allreduce; eff = samples/s / (ranks x samples/s of the "
      "baseline); GFLOP/s per rank (GEMMs); busbw = the step's bus bytes (gradients x 2(n-1)/n, "
      "or (n-1)/n under zero 2; + parameters x (n-1)/n under zero 1, 2) / allreduce\n");
  fmt::print(
      "# MiB held by rank 0 (comm::ZeroMemory, as nanoddp-train --metrics): param = parameters, "
      "grad = every gradient buffer, avggrad = the averaged "
      "gradients the optimizer reads, optst = optimizer state\n");
  fmt::print("#\n");
  fmt::print(kRowFormat, "ranks", "nodes", "in", "hidden", "layers", "out", "act", "params",
             "batch/r", "bucketMB", "buckets", "overlap", "optim", "thr", "hook", "zero", "rep",
             "step", "p10", "p90", "samples/s", "mstep", "compute", "allreduce", "exposed", "ovl",
             "eff", "GFLOP/s", "busbw", "param", "grad", "avggrad", "optst", "flags");
  std::fflush(stdout);
}

void print_row(const nlohmann::ordered_json& r) {
  const auto& c = r["config"];
  const bool ddp = c.value("ddp", true);
  if (r.contains("error")) {
    fmt::print("# FAILED: --world {}{} {}: {}\n", c["nproc_per_node"].get<int>(),
               ddp ? "" : " (the plain baseline)",
               fmt::format("--hidden {} --layers {}", c["hidden"].get<std::int64_t>(),
                           c["layers"].get<std::int64_t>()),
               r["error"].get<std::string>());
    std::fflush(stdout);
    return;
  }
  std::string flags;
  for (const auto& w : r.value("warnings", nlohmann::ordered_json::array())) {
    const std::string text = w.get<std::string>();
    flags += text.rfind("efficiency", 0) == 0     ? "eff>1 "
             : text.rfind("load average", 0) == 0 ? "load>cores "
             : text.rfind("--zero", 0) == 0       ? "no-zero@1 "
                                                  : "ranks>cores ";
  }
  fmt::print(
      kRowFormat, c["world_size"].get<int>(), c["nnodes"].get<int>(), c["in"].get<std::int64_t>(),
      c["hidden"].get<std::int64_t>(), c["layers"].get<std::int64_t>(),
      c["out"].get<std::int64_t>(), c["activation"].get<std::string>(),
      c["params"].get<std::int64_t>(), c["batch_per_rank"].get<std::int64_t>(),
      ddp ? fmt::format("{}", c["bucket_cap_mb"].get<double>()) : "-",
      ddp ? fmt::format("{}", c["buckets"].get<int>()) : "-",
      ddp ? (c["overlap"].get<bool>() ? "on" : "off") : "-",
      !ddp                                     ? "plain"
      : c["optimizer_in_backward"].get<bool>() ? "inbwd"
                                               : "after",
      c["threads"].get<int>(), ddp ? c["comm_hook"].get<std::string>() : "-",
      !ddp                                    ? std::string("-")
      : c.value("zero_overlap_gather", false) ? fmt::format("{}+ov", c.value("zero_stage", 0))
                                              : fmt::format("{}", c.value("zero_stage", 0)),
      r.value("repeats", 1), fmt::format("{:.3f}", r["step_ms_median"].get<double>()),
      fmt::format("{:.3f}", r.value("step_ms_p10", 0.0)),
      fmt::format("{:.3f}", r["step_ms_p90"].get<double>()),
      fmt::format("{:.0f}", r["samples_per_s"].get<double>()),
      fmt::format("{:.3f}", r["median_step"]["step_ms"].get<double>()),
      fmt::format("{:.3f}", r["compute_ms"].get<double>()),
      fmt::format("{:.3f}", r["allreduce_ms"].get<double>()),
      fmt::format("{:.3f}", r["exposed_comm_ms"].get<double>()),
      fmt::format("{:.2f}", r["overlap_fraction"].get<double>()),
      fmt::format("{:.3f}", r["scaling_efficiency"].get<double>()),
      fmt::format("{:.2f}", r["gflops"].get<double>()),
      fmt::format("{:.3f}", r["busbw_gbs"].get<double>()), mib(r["parameter_bytes"]),
      mib(r["gradient_bytes"]), mib(r["averaged_gradient_bytes"]), mib(r["optimizer_state_bytes"]),
      flags);
  std::fflush(stdout);
}

namespace {

// RFC 4180: quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"') out.push_back('"');
    out.push_back(ch);
  }
  out.push_back('"');
  return out;
}

std::string csv_value(const nlohmann::ordered_json& v) {
  if (v.is_string()) return csv_field(v.get<std::string>());
  if (v.is_null()) return "";
  return csv_field(v.dump());
}

constexpr const char* kConfigColumns[] = {"world_size",
                                          "nnodes",
                                          "nproc_per_node",
                                          "device",
                                          "backend",
                                          "in",
                                          "out",
                                          "hidden",
                                          "layers",
                                          "activation",
                                          "scaling",
                                          "batch_per_rank",
                                          "global_batch",
                                          "ddp",
                                          "bucket_cap_mb",
                                          "first_bucket_mb",
                                          "overlap",
                                          "optimizer_in_backward",
                                          "comm_hook",
                                          "zero_stage",
                                          "zero_overlap_gather",
                                          "threads",
                                          "params",
                                          "buckets"};
constexpr const char* kRecordColumns[] = {"baseline",
                                          "repeats",
                                          "steps",
                                          "warmup",
                                          "step_ms_median",
                                          "step_ms_p10",
                                          "step_ms_p90",
                                          "samples_per_s",
                                          "compute_ms",
                                          "allreduce_ms",
                                          "exposed_comm_ms",
                                          "hidden_comm_ms",
                                          "overlap_fraction",
                                          "scaling_efficiency",
                                          "gflops",
                                          "busbw_gbs",
                                          "parameter_bytes",
                                          "gradient_bytes",
                                          "averaged_gradient_bytes",
                                          "optimizer_state_bytes"};

// The machine and build a row was measured on, flat: one column per key of the JSON's "machine"
// and "build" objects, taken from the helpers that fill them (common/machine_info.h), so the CSV
// follows whatever they record. Named machine_<key> and build_<key> ("build_type" as it is).
struct FlatColumn {
  std::string object, key, name;
};
const std::vector<FlatColumn>& machine_build_columns() {
  static const std::vector<FlatColumn> columns = [] {
    std::vector<FlatColumn> out;
    for (const auto& [object, value] : {std::pair{std::string("machine"), common::machine_info()},
                                        std::pair{std::string("build"), common::build_info()}}) {
      for (const auto& item : value.items()) {
        const std::string& key = item.key();
        out.push_back({object, key, key.starts_with(object + "_") ? key : object + "_" + key});
      }
    }
    return out;
  }();
  return columns;
}

}  // namespace

std::string csv_header() {
  std::string out;
  for (const char* c : kConfigColumns) out += std::string(out.empty() ? "" : ",") + c;
  for (const char* c : kRecordColumns) out += std::string(",") + c;
  out +=
      ",median_step_ms,step_ms_ci95_steps_lo,step_ms_ci95_steps_hi,step_ms_ci95_launches_lo,"
      "step_ms_ci95_launches_hi,ci95_launches_note,scaling_efficiency_min,scaling_efficiency_max,"
      "load_average_1m_start,load_average_1m_end,warnings,error,commit,dirty,utc,"
      "load_average_1m,command,cwd,environment";
  for (const FlatColumn& c : machine_build_columns()) out += "," + c.name;
  return out;
}

std::string csv_row(const nlohmann::ordered_json& r) {
  std::string out;
  const auto add = [&](const std::string& field) {
    if (!out.empty()) out.push_back(',');
    out += field;
  };
  // A failed point's record lacks the figures: their fields stay empty.
  const auto at = [&](std::initializer_list<const char*> path) -> std::string {
    const nlohmann::ordered_json* v = &r;
    for (const char* k : path) {
      if (!v->is_object() || !v->contains(k)) return "";
      v = &(*v)[k];
    }
    return csv_value(*v);
  };
  const auto element = [&](const char* key, std::size_t i) -> std::string {
    if (!r.contains(key) || !r[key].is_array() || r[key].size() <= i) return "";
    return csv_value(r[key][i]);
  };
  const auto& c = r["config"];
  for (const char* k : kConfigColumns) add(c.contains(k) ? csv_value(c[k]) : "");
  for (const char* k : kRecordColumns) add(r.contains(k) ? csv_value(r[k]) : "");
  add(at({"median_step", "step_ms"}));
  add(element("step_ms_ci95_steps", 0));
  add(element("step_ms_ci95_steps", 1));
  add(element("step_ms_ci95_launches", 0));
  add(element("step_ms_ci95_launches", 1));
  add(at({"ci95_launches_note"}));
  std::vector<double> eff;
  for (const auto& e : r.value("scaling_efficiency_repeats", nlohmann::ordered_json::array())) {
    eff.push_back(e.get<double>());
  }
  add(eff.empty() ? "" : fmt::format("{}", *std::min_element(eff.begin(), eff.end())));
  add(eff.empty() ? "" : fmt::format("{}", *std::max_element(eff.begin(), eff.end())));
  std::string warnings;
  for (const auto& w : r.value("warnings", nlohmann::ordered_json::array())) {
    warnings += (warnings.empty() ? "" : "; ") + w.get<std::string>();
  }
  add(element("load_average_1m", 0));
  add(element("load_average_1m", 1));
  add(csv_field(warnings));
  add(at({"error"}));
  add(at({"provenance", "commit"}));
  add(at({"provenance", "dirty"}));
  add(at({"provenance", "utc"}));
  const bool load = r.contains("provenance") && r["provenance"].contains("load_average") &&
                    r["provenance"]["load_average"].is_array();
  add(load ? csv_value(r["provenance"]["load_average"][0]) : "");
  add(at({"provenance", "command"}));
  add(at({"provenance", "cwd"}));
  // The environment as one JSON object (the per-step samples stay in the JSON only).
  add(at({"provenance", "environment"}));
  for (const FlatColumn& flat : machine_build_columns()) {
    add(at({flat.object.c_str(), flat.key.c_str()}));
  }
  return out;
}

}  // namespace nanoddp::bench_ddp
