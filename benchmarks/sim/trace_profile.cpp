#include "benchmarks/sim/trace_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "benchmarks/sim/error.h"
#include "benchmarks/sim/input_file.h"
#include "benchmarks/sim/stats.h"
#include "common/stats.h"

namespace nanoddp::sim {

namespace {

using nlohmann::json;

// Track ids of engine/trace.h's TraceTrack.
constexpr int kComputeTrack = 0;
constexpr int kCommTrack = 1;
constexpr int kMarkersTrack = 2;
constexpr int kDataTrack = 3;

struct Span {
  std::string name;
  std::size_t index = 0;  // in traceEvents, for messages
  int tid = 0;
  double ts_us = 0;
  double dur_us = 0;
  std::int64_t elements = -1;  // all-reduce spans
  std::int64_t numel = -1;     // "grad <name>" markers (instants: dur_us = 0)
  double end_us() const { return ts_us + dur_us; }
  bool is_grad_marker() const { return tid == kMarkersTrack && name.rfind("grad ", 0) == 0; }
  bool is_backward_node() const { return tid == kComputeTrack && name.rfind("backward ", 0) == 0; }
  // What nanoddp-train runs one after another on a rank's main thread, never at once (on a GPU:
  // in order on the compute stream): forward, each backward node, the optimizer step.
  bool is_exclusive_compute() const {
    return tid == kComputeTrack &&
           (name == "forward" || name == "optimizer step" || name.rfind("backward ", 0) == 0);
  }
  // A collective that joins every rank: a bucket's all-reduce, or nanoddp-train's health
  // all-reduce.
  bool is_collective() const {
    return tid == kCommTrack &&
           (name.rfind("all-reduce bucket ", 0) == 0 || name == "health all-reduce");
  }
};

// A bound on one marker's `numel` and a span's `elements`, and on their sums: 2^40 elements
// (4 TiB of fp32 gradients) is past any model nanoddp-train trains, and keeps every sum of them far
// from wrapping an int64.
constexpr std::int64_t kMaxTraceElements = std::int64_t{1} << 40;
// A span, or a step, longer than a day (in the trace's microseconds) is no traced training step:
// nanoddp-train traces its first steps, milliseconds to seconds each.
constexpr double kMaxSpanUs = 86400e6;
// A trace's "pid" is its rank.
constexpr std::int64_t kMaxRank = std::numeric_limits<int>::max();
// Past 2^53 a double no longer holds every microsecond, and no steady clock reads that much (285
// years): plot_trace.py's bound too.
constexpr double kMaxTsUs = 9007199254740992.0;
// Fewer kept steps than this: a median of almost nothing, warned about.
constexpr std::size_t kFewSteps = 5;

// A whole number from 0 to kMaxTraceElements: nanoddp-train writes a decimal string; a JSON
// integer is taken too. A fraction (8.5), a float, or a string with anything after the digits is
// no element count.
std::int64_t integer_arg(const json& event, const char* key, const std::string& name,
                         std::size_t index, const std::string& event_name) {
  const json& value = event["args"][key];
  const auto digits = [](const std::string& t) {
    return !t.empty() &&
           std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  // Saturated at kMaxTraceElements + 1: a larger count is refused below, never wrapped.
  constexpr std::int64_t kPast = kMaxTraceElements + 1;
  std::optional<std::int64_t> n;
  if (value.is_number_unsigned()) {
    n = static_cast<std::int64_t>(
        std::min<std::uint64_t>(value.get<std::uint64_t>(), static_cast<std::uint64_t>(kPast)));
  } else if (value.is_number_integer()) {
    n = value.get<std::int64_t>();  // negative: the caller says what it needed
  } else if (value.is_string() && digits(value.get_ref<const std::string&>())) {
    const std::string& text = value.get_ref<const std::string&>();
    n = text.size() > 15 ? kPast : std::min<std::int64_t>(std::stoll(text), kPast);
  }
  if (!n) {
    fail(
        "{}: event {} ('{}') has \"{}\": {}, not a whole number of elements; expected a trace "
        "written by nanoddp-train --trace",
        name, index, event_name, key, value.dump());
  }
  if (*n > kMaxTraceElements) {
    fail(
        "{}: event {} ('{}') has \"{}\": {}, more than 2^40 ({}) elements (4 TiB of fp32 "
        "gradients in one tensor); no model nanoddp-train runs has such a parameter",
        name, index, event_name, key, value.dump(), kMaxTraceElements);
  }
  return *n;
}

// The sum of the parameters' elements, refused past kMaxTraceElements (`what` names them).
std::int64_t checked_numel(const std::vector<ParameterInfo>& params, const std::string& what) {
  std::int64_t total = 0;
  for (const ParameterInfo& p : params) {
    if (__builtin_add_overflow(total, p.numel, &total) || total > kMaxTraceElements) {
      fail(
          "{}: more than 2^40 ({}) gradient elements in all (4 TiB of fp32 gradients); the trace "
          "is not one of a model nanoddp-train runs",
          what, kMaxTraceElements);
    }
  }
  return total;
}

// The gradients of one step, in layout order, with the moment each became final (trace clock).
struct StepGrads {
  std::vector<ParameterInfo> layout;  // from the markers; empty for the "backward linear" path
  std::vector<double> ready_us;       // per parameter of the layout
  std::size_t n_linear = 0;           // "backward linear" spans seen
};

// The parameters of the "grad <name>" markers in [first, last) of a rank's sorted spans.
//
// Layout order: markers arrive node by node in backward order, and within one autograd node in
// the order of its inputs (linear(x, weight, bias): weight, then bias). nn::FlatParameters lays
// the gradients out in reverse registration order, and nanoddp's modules register their
// parameters in the order they pass them to their op (Linear: weight, bias). So the layout is
// the node order, each node's markers reversed -- for an MLP exactly mlp_parameters(). This is
// an assumption about the model, not something the trace records: it is checked against the
// --in/--out/--hidden/--layers flags when given, and against the buckets of a DDP trace.
// A node's gradients all count as ready when its last marker fires (they are sub-microsecond
// apart; the bucket holding them waits for all).
StepGrads marker_grads(const std::vector<Span>& spans, std::size_t first, std::size_t last) {
  StepGrads grads;
  std::vector<std::vector<const Span*>> groups;  // per backward node, markers in arrival order
  bool new_group = true;
  for (std::size_t i = first; i < last; ++i) {
    const Span& sp = spans[i];
    if (sp.is_backward_node()) new_group = true;
    if (!sp.is_grad_marker()) continue;
    if (new_group) groups.emplace_back();
    new_group = false;
    groups.back().push_back(&sp);
  }
  for (const auto& group : groups) {
    for (auto it = group.rbegin(); it != group.rend(); ++it) {
      grads.layout.push_back({(*it)->name.substr(5), (*it)->numel, 0});
      grads.ready_us.push_back(group.back()->ts_us);
    }
  }
  return grads;
}

// The "backward linear" path (traces without markers): the k-th span's end is when the
// gradients of the k-th Linear from the end (its bias and weight, layout order) became final.
StepGrads linear_grads(const std::vector<Span>& spans, std::size_t first, std::size_t last) {
  StepGrads grads;
  for (std::size_t i = first; i < last; ++i) {
    const Span& sp = spans[i];
    if (sp.tid == kComputeTrack && sp.name == "backward linear") {
      ++grads.n_linear;
      grads.ready_us.push_back(sp.end_us());  // bias
      grads.ready_us.push_back(sp.end_us());  // weight
    }
  }
  return grads;
}

std::string list_parameters(const std::vector<ParameterInfo>& params) {
  constexpr std::size_t kShown = 8;
  std::vector<std::string> items;
  double numel = 0;  // a message: a sum that cannot wrap (exact up to 2^53)
  for (const ParameterInfo& p : params) {
    numel += static_cast<double>(p.numel);
    if (items.size() < kShown) items.push_back(fmt::format("{} {}", p.name, p.numel));
  }
  if (params.size() > kShown) items.push_back(fmt::format("... {} more", params.size() - kShown));
  return fmt::format("{} parameters, {:.0f} elements: {}", params.size(), numel,
                     fmt::join(items, ", "));
}

// True when `a` and `b` hold the same (name, numel) pairs, whatever the order.
bool same_parameters(std::vector<ParameterInfo> a, std::vector<ParameterInfo> b) {
  const auto by_name = [](const ParameterInfo& x, const ParameterInfo& y) {
    return x.name < y.name;
  };
  std::sort(a.begin(), a.end(), by_name);
  std::sort(b.begin(), b.end(), by_name);
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].numel != b[i].numel) return false;
  }
  return true;
}

