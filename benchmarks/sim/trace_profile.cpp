#include "benchmarks/sim/trace_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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
};

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
  std::vector<Span> spans;
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
    if (e["ph"].get<std::string>() != "X" || pid != options.rank) continue;
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
    spans.push_back(std::move(s));
  }
  if (ranks.empty()) fail("--profile {}: the trace has no events", name);
  if (!ranks.contains(options.rank)) {
    fail("--rank {}: the trace {} holds ranks {}", options.rank, name, fmt::join(ranks, ", "));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.ts_us < b.ts_us; });

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
      "trace {} (rank {} of {}; medians of {} steps, {} warm-up step(s) skipped); {}", name,
      options.rank, ranks.size(), samples.size(), options.skip_steps, describe(options.shape));
  return profile;
}

}  // namespace nanoddp::sim
