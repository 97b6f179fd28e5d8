#include "nanoddp/engine/trace.h"

#include <fmt/format.h>

#include <atomic>
#include <fstream>

#include "nanoddp/engine/error.h"

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
  Event e{name, track, to_us(start), std::max(0.0, to_us(end) - to_us(start)), args};
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(e));
}

void Tracer::instant(const std::string& name, TraceTrack track, Clock::time_point at,
                     const std::map<std::string, std::string>& args) {
  Event e{name, track, to_us(at), -1.0, args};
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(e));
}

std::size_t Tracer::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::string Tracer::events_json() const {
  std::string out = fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{0},"args":{{"name":"rank {0}"}}}},)"
      R"({{"name":"process_sort_index","ph":"M","pid":{0},"args":{{"sort_index":{0}}}}})",
      rank_);
  for (TraceTrack track : {TraceTrack::kCompute, TraceTrack::kCommunication, TraceTrack::kMarkers,
                           TraceTrack::kData}) {
    out += fmt::format(R"(,{{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":{}}}}})",
                       rank_, static_cast<int>(track), quoted(track_name(track)));
  }
  std::lock_guard lock(mutex_);
  for (const Event& e : events_) {
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

void Tracer::write_file(const std::string& path, const std::vector<std::string>& ranks_events) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) fail("cannot open the trace file '{}' for writing", path);
  out << R"({"displayTimeUnit":"ms","traceEvents":[)";
  bool first = true;
  for (const std::string& events : ranks_events) {
    if (events.empty()) continue;
    if (!first) out << ",\n";
    out << events;
    first = false;
  }
  out << "]}\n";
  if (!out) fail("writing the trace file '{}' failed (disk full?)", path);
}

Tracer* active_tracer() { return g_active_tracer.load(std::memory_order_acquire); }

TraceScope::TraceScope(Tracer* tracer) : previous_(g_active_tracer.exchange(tracer)) {}
TraceScope::~TraceScope() { g_active_tracer.store(previous_); }

}  // namespace nanoddp
