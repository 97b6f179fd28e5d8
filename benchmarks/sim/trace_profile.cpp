#include "benchmarks/sim/trace_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "benchmarks/sim/error.h"
#include "benchmarks/sim/stats.h"

namespace nanoddp::sim {

namespace {

using nlohmann::json;

// Track ids of nanoddp/engine/trace.h's TraceTrack.
constexpr int kComputeTrack = 0;
constexpr int kCommTrack = 1;
constexpr int kDataTrack = 3;

struct Span {
  std::string name;
  int tid = 0;
  double ts_us = 0;
  double dur_us = 0;
  std::int64_t elements = -1;  // all-reduce spans
  double end_us() const { return ts_us + dur_us; }
};

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
  std::vector<double> linear_ready_ms;  // end of each "backward linear", from backward's start
  double backward_end_ms = 0;
  double wait_ms = 0;
  double optimizer_ms = 0;
  std::map<int, std::pair<std::int64_t, double>> buckets;  // index -> (elements, ms)
  double backward_start_us = 0;                            // on the trace's clock (for the peers)
  double allreduce_end_us = -1;  // end of the last all-reduce span; -1 without one
};

// What the peers contribute to one step: when each "backward linear" span ended and when the
// step's last all-reduce ended, on the trace's clock.
struct PeerStep {
  std::vector<double> linear_end_us;
  double allreduce_end_us = -1;
};

// Cuts one rank's spans (sorted by start) into steps at its "forward" spans.
std::vector<PeerStep> peer_steps(const std::vector<Span>& spans) {
  std::vector<PeerStep> steps;
  for (const Span& sp : spans) {
    if (sp.tid == kComputeTrack && sp.name == "forward") steps.emplace_back();
    if (steps.empty()) continue;
    if (sp.tid == kComputeTrack && sp.name == "backward linear") {
      steps.back().linear_end_us.push_back(sp.end_us());
    }
    if (sp.tid == kCommTrack && sp.name.rfind("all-reduce bucket ", 0) == 0) {
      steps.back().allreduce_end_us = std::max(steps.back().allreduce_end_us, sp.end_us());
    }
  }
  return steps;
}

// Medians over the kept steps of the slowest rank's "backward linear" ends, from this rank's
// backward start: one per Linear, in backward order. Checks that the ranks share a clock.
std::vector<double> peers_ready(const std::map<int, std::vector<Span>>& by_rank, int rank,
                                const std::vector<StepSample>& samples, std::size_t skip,
                                std::size_t n_linear, const std::string& name) {
  if (by_rank.size() < 2) {
    fail("--peers traced: {} holds one rank; the slowest rank needs a trace of several", name);
  }
  // Per step the latest over every rank, this one included: the collective starts when the
  // last rank arrives, whoever it is that step.
  std::vector<std::vector<double>> latest(n_linear, std::vector<double>(samples.size()));
  for (std::size_t k = 0; k < n_linear; ++k) {
    for (std::size_t s = 0; s < samples.size(); ++s) latest[k][s] = samples[s].linear_ready_ms[k];
  }
  std::vector<double> clock_gaps;
  for (const auto& [peer, spans] : by_rank) {
    if (peer == rank) continue;
    const std::vector<PeerStep> steps = peer_steps(spans);
    if (steps.size() != samples.size() + skip) {
      fail("--peers traced: in {}, rank {} has {} steps and rank {} has {}", name, peer,
           steps.size(), rank, samples.size() + skip);
    }
    for (std::size_t s = 0; s < samples.size(); ++s) {
      const PeerStep& step = steps[s + skip];
      const StepSample& own = samples[s];
      if (step.linear_end_us.size() != n_linear) {
        fail("--peers traced: step {} of rank {} in {} has {} \"backward linear\" spans, not {}",
             s + skip + 1, peer, name, step.linear_end_us.size(), n_linear);
      }
      if (step.allreduce_end_us < 0 || own.allreduce_end_us < 0) {
        fail("--peers traced: step {} of {} has no all-reduce span; the peers need a DDP trace",
             s + skip + 1, name);
      }
      clock_gaps.push_back(std::fabs(step.allreduce_end_us - own.allreduce_end_us) / 1000.0);
      for (std::size_t k = 0; k < n_linear; ++k) {
        latest[k][s] =
            std::max(latest[k][s], (step.linear_end_us[k] - own.backward_start_us) / 1000.0);
      }
    }
  }
  // The last all-reduce of a step ends at the same moment on every rank (within the time a
  // rank takes to notice); far apart, the ranks' times are not on one clock.
  constexpr double kMaxClockGapMs = 1.0;
  const double gap = median(clock_gaps);
  if (gap > kMaxClockGapMs) {
    fail(
        "--peers traced: in {} the same all-reduce ends {:.3g} ms apart on different ranks "
        "(median); the ranks' clocks differ (traced on several hosts?). Use --peers identical.",
        name, gap);
  }
  std::vector<double> ready;
  for (std::size_t k = 0; k < n_linear; ++k) ready.push_back(median(latest[k]));
  return ready;
}

}  // namespace