// Per parameter of `params`, its ready time in `grads` (found by name: `params` may be the
// flags' layout and `grads` the markers').
std::vector<double> ready_by_name(const std::vector<ParameterInfo>& params,
                                  const StepGrads& grads) {
  std::map<std::string, double> at;
  for (std::size_t i = 0; i < grads.layout.size(); ++i)
    at[grads.layout[i].name] = grads.ready_us[i];
  std::vector<double> ready;
  for (const ParameterInfo& p : params) ready.push_back(at.at(p.name));
  return ready;
}

double number(const json& event, const char* key, const std::string& name, std::size_t index) {
  const auto it = event.find(key);
  if (it == event.end() || !it->is_number()) {
    fail("{}: event {} has no numeric \"{}\": not a trace written by nanoddp-train --trace", name,
         index, key);
  }
  return it->get<double>();
}

// One step of one rank, cut out of the trace.
struct StepSample {
  double forward_ms = 0;
  double step_ms = 0;  // data start to optimizer end, data preparation excluded
  double data_ms = 0;
  std::vector<double> ready_ms;  // per parameter (layout order), from backward's start
  double backward_end_ms = 0;
  double wait_ms = 0;
  double optimizer_ms = 0;
  std::map<int, std::pair<std::int64_t, double>> buckets;  // index -> (elements, ms)
  double backward_start_us = 0;                            // on the trace's clock (for the peers)
  std::map<std::string, const Span*> collectives;          // by name (for the peers' clocks)
};

// Where the steps of one rank's spans (sorted by start) begin: at its "forward" spans. Step f
// holds the spans from forwards[f] to forwards[f + 1].
std::vector<std::size_t> forward_indices(const std::vector<Span>& spans) {
  std::vector<std::size_t> forwards;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].tid == kComputeTrack && spans[i].name == "forward") forwards.push_back(i);
  }
  return forwards;
}

std::size_t step_end(const std::vector<std::size_t>& forwards, std::size_t f, std::size_t n) {
  return f + 1 < forwards.size() ? forwards[f + 1] : n;
}

// How a rank's steps give their parameters' ready times.
struct GradSource {
  bool markers = false;                      // "grad <name>" markers, or "backward linear" ends
  const std::vector<ParameterInfo>* params;  // layout order
  std::size_t n_linear = 0;                  // without markers
};

