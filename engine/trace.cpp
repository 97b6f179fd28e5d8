#include "nanoddp/engine/trace.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "nanoddp/kernels/error.h"

namespace nanoddp {

namespace {

std::atomic<Tracer*> g_active_tracer{nullptr};

// Minimal JSON string escaping (names and args are ours: parameter names, op names, numbers).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

const char* track_name(TraceTrack track) {
  switch (track) {
    case TraceTrack::kCompute:
      return "compute";
    case TraceTrack::kCommunication:
      return "communication";
    case TraceTrack::kMarkers:
      return "markers";
    case TraceTrack::kData:
      return "data";
  }
  return "other";
}

}  // namespace

Tracer::Tracer(int rank) : rank_(rank) {}

double Tracer::to_us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

void Tracer::span(const std::string& name, TraceTrack track, Clock::time_point start,
                  Clock::time_point end, const std::map<std::string, std::string>& args) {
  Record e{name, track, to_us(start), std::max(0.0, to_us(end) - to_us(start)), args};
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(e));
}

void Tracer::instant(const std::string& name, TraceTrack track, Clock::time_point at,
                     const std::map<std::string, std::string>& args) {
  Record e{name, track, to_us(at), -1.0, args};
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(e));
}

void Tracer::anchor_for(Device device) {
  if (device.is_cpu()) return;  // CPU events are host times already
  std::lock_guard lock(mutex_);
  if (!anchors_.contains(device.index)) {
    anchors_.emplace(device.index, ClockAnchor(Stream::compute(device)));
  }
}

void Tracer::device_span(std::string name, TraceTrack track, Event begin, Event end,
                         std::map<std::string, std::string> args) {
  NANODDP_CHECK(begin.device() == end.device(), "a device span's events are on {} and {}",
                begin.device().str(), end.device().str());
  std::lock_guard lock(mutex_);
  NANODDP_CHECK(begin.device().is_cpu() || anchors_.contains(begin.device().index),
                "device span '{}' on {}: call anchor_for() before recording its events", name,
                begin.device().str());
  device_spans_.push_back(
      {std::move(name), track, std::move(begin), std::move(end), std::move(args)});
}

void Tracer::instant_on(Device device, Clock::time_point host_time, std::string name,
                        TraceTrack track, std::map<std::string, std::string> args) {
  if (device.is_cpu()) {
    instant(name, track, host_time, args);
    return;
  }
  anchor_for(device);
  Event at(device);
  at.record(Stream::compute(device));
  std::lock_guard lock(mutex_);
  device_spans_.push_back(
      {std::move(name), track, std::move(at), Event(device), std::move(args), /*instant=*/true});
}

std::size_t Tracer::resolve_device_spans(Pending pending) const {
  if (device_spans_.empty()) return 0;
  std::size_t dropped = 0;
  // CPU events are host times: an anchor made now maps them back to within nanoseconds (their
  // intervals to it are negative, which only a GPU's event timer would refuse).
  const ClockAnchor cpu_anchor(Stream::compute(Device::cpu()));
  for (DeviceSpan& d : device_spans_) {
    // The trace is written after the traced steps: normally the events have happened already.
    const ClockAnchor& anchor =
        d.begin.device().is_cpu() ? cpu_anchor : anchors_.at(d.begin.device().index);
    if (pending == Pending::kDrop && !(d.instant ? d.begin : d.end).query()) {
      ++dropped;
      continue;
    }
    if (d.instant) {
      d.begin.synchronize();
      events_.push_back({std::move(d.name), d.track, to_us(anchor.host_time_of(d.begin)), -1.0,
                         std::move(d.args)});
      continue;
    }
    d.end.synchronize();
    // The duration from the span's own events, not as a difference of two anchored times:
    // a GPU's event intervals are float milliseconds, coarse far from the anchor.
    events_.push_back({std::move(d.name), d.track, to_us(anchor.host_time_of(d.begin)),
                       std::max(0.0, 1000.0 * d.begin.elapsed_ms(d.end)), std::move(d.args)});
  }
  device_spans_.clear();
  return dropped;
}