ComputeProfile profile_from_trace(const std::string& path, const TraceProfileOptions& options) {
  std::ifstream in(path);
  if (!in) fail("--profile {}: cannot open the file", path);
  std::stringstream text;
  text << in.rdbuf();
  return profile_from_trace_text(text.str(), path, options);
}

ComputeProfile profile_from_trace_text(const std::string& text, const std::string& name,
                                       const TraceProfileOptions& options) {
  const std::vector<ParameterInfo> params = mlp_parameters(options.shape);
  const std::size_t n_linear = static_cast<std::size_t>(options.shape.layers + 1);
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

  std::set<int> ranks;
  std::map<int, std::vector<Span>> by_rank;  // only options.rank's unless the peers are wanted
  const json& events = doc["traceEvents"];
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (!e.is_object()) fail("{}: event {} is not an object", name, i);
    if (!e.contains("ph") || !e["ph"].is_string() || !e.contains("pid") ||
        !e["pid"].is_number_integer()) {
      fail("{}: event {} has no \"ph\" or integer \"pid\": not a Chrome trace", name, i);
    }
    const int pid = e["pid"].get<int>();
    ranks.insert(pid);
    if (e["ph"].get<std::string>() != "X" || (pid != options.rank && !options.peers)) continue;
    Span s;
    if (!e.contains("name") || !e["name"].is_string()) fail("{}: event {} has no name", name, i);
    s.name = e["name"].get<std::string>();
    s.tid = static_cast<int>(number(e, "tid", name, i));
    s.ts_us = number(e, "ts", name, i);
    s.dur_us = number(e, "dur", name, i);
    if (s.dur_us < 0) fail("{}: event {} ('{}') has a negative duration", name, i, s.name);
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("elements")) {
      const json& el = e["args"]["elements"];
      try {
        s.elements = el.is_string() ? std::stoll(el.get<std::string>()) : el.get<std::int64_t>();
      } catch (const std::exception&) {
        fail("{}: event {} ('{}') has an unreadable \"elements\" argument", name, i, s.name);
      }
    }
    by_rank[pid].push_back(std::move(s));
  }
  if (ranks.empty()) fail("--profile {}: the trace has no events", name);
  if (!ranks.contains(options.rank)) {
    fail("--rank {}: the trace {} holds ranks {}", options.rank, name, fmt::join(ranks, ", "));
  }
  for (auto& [pid, list] : by_rank) {
    std::sort(list.begin(), list.end(),
              [](const Span& a, const Span& b) { return a.ts_us < b.ts_us; });
  }
  const std::vector<Span>& spans = by_rank[options.rank];

  std::vector<std::size_t> forwards;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].tid == kComputeTrack && spans[i].name == "forward") forwards.push_back(i);
  }
  const auto skip = static_cast<std::size_t>(options.skip_steps);
  if (forwards.size() <= skip) {
    fail(
        "--profile {}: rank {} has {} \"forward\" span(s); with --skip-steps {} no step remains. "
        "Trace more steps (nanoddp-train --trace-steps N with N > {}).",
        name, options.rank, forwards.size(), options.skip_steps, options.skip_steps + 1);
  }

  std::vector<StepSample> samples;
  for (std::size_t f = skip; f < forwards.size(); ++f) {
    const Span& forward = spans[forwards[f]];
    const double window_end = f + 1 < forwards.size() ? spans[forwards[f + 1]].ts_us
                                                      : std::numeric_limits<double>::infinity();
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
    std::vector<const Span*> linears;
    bool has_optimizer = false;
    double optimizer_end_us = 0;
    double wait_us = 0;
    double wait_start_us = 0;
    for (std::size_t i = forwards[f] + 1; i < spans.size() && spans[i].ts_us < window_end; ++i) {
      const Span& sp = spans[i];
      if (sp.tid == kComputeTrack && sp.name.rfind("backward ", 0) == 0) {
        nodes.push_back(&sp);
        if (sp.name == "backward linear") linears.push_back(&sp);
      }
      if (sp.tid == kComputeTrack && sp.name == "wait for all-reduce") {
        wait_us += sp.dur_us;
        wait_start_us = sp.ts_us;
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
        s.allreduce_end_us = std::max(s.allreduce_end_us, sp.end_us());
      }
    }
    if (!has_optimizer) {
      fail(
          "{}: step {} of rank {} has no \"optimizer step\" span between its forward and the "
          "next one. The simulator models one forward/backward per optimizer step: trace a run "
          "without --grad-accum, and without skipped (NaN) steps.",
          name, step_number, options.rank);
    }
    if (linears.size() != n_linear) {
      fail(
          "{}: step {} of rank {} has {} \"backward linear\" spans, but --layers {} means {} "
          "Linear layers. Pass the --in/--out/--hidden/--layers of the traced run.",
          name, step_number, options.rank, linears.size(), options.shape.layers, n_linear);
    }
    const double backward_start = nodes.front()->ts_us;
    s.backward_start_us = backward_start;
    double backward_end = backward_start;
    for (const Span* node : nodes) backward_end = std::max(backward_end, node->end_us());
    // With DDP, backward ends where the Reducer's finalize starts to wait: after the last node,
    // autograd still releases the graph (a fraction of a millisecond that hides the start of
    // the last bucket's all-reduce). Without DDP that tail cannot be told apart from what
    // follows, and goes to "other".
    backward_end = std::max(backward_end, wait_start_us);
    for (const Span* lin : linears)
      s.linear_ready_ms.push_back((lin->end_us() - backward_start) / 1000.0);
    s.backward_end_ms = (backward_end - backward_start) / 1000.0;
    s.wait_ms = wait_us / 1000.0;
    s.data_ms = data != nullptr ? data->dur_us / 1000.0 : 0.0;
    const double step_start_us = data != nullptr ? data->ts_us : forward.ts_us;
    s.step_ms = (optimizer_end_us - step_start_us) / 1000.0 - s.data_ms;
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
  std::vector<double> ready(n_linear);
  for (std::size_t k = 0; k < n_linear; ++k) {
    ready[k] = median_of([k](const StepSample& s) { return s.linear_ready_ms[k]; });
  }
  const double backward_end = median_of([](const StepSample& s) { return s.backward_end_ms; });

  // Layout order pairs (bias, weight) per Linear from the last; the k-th backward linear node
  // produces pair k. Medians of cumulative times need not be monotone: clamp at zero.
  double previous = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t k = i / 2;
    double work = 0;
    if (i % 2 == 0) {
      work = std::max(0.0, ready[k] - previous);
      previous = std::max(previous, ready[k]);
    }
    profile.grads.push_back({params[i].name, params[i].numel, work});
  }
  profile.backward_tail_ms = std::max(0.0, backward_end - previous);
  if (options.peers) {
    const std::vector<double> peers =
        peers_ready(by_rank, options.rank, samples, skip, n_linear, name);
    for (std::size_t i = 0; i < params.size(); ++i) profile.peers_ready_ms.push_back(peers[i / 2]);
  }

  // "Other" closes the books: the median step minus the medians of its parts, so that the
  // profile replayed on the traced run's own world reproduces its median step.
  const double step_ms = median_of([](const StepSample& s) { return s.step_ms; });
  const double wait_ms = median_of([](const StepSample& s) { return s.wait_ms; });
  profile.other_ms =
      std::max(0.0, step_ms - profile.forward_ms - backward_end - wait_ms - profile.optimizer_ms);

  // The traced run's own figures, and a check that the shape matches its buckets.
  MeasuredStep measured;
  measured.world_size = static_cast<int>(ranks.size());
  measured.step_ms = step_ms;
  measured.exposed_comm_ms = wait_ms;
  const StepSample& last = samples.back();
  if (!last.buckets.empty()) {
    std::int64_t elements = 0;
    for (const auto& [index, bucket] : last.buckets) {
      measured.bucket_numel.push_back(bucket.first);
      elements += bucket.first;
      measured.bucket_allreduce_ms.push_back(median_of([index](const StepSample& s) {
        const auto it = s.buckets.find(index);
        return it == s.buckets.end() ? 0.0 : it->second.second;
      }));
    }
    std::int64_t numel = 0;
    for (const ParameterInfo& p : params) numel += p.numel;
    if (elements != numel) {
      fail(
          "{}: the all-reduce spans of rank {} cover {} gradient elements, but {} has {}. Pass "
          "the --in/--out/--hidden/--layers of the traced run.",
          name, options.rank, elements, describe(options.shape), numel);
    }
    measured.comm_ms = median_of([](const StepSample& s) {
      double total = 0;
      for (const auto& [index, bucket] : s.buckets) total += bucket.second;
      return total;
    });
  }
  profile.measured = measured;
  profile.other_includes_sync = ranks.size() > 1;
  profile.source = fmt::format(
      "trace {} (rank {} of {}; medians of {} steps, {} warm-up step(s) skipped{}); {}", name,
      options.rank, ranks.size(), samples.size(), options.skip_steps,
      options.peers ? "; with the slowest rank's gradient times" : "", describe(options.shape));
  return profile;
}

}  // namespace nanoddp::sim