// The ready times (trace clock) of the source's parameters in the step [first, last) of `spans`;
// `where` names the step in messages. Fails when the step's gradients are not those.
std::vector<double> step_ready_us(const std::vector<Span>& spans, std::size_t first,
                                  std::size_t last, const GradSource& source,
                                  const std::string& where) {
  if (source.markers) {
    const StepGrads grads = marker_grads(spans, first, last);
    if (!same_parameters(grads.layout, *source.params)) {
      fail(
          "{} has \"grad\" markers for {}, but the first step read has them for {}. The "
          "simulator needs the same parameters every step (one forward/backward per step).",
          where, list_parameters(grads.layout), list_parameters(*source.params));
    }
    return ready_by_name(*source.params, grads);
  }
  const StepGrads grads = linear_grads(spans, first, last);
  if (grads.n_linear != source.n_linear) {
    fail("{} has {} \"backward linear\" spans, not {}", where, grads.n_linear, source.n_linear);
  }
  return grads.ready_us;
}

// The collectives (Span::is_collective) of the step [first, last) of a rank's spans, by name.
std::map<std::string, const Span*> step_collectives(const std::vector<Span>& spans,
                                                    std::size_t first, std::size_t last) {
  std::map<std::string, const Span*> collectives;
  for (std::size_t i = first; i < last; ++i) {
    if (spans[i].is_collective()) collectives[spans[i].name] = &spans[i];
  }
  return collectives;
}

// The ranks' clocks, checked on the collectives of the kept steps, which join every rank. One
// host's ranks share one (steady_clock); ranks of several hosts, or a rank whose times were
// shifted, do not, and an offset moves the slowest rank's gradient times, and the predicted step,
// by up to itself: a 1 ms bound let a shift of half a 1.2 ms step through, and the prediction
// moved 25 % (an outside tester's). So the bounds scale with what they protect:
//  - a collective cannot end on one rank before it has started on another (a rank's span starts
//    before it joins and ends after every rank has): spans that share no moment are refused,
//    however small the offset is against the step;
//  - the same collective ends at about the same time on every rank, so the median difference of
//    the ends estimates the offset: above kMaxClockShare of the median step it is warned about,
//    above kMaxClockGapMs refused. Not refused by the step's share: on a busy machine a rank's
//    thread that waited for the others is woken late, and real traces of a 0.7 ms step ended
//    0.05-0.14 ms apart (median) on one clock.
// In 3 real 2-rank traces here a rank's times shifted by 10 %, 20 % or 50 % of the step, either
// way, broke the first rule every time, and by 5 % in 5 of 6 cases.
constexpr double kClockSlackUs = 20;  // device times are anchored to the host clock per rank
constexpr double kMaxClockShare = 0.1;
constexpr double kMaxClockGapMs = 1.0;

void check_one_clock(const std::map<int, std::vector<Span>>& by_rank, int rank,
                     const std::vector<std::vector<std::map<std::string, const Span*>>>& peers,
                     const std::vector<StepSample>& samples, std::size_t skip,
                     const std::string& name, std::vector<std::string>& warnings) {
  std::vector<double> steps;
  for (const StepSample& s : samples) steps.push_back(s.step_ms);
  const double step_ms = median(steps);
  std::size_t p = 0;
  for (const auto& [peer, spans] : by_rank) {
    if (peer == rank) continue;
    std::vector<double> end_gaps;  // peer's end minus this rank's, ms
    for (std::size_t s = 0; s < samples.size(); ++s) {
      for (const auto& [collective, own] : samples[s].collectives) {
        const auto it = peers[p][s].find(collective);
        if (it == peers[p][s].end()) continue;
        const Span* other = it->second;
        const Span* first = own->end_us() < other->end_us() ? own : other;
        const Span* second = first == own ? other : own;
        if (first->end_us() + kClockSlackUs < second->ts_us) {
          fail(
              "--peers traced: in {}, step {}: '{}' ends on rank {} (event {}, {:.3f} us) before "
              "it starts on rank {} (event {}, {:.3f} us); a collective joins every rank, so on "
              "one clock it cannot: the ranks' clocks differ (traced on several hosts, or times "
              "edited?). Use --peers identical, or a trace of one host's ranks.",
              name, s + skip + 1, collective, first == own ? rank : peer, first->index,
              first->end_us(), first == own ? peer : rank, second->index, second->ts_us);
        }
        end_gaps.push_back((other->end_us() - own->end_us()) / 1000.0);
      }
    }
    if (end_gaps.empty()) {
      fail(
          "--peers traced: {} has no collective that rank {} and rank {} both ran; the peers "
          "need a DDP trace",
          name, rank, peer);
    }
    const double gap = median(end_gaps);
    const std::string apart = fmt::format(
        "in {} the same collectives end {:.3g} ms {} on rank {} than on rank {} (median of {}), "
        "{:.0f} % of the median step ({:.3g} ms)",
        name, std::fabs(gap), gap > 0 ? "later" : "earlier", peer, rank, end_gaps.size(),
        100 * std::fabs(gap) / step_ms, step_ms);
    if (std::fabs(gap) > kMaxClockGapMs) {
      fail(
          "--peers traced: {}; on one clock they end together, so the ranks' clocks differ by "
          "about that (traced on several hosts, or times edited?), which moves the slowest "
          "rank's gradient times and the prediction by as much. Use --peers identical, or a "
          "trace of one host's ranks.",
          apart);
    }
    if (std::fabs(gap) > kMaxClockShare * step_ms) {
      warnings.push_back(fmt::format(
          "--peers traced: {}: a waiting thread woken late on a busy machine, or a clock offset "
          "between the ranks, which would move the prediction by up to as much",
          apart));
    }
    ++p;
  }
}