std::size_t Tracer::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::string Tracer::events_json(Pending pending, std::size_t* dropped) const {
  std::string out = fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{0},"args":{{"name":"rank {0}"}}}},)"
      R"({{"name":"process_sort_index","ph":"M","pid":{0},"args":{{"sort_index":{0}}}}})",
      rank_);
  for (TraceTrack track : {TraceTrack::kCompute, TraceTrack::kCommunication, TraceTrack::kMarkers,
                           TraceTrack::kData}) {
    out +=
        fmt::format(R"(,{{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":{}}}}})",
                    rank_, static_cast<int>(track), quoted(track_name(track)));
  }
  std::lock_guard lock(mutex_);
  const std::size_t left_out = resolve_device_spans(pending);
  if (dropped != nullptr) *dropped = left_out;
  for (const Record& e : events_) {
    std::string args;
    for (const auto& [k, v] : e.args) {
      args += fmt::format("{}{}:{}", args.empty() ? "" : ",", quoted(k), quoted(v));
    }
    if (e.dur_us >= 0) {
      out += fmt::format(
          R"(,{{"name":{},"cat":{},"ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
          quoted(e.name), quoted(track_name(e.track)), e.ts_us, e.dur_us, rank_,
          static_cast<int>(e.track), args);
    } else {
      out += fmt::format(
          R"(,{{"name":{},"cat":{},"ph":"i","s":"t","ts":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
          quoted(e.name), quoted(track_name(e.track)), e.ts_us, rank_, static_cast<int>(e.track),
          args);
    }
  }
  return out;
}

std::vector<std::string_view> Tracer::file_pieces(const std::vector<std::string>& ranks_events) {
  std::vector<std::string_view> pieces = {R"({"displayTimeUnit":"ms","traceEvents":[)"};
  for (const std::string& events : ranks_events) {
    if (events.empty()) continue;
    if (pieces.size() > 1) pieces.push_back(",\n");
    pieces.push_back(events);
  }
  pieces.push_back("]}\n");
  return pieces;
}

Tracer* active_tracer() {
  return g_active_tracer.load(std::memory_order_acquire);
}

TraceSpan::TraceSpan(const char* name, TraceTrack track, Device device)
    : tracer_(active_tracer()), track_(track), device_(device) {
  if (tracer_ == nullptr) return;
  name_ = name;
  begin();
}

TraceSpan::TraceSpan(Tracer* tracer, std::string name, TraceTrack track, Device device,
                     std::map<std::string, std::string> args)
    : tracer_(tracer),
      name_(std::move(name)),
      track_(track),
      device_(device),
      args_(std::move(args)) {
  if (tracer_ != nullptr) begin();
}

void TraceSpan::begin() {
  if (device_.is_cpu()) {
    start_ = Tracer::Clock::now();
    return;
  }
  tracer_->anchor_for(device_);
  begin_ = Event(device_);
  begin_.record(Stream::compute(device_));
}

TraceSpan::~TraceSpan() {
  if (tracer_ == nullptr) return;
  if (device_.is_cpu()) {
    tracer_->span(name_, track_, start_, Tracer::Clock::now(), args_);
    return;
  }
  // A destructor must not throw: a failing CUDA call here loses the span, not the program.
  try {
    Event end(device_);
    end.record(Stream::compute(device_));
    tracer_->device_span(std::move(name_), track_, std::move(begin_), std::move(end),
                         std::move(args_));
  } catch (const std::exception&) {
  }
}

TraceScope::TraceScope(Tracer* tracer) : previous_(g_active_tracer.exchange(tracer)) {}
TraceScope::~TraceScope() {
  g_active_tracer.store(previous_);
}

}  // namespace nanoddp