// Medians over the kept steps of the slowest rank's ready times, from this rank's backward
// start: one per parameter, in layout order. Checks that the ranks share a clock.
std::vector<double> peers_ready(const std::map<int, std::vector<Span>>& by_rank, int rank,
                                const std::vector<StepSample>& samples, std::size_t skip,
                                const GradSource& source, const std::string& name,
                                std::vector<std::string>& warnings) {
  if (by_rank.size() < 2) {
    fail("--peers traced: {} holds one rank; the slowest rank needs a trace of several", name);
  }
  const std::size_t n = source.params->size();
  // Per step the latest over every rank, this one included: the collective starts when the
  // last rank arrives, whoever it is that step.
  std::vector<std::vector<double>> latest(n, std::vector<double>(samples.size()));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t s = 0; s < samples.size(); ++s) latest[i][s] = samples[s].ready_ms[i];
  }
  // Per peer (in by_rank's order, this rank left out) and kept step, its collectives.
  std::vector<std::vector<std::map<std::string, const Span*>>> peer_collectives;
  for (const auto& [peer, spans] : by_rank) {
    if (peer == rank) continue;
    const std::vector<std::size_t> forwards = forward_indices(spans);
    if (forwards.size() != samples.size() + skip) {
      fail("--peers traced: in {}, rank {} has {} steps and rank {} has {}", name, peer,
           forwards.size(), rank, samples.size() + skip);
    }
    auto& collectives = peer_collectives.emplace_back();
    for (std::size_t s = 0; s < samples.size(); ++s) {
      const std::size_t f = s + skip;
      const std::size_t last = step_end(forwards, f, spans.size());
      const StepSample& own = samples[s];
      const std::vector<double> ready =
          step_ready_us(spans, forwards[f], last, source,
                        fmt::format("--peers traced: step {} of rank {} in {}", f + 1, peer, name));
      collectives.push_back(step_collectives(spans, forwards[f], last));
      const auto has_allreduce = [](const std::map<std::string, const Span*>& c) {
        return std::any_of(c.begin(), c.end(),
                           [](const auto& entry) { return entry.first != "health all-reduce"; });
      };
      if (!has_allreduce(collectives.back()) || !has_allreduce(own.collectives)) {
        fail("--peers traced: step {} of {} has no all-reduce span; the peers need a DDP trace",
             f + 1, name);
      }
      for (std::size_t i = 0; i < n; ++i) {
        latest[i][s] = std::max(latest[i][s], (ready[i] - own.backward_start_us) / 1000.0);
      }
    }
  }
  check_one_clock(by_rank, rank, peer_collectives, samples, skip, name, warnings);
  std::vector<double> ready;
  for (std::size_t i = 0; i < n; ++i) ready.push_back(median(latest[i]));
  return ready;
}

// Forward, the backward nodes and the optimizer step of a rank never overlap (Span::
// is_exclusive_compute): a trace in which they do was damaged or edited (one whose backward
// spans were moved onto the forward's start was predicted as if fine). `spans` are sorted by
// start.
void check_exclusive_compute(const std::vector<Span>& spans, int rank, const std::string& name) {
  // The trace writes times to the nanosecond: adjacent spans may touch to its rounding.
  constexpr double kRoundingUs = 0.01;
  const Span* latest = nullptr;  // the span seen so far that ends last
  int step = 0;
  for (const Span& sp : spans) {
    if (!sp.is_exclusive_compute()) continue;
    if (sp.name == "forward") ++step;
    if (latest != nullptr && sp.ts_us < latest->end_us() - kRoundingUs) {
      fail(
          "{}: event {} ('{}', ts {:.3f} us) starts {:.3f} us before event {} ('{}', ts {:.3f} "
          "us, dur {:.3f} us) ends, on rank {}'s compute thread in step {}; nanoddp-train runs "
          "forward, each backward node and the optimizer step one after another there: a "
          "damaged or edited trace",
          name, sp.index, sp.name, sp.ts_us, latest->end_us() - sp.ts_us, latest->index,
          latest->name, latest->ts_us, latest->dur_us, rank, std::max(step, 1));
    }
    if (latest == nullptr || sp.end_us() > latest->end_us()) latest = &sp;
  }
}

// nanoddp-train's "run_config" event (the trace's metadata: batch per rank, --grad-accum, the
// steps it holds), checked as plot_trace.py checks it, so that the two readers of one file agree
// on what is valid. Returns the batch per rank, when given.
std::optional<std::int64_t> read_run_config(const json& e, const std::string& name, std::size_t i) {
  const json& args = e["args"];
  for (const char* key : {"batch", "grad_accum", "first_step"}) {
    if (args.contains(key) && integer_arg(e, key, name, i, "run_config") < 1) {
      fail("{}: event {} ('run_config') has {} {}, not a count from 1", name, i, key,
           args[key].dump());
    }
  }
  if (args.contains("last_step") && args.contains("first_step") &&
      integer_arg(e, "last_step", name, i, "run_config") <
          integer_arg(e, "first_step", name, i, "run_config")) {
    fail("{}: event {} ('run_config') has last_step {} before first_step {}", name, i,
         args["last_step"].dump(), args["first_step"].dump());
  }
  if (args.contains("grad_accum") && integer_arg(e, "grad_accum", name, i, "run_config") > 1) {
    fail(
        "{}: a trace of --grad-accum {} (its run_config); the simulator models one "
        "forward/backward per optimizer step: trace a run without --grad-accum",
        name, args["grad_accum"].dump());
  }
  if (!args.contains("batch")) return std::nullopt;
  return integer_arg(e, "batch", name, i, "run_config");
}

// A rank's own trace of a run that stopped inside its traced steps (nanoddp-train writes
// T.rankR.partial.json, its run_config saying "partial": true): one rank's events, and the step
// it stopped in has no optimizer step. It was refused, but blamed on a missing optimizer step,
// --grad-accum or skipped (NaN) steps; it is refused up front, saying what it is.
void refuse_partial_trace(const json& events, const std::string& name) {
  for (const json& e : events) {
    if (!e.is_object() || !e.contains("ph") || e["ph"] != "M" || !e.contains("name") ||
        e["name"] != "run_config" || !e.contains("args") || !e["args"].is_object()) {
      continue;
    }
    const json& args = e["args"];
    if (!args.contains("partial") || args["partial"] != true) return;
    const auto value = [&](const char* key) {
      return args.contains(key) ? args[key].dump() : std::string("?");
    };
    fail(
        "{}: a partial trace (its run_config says \"partial\": true): the events of rank {} "
        "of {} alone, written when the run stopped in step {}, which it holds cut short; not a "
        "whole run to profile. Profile the trace of a run that finished its --trace-steps (draw "
        "this one with benchmarks/plot/plot_trace.py)",
        name, value("rank"), value("world_size"), value("stopped_in_step"));
  }
}

}  // namespace

ComputeProfile profile_from_trace(const std::string& path, const TraceProfileOptions& options) {
  return profile_from_trace_text(read_input_file("--profile", path), path, options);
}

ComputeProfile profile_from_trace_text(const std::string& text, const std::string& name,
                                       const TraceProfileOptions& options) {
  if (options.skip_steps < 0) fail("--skip-steps must be >= 0, got {}", options.skip_steps);

  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    fail(
        "--profile {}: not valid JSON ({}); expected a Chrome trace written by "
        "nanoddp-train --trace",
        name, e.what());
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    fail(
        "--profile {}: no \"traceEvents\" array; expected a Chrome trace written by "
        "nanoddp-train --trace",
        name);
  }

  refuse_partial_trace(doc["traceEvents"], name);

  std::set<int> ranks;
  std::set<int> ranks_with_events;  // spans or instants, not only metadata
  std::optional<std::int64_t> batch_per_rank;
  std::optional<std::string> comm_hook;
  bool seen_run_config = false;
  std::map<int, std::vector<Span>> by_rank;  // only options.rank's unless the peers are wanted
  const json& events = doc["traceEvents"];
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (!e.is_object()) fail("{}: event {} is not an object", name, i);
    if (!e.contains("ph") || !e["ph"].is_string() || !e.contains("pid") ||
        !e["pid"].is_number_integer()) {
      fail("{}: event {} has no \"ph\" or integer \"pid\": not a Chrome trace", name, i);
    }
    // A rank: read as an int, a pid of 2^32 became rank 0 (an outside tester's).
    const std::int64_t wide_pid =
        e["pid"].is_number_unsigned() &&
                e["pid"].get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxRank)
            ? kMaxRank + 1
            : e["pid"].get<std::int64_t>();
    if (wide_pid < 0 || wide_pid > kMaxRank) {
      fail("{}: event {} has \"pid\" {}, which is no rank (0 to {})", name, i, e["pid"].dump(),
           kMaxRank);
    }
    const int pid = static_cast<int>(wide_pid);
    ranks.insert(pid);
    const std::string ph = e["ph"].get<std::string>();
    // nanoddp-train's own metadata: the run's batch per rank.
    if (ph == "M" && e.contains("name") && e["name"] == "run_config" && e.contains("args") &&
        e["args"].is_object()) {
      if (seen_run_config) fail("{}: event {} is a second 'run_config'", name, i);
      seen_run_config = true;
      if (const auto batch = read_run_config(e, name, i)) batch_per_rank = batch;
    }
    // A --zero run (comm/zero.cpp, comm/reducer_timeline.cpp) reduce-scatters its buckets and
    // all-gathers the parameters after the optimizer step: read as DDP, its comm would be 0 and
    // the all-gather optimizer time, and the step predicted as an all-reduce. Refused: the model
    // is DDP's all-reduce only.
    if (ph == "X" && e.contains("name") && e["name"].is_string()) {
      const std::string& span = e["name"].get_ref<const std::string&>();
      // Every span of ZeRO's collectives, --zero-overlap-gather's included ("all-gather bucket
      // N", "wait for all-gather", "launch all-gathers": an outside tester's trace got through).
      if (span.rfind("reduce-scatter", 0) == 0 || span.find("all-gather") != std::string::npos) {
        fail(
            "{}: a ZeRO trace (nanoddp-train --zero: event {} is '{}'); nanoddp-sim models DDP's "
            "all-reduce only, not reduce-scatter and all-gather: trace a run without --zero",
            name, i, span);
      }
    }
    if (ph != "X" && ph != "i") continue;
    ranks_with_events.insert(pid);
    if (!e.contains("name") || !e["name"].is_string()) fail("{}: event {} has no name", name, i);
    // Every event's time, whoever's: a marker at ts 1e300 sorted after every step and was
    // blamed on the last step's list of markers.
    const double ts_us = number(e, "ts", name, i);
    if (!(ts_us >= 0 && ts_us < kMaxTsUs)) {
      fail(
          "{}: event {} ('{}') has \"ts\": {:g} us; a time is a steady clock's reading in "
          "microseconds, from 0 to 2^53 (285 years): a damaged trace",
          name, i, e["name"].get_ref<const std::string&>(), ts_us);
    }
    if (pid != options.rank && !options.peers) continue;
    Span s;
    s.name = e["name"].get<std::string>();
    s.index = i;
    s.tid = static_cast<int>(number(e, "tid", name, i));
    s.ts_us = ts_us;
    const bool has_args = e.contains("args") && e["args"].is_object();
    if (ph == "i") {
      // Of the instants only the gradient markers matter ("bucket b ready" is the Reducer's
      // view of the same moments).
      if (!s.is_grad_marker()) continue;
      if (!has_args || !e["args"].contains("numel")) {
        fail("{}: event {} ('{}') has no \"numel\" argument", name, i, s.name);
      }
      s.numel = integer_arg(e, "numel", name, i, s.name);
      if (s.numel < 1 || s.name.size() <= 5) {
        fail("{}: event {} ('{}', numel {}) names no parameter with elements", name, i, s.name,
             s.numel);
      }
    } else {
      s.dur_us = number(e, "dur", name, i);
      if (s.dur_us < 0) fail("{}: event {} ('{}') has a negative duration", name, i, s.name);
      if (s.dur_us > kMaxSpanUs) {
        fail(
            "{}: event {} ('{}') lasts {:g} us, more than a day ({:g} us); no traced training "
            "step has such a span (a duration in another unit than microseconds?)",
            name, i, s.name, s.dur_us, kMaxSpanUs);
      }
      if (has_args && e["args"].contains("comm_hook") && e["args"]["comm_hook"].is_string() &&
          pid == options.rank) {
        const std::string hook = e["args"]["comm_hook"].get<std::string>();
        if (comm_hook && *comm_hook != hook) {
          fail(
              "{}: event {} ('{}') ran the comm hook '{}' where earlier all-reduces ran '{}'; "
              "one run has one hook",
              name, i, s.name, hook, *comm_hook);
        }
        comm_hook = hook;
      }
      if (has_args && e["args"].contains("elements")) {
        s.elements = integer_arg(e, "elements", name, i, s.name);
        if (s.elements < 0) {
          fail("{}: event {} ('{}') has \"elements\": {}; a count of elements is >= 0", name, i,
               s.name, s.elements);
        }
      }
    }
    by_rank[pid].push_back(std::move(s));
  }
  if (ranks.empty()) fail("--profile {}: the trace has no events", name);
  if (!ranks.contains(options.rank)) {
    fail("--rank {}: the trace {} holds ranks {}", options.rank, name, fmt::join(ranks, ", "));
  }
  // A rank named only by metadata (its spans cut out, its run_config kept) was blamed for having
  // no step left after --skip-steps.
  if (!ranks_with_events.contains(options.rank)) {
    if (ranks_with_events.empty()) fail("--profile {}: the trace has no events", name);
    fail(
        "--profile {}: rank {} has no events, only metadata (\"ph\": \"M\"); the trace holds "
        "the spans of rank(s) {}: pass one with --rank, or a trace with rank {}'s events",
        name, options.rank, fmt::join(ranks_with_events, ", "), options.rank);
  }
  for (auto& [pid, list] : by_rank) {
    // Stable: markers of one microsecond keep the order they were written in.
    std::stable_sort(list.begin(), list.end(),
                     [](const Span& a, const Span& b) { return a.ts_us < b.ts_us; });
    check_exclusive_compute(list, pid, name);
  }
  const std::vector<Span>& spans = by_rank[options.rank];

  const std::vector<std::size_t> forwards = forward_indices(spans);
  const auto skip = static_cast<std::size_t>(options.skip_steps);
  if (forwards.size() <= skip) {
    fail(
        "--profile {}: rank {} has {} \"forward\" span(s); with --skip-steps {} no step remains. "
        "Trace more steps (nanoddp-train --trace-steps N with N > {}; {} or more for medians "
        "worth the name).",
        name, options.rank, forwards.size(), options.skip_steps, options.skip_steps,
        options.skip_steps + kFewSteps);
  }

  // The parameters: from the "grad" markers when the trace has them (checked against the
  // shape flags when given), else from the shape (nanoddp-train's defaults without flags).
  const bool markers =
      std::any_of(spans.begin(), spans.end(), [](const Span& sp) { return sp.is_grad_marker(); });
  const MlpShape shape = options.shape.value_or(MlpShape{});
  std::vector<ParameterInfo> params;
  std::string model;
  if (markers) {
    const std::size_t f = skip;
    const StepGrads first = marker_grads(spans, forwards[f], step_end(forwards, f, spans.size()));
    if (first.layout.empty()) {
      fail("{}: step {} of rank {} has no \"grad\" markers, other steps have them", name, f + 1,
           options.rank);
    }
    if (options.shape) {
      params = mlp_parameters(*options.shape);
      if (!same_parameters(first.layout, params)) {
        fail(
            "{}: the trace's \"grad\" markers (rank {}, step {}) list {}; but the shape flags "
            "--in {} --out {} --hidden {} --layers {} mean {}. The markers record the traced "
            "model: drop the shape flags, or pass the traced run's.",
            name, options.rank, f + 1, list_parameters(first.layout), options.shape->in,
            options.shape->out, options.shape->hidden, options.shape->layers,
            list_parameters(params));
      }
      // The flags' layout is FlatParameters' by construction (the bucket test checks it); the
      // markers give each parameter's time by name.
      model = describe(*options.shape);
    } else {
      params = first.layout;
      model = fmt::format("{} parameters ({} elements) from the trace's \"grad\" markers",
                          params.size(),
                          checked_numel(params, fmt::format("{}: the \"grad\" markers of rank {}, "
                                                            "step {}",
                                                            name, options.rank, f + 1)));
    }
  } else {
    params = mlp_parameters(shape);
    model = describe(shape);
  }
  const GradSource source{.markers = markers,
                          .params = &params,
                          .n_linear = static_cast<std::size_t>(shape.layers + 1)};

  std::vector<StepSample> samples;
  for (std::size_t f = skip; f < forwards.size(); ++f) {
    const Span& forward = spans[forwards[f]];
    const std::size_t last = step_end(forwards, f, spans.size());
    // The step starts with its data preparation, just before the forward (nanoddp-train's
    // step_ms runs from there to the end of the optimizer step, without the data time).
    const Span* data = nullptr;
    for (std::size_t i = forwards[f]; i-- > (f > 0 ? forwards[f - 1] : 0);) {
      if (spans[i].tid == kDataTrack && spans[i].name == "data") {
        data = &spans[i];
        break;
      }
    }
    const int step_number = static_cast<int>(f) + 1;
    StepSample s;
    s.forward_ms = forward.dur_us / 1000.0;
    std::vector<const Span*> nodes;
    bool has_optimizer = false;
    double optimizer_end_us = 0;
    double wait_us = 0;
    double wait_start_us = 0;
    for (std::size_t i = forwards[f] + 1; i < last; ++i) {
      const Span& sp = spans[i];
      if (sp.is_backward_node()) nodes.push_back(&sp);
      if (sp.tid == kComputeTrack && sp.name == "wait for all-reduce") {
        wait_us += sp.dur_us;
        wait_start_us = sp.ts_us;
      }
      if (sp.tid == kComputeTrack && sp.name == "optimizer update") {
        fail(
            "{}: step {} of rank {} was traced with --optimizer-in-backward (its updates run "
            "inside backward, as \"optimizer update\" spans). The simulator models the "
            "optimizer step after backward: trace a run without --optimizer-in-backward.",
            name, step_number, options.rank);
      }
      if (sp.tid == kComputeTrack && sp.name == "optimizer step") {
        if (has_optimizer) {
          fail("{}: step {} of rank {} has two \"optimizer step\" spans", name, step_number,
               options.rank);
        }
        has_optimizer = true;
        s.optimizer_ms = sp.dur_us / 1000.0;
        optimizer_end_us = sp.end_us();
      }
      if (sp.tid == kCommTrack && sp.name.rfind("all-reduce bucket ", 0) == 0) {
        int index = -1;
        try {
          index = std::stoi(sp.name.substr(18));
        } catch (const std::exception&) {
          fail("{}: unreadable bucket number in '{}'", name, sp.name);
        }
        s.buckets[index] = {sp.elements, sp.dur_us / 1000.0};
      }
      if (sp.is_collective()) s.collectives[sp.name] = &sp;
    }
    if (!has_optimizer) {
      fail(
          "{}: step {} of rank {} has no \"optimizer step\" span between its forward and the "
          "next one. The simulator models one forward/backward per optimizer step: trace a run "
          "without --grad-accum, and without skipped (NaN) steps.",
          name, step_number, options.rank);
    }
    if (nodes.empty()) {
      fail("{}: step {} of rank {} has no \"backward <op>\" span", name, step_number, options.rank);
    }
    if (!markers) {
      const std::size_t n_linear = linear_grads(spans, forwards[f], last).n_linear;
      if (n_linear != source.n_linear) {
        fail(
            "{}: step {} of rank {} has {} \"backward linear\" spans, but --layers {} means {} "
            "Linear layers. Pass the --in/--out/--hidden/--layers of the traced run.",
            name, step_number, options.rank, n_linear, shape.layers, source.n_linear);
      }
    }
    const std::vector<double> ready_us =
        step_ready_us(spans, forwards[f], last, source,
                      fmt::format("{}: step {} of rank {}", name, step_number, options.rank));
    const double backward_start = nodes.front()->ts_us;
    s.backward_start_us = backward_start;
    double backward_end = backward_start;
    for (const Span* node : nodes) backward_end = std::max(backward_end, node->end_us());
    // The last gradient's hooks run after its node's span ends.
    for (double r : ready_us) backward_end = std::max(backward_end, r);
    // With DDP, backward ends where the Reducer's finalize starts to wait: after the last node,
    // autograd still releases the graph (a fraction of a millisecond that hides the start of
    // the last bucket's all-reduce). Without DDP that tail cannot be told apart from what
    // follows, and goes to "other".
    backward_end = std::max(backward_end, wait_start_us);
    for (double r : ready_us) s.ready_ms.push_back((r - backward_start) / 1000.0);
    s.backward_end_ms = (backward_end - backward_start) / 1000.0;
    s.wait_ms = wait_us / 1000.0;
    s.data_ms = data != nullptr ? data->dur_us / 1000.0 : 0.0;
    const double step_start_us = data != nullptr ? data->ts_us : forward.ts_us;
    s.step_ms = (optimizer_end_us - step_start_us) / 1000.0 - s.data_ms;
    if (s.step_ms > kMaxSpanUs / 1000.0) {
      fail(
          "{}: step {} of rank {} runs {:g} ms from its data to the end of its optimizer step, "
          "more than a day; the trace's times are not those of a training step",
          name, step_number, options.rank, s.step_ms);
    }
    samples.push_back(std::move(s));
  }

  const auto median_of = [&](auto get) {
    std::vector<double> values;
    for (const StepSample& s : samples) values.push_back(get(s));
    return median(values);
  };

  ComputeProfile profile;
  profile.forward_ms = median_of([](const StepSample& s) { return s.forward_ms; });
  profile.optimizer_ms = median_of([](const StepSample& s) { return s.optimizer_ms; });
  profile.data_ms = median_of([](const StepSample& s) { return s.data_ms; });
  const double backward_end = median_of([](const StepSample& s) { return s.backward_end_ms; });

  // Each gradient's work is the time since the latest earlier one in layout order (a Linear's
  // weight is ready with its bias: no work of its own). Medians of cumulative times need not be
  // monotone: clamp at zero.
  double previous = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double ready = median_of([i](const StepSample& s) { return s.ready_ms[i]; });
    profile.grads.push_back({params[i].name, params[i].numel, std::max(0.0, ready - previous)});
    previous = std::max(previous, ready);
  }
  profile.backward_tail_ms = std::max(0.0, backward_end - previous);
  if (options.peers) {
    profile.peers_ready_ms =
        peers_ready(by_rank, options.rank, samples, skip, source, name, profile.warnings);
  }

  // "Other" closes the books: the median step minus the medians of its parts, so that the
  // profile replayed on the traced run's own world reproduces its median step.
  const double step_ms = median_of([](const StepSample& s) { return s.step_ms; });
  // Every span of zero length and at one moment (a clock that did not run, a hand-made file):
  // an efficiency or a speed-up against a step of no time is meaningless.
  if (!(step_ms > 0)) {
    fail(
        "--profile {}: the median step of rank {} lasts {:g} ms (from its data to the end of its "
        "optimizer step, data excluded); a step takes time: the trace's times are not a run's",
        name, options.rank, step_ms);
  }
  const double wait_ms = median_of([](const StepSample& s) { return s.wait_ms; });
  profile.other_ms =
      std::max(0.0, step_ms - profile.forward_ms - backward_end - wait_ms - profile.optimizer_ms);

  // The traced run's own figures, and a check that the parameters match its buckets.
  MeasuredStep measured;
  measured.world_size = static_cast<int>(ranks.size());
  measured.step_ms = step_ms;
  {
    std::vector<double> steps;
    for (const StepSample& s : samples) steps.push_back(s.step_ms);
    measured.step_p10_ms = common::quantile(steps, 0.1);
    measured.step_p90_ms = common::quantile(steps, 0.9);
    measured.steps = static_cast<int>(steps.size());
  }
  measured.exposed_comm_ms = wait_ms;
  const StepSample& last = samples.back();
  if (!last.buckets.empty()) {
    std::int64_t elements = 0;
    for (const auto& [index, bucket] : last.buckets) {
      measured.bucket_numel.push_back(bucket.first);
      if (__builtin_add_overflow(elements, bucket.first, &elements) ||
          elements > kMaxTraceElements) {
        fail("{}: the all-reduce spans of rank {} cover more than 2^40 ({}) elements in all", name,
             options.rank, kMaxTraceElements);
      }
      measured.bucket_allreduce_ms.push_back(median_of([index](const StepSample& s) {
        const auto it = s.buckets.find(index);
        return it == s.buckets.end() ? 0.0 : it->second.second;
      }));
    }
    const std::int64_t numel = checked_numel(params, name);
    if (elements != numel) {
      fail(
          "{}: the all-reduce spans of rank {} cover {} gradient elements, but {} has {}. Pass "
          "the --in/--out/--hidden/--layers of the traced run.",
          name, options.rank, elements, model, numel);
    }
    // The Reducer's buckets are contiguous runs of its layout: each must end on a parameter
    // boundary of ours, or our layout order is not FlatParameters' (see marker_grads).
    std::set<std::int64_t> boundaries;
    std::int64_t offset = 0;
    for (const ParameterInfo& p : params) boundaries.insert(offset += p.numel);
    offset = 0;
    for (std::size_t b = 0; b < measured.bucket_numel.size(); ++b) {
      offset += measured.bucket_numel[b];
      if (!boundaries.contains(offset)) {
        fail(
            "{}: all-reduce bucket {} of rank {} ends {} elements into the gradients, inside a "
            "parameter of the layout assumed ({}); the traced model's layout differs from "
            "it. For an MLP pass the --in/--out/--hidden/--layers of the traced run.",
            name, b, options.rank, offset, list_parameters(params));
      }
    }
    measured.comm_ms = median_of([](const StepSample& s) {
      double total = 0;
      for (const auto& [index, bucket] : s.buckets) total += bucket.second;
      return total;
    });
  }
  profile.measured = measured;
  profile.batch = batch_per_rank;
  profile.comm_hook = comm_hook;
  // Without markers only the number of Linear layers is checked (by the "backward linear"
  // spans); a DDP trace's all-reduce spans check the element count too. A 1-rank one has none:
  // a --hidden other than the traced run's would price the wrong gradients without a word.
  if (samples.size() < kFewSteps) {
    profile.warnings.push_back(fmt::format(
        "--profile {}: {} step(s) of rank {} kept after --skip-steps {}; a median of so few is "
        "one step's noise: trace {} or more (nanoddp-train --trace-steps)",
        name, samples.size(), options.rank, options.skip_steps, options.skip_steps + kFewSteps));
  }
  if (!markers && last.buckets.empty()) {
    profile.warnings.push_back(fmt::format(
        "--profile {}: an older trace (no \"grad\" markers, no all-reduce spans): the "
        "parameter sizes come from {} ({}) and cannot be checked against it, only the number of "
        "Linear layers; pass the --in/--out/--hidden/--layers of the traced run",
        name,
        options.shape ? "the shape flags" : "nanoddp-train's default shape (no shape flag given)",
        describe(shape)));
  }

  profile.other_includes_sync = ranks.size() > 1;
  profile.source = fmt::format(
      "trace {} (rank {} of {}; medians of {} steps, {} warm-up step(s) skipped{}{}); {}", name,
      options.rank, ranks.size(), samples.size(), options.skip_steps,
      options.peers ? "; with the slowest rank's gradient times" : "",
      batch_per_rank ? fmt::format("; batch {} per rank", *batch_per_rank) : "", model);
  return profile;
}

}  // namespace nanoddp::sim
