#pragma once
// Timelines: Chrome trace JSON ("Trace Event Format"), which Perfetto (ui.perfetto.dev) and
// chrome://tracing open. One process per rank, one track per kind of work: compute (forward,
// each backward node, optimizer step), communication (each bucket's all-reduce), and markers
// (each parameter's gradient becoming final, "grad <name>"; each bucket becoming ready). Seeing
// the all-reduce spans of bucket 0 start while backward spans are still running on the compute
// track is seeing the overlap.
//
// Recording is off unless a Tracer is installed (TraceScope); then each span costs a clock read
// and a vector push under a mutex. Times are steady_clock, which on one machine is the same
// clock in every process, so the ranks' tracks line up.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace nanoddp {

enum class TraceTrack : int { kCompute = 0, kCommunication = 1, kMarkers = 2, kData = 3 };

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Tracer(int rank);

  // A span [start, end) on `track`; `args` become the event's arguments (values as text).
  void span(const std::string& name, TraceTrack track, Clock::time_point start,
            Clock::time_point end, const std::map<std::string, std::string>& args = {});
  // A point in time.
  void instant(const std::string& name, TraceTrack track, Clock::time_point at,
               const std::map<std::string, std::string>& args = {});

  // This rank's events as a JSON array body (comma-separated objects, no brackets), with the
  // metadata that names the process ("rank R") and its tracks.
  std::string events_json() const;
  // Writes a complete trace file from several ranks' events_json() strings.
  static void write_file(const std::string& path, const std::vector<std::string>& ranks_events);

  int rank() const { return rank_; }
  std::size_t size() const;

 private:
  struct Event {
    std::string name;
    TraceTrack track;
    double ts_us;
    double dur_us;  // < 0: instant
    std::map<std::string, std::string> args;
  };
  double to_us(Clock::time_point t) const;

  int rank_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

// The tracer that engine code (autograd) and the Reducer report to, if any. Installed for the
// lifetime of a TraceScope; null otherwise.
Tracer* active_tracer();

class TraceScope {
 public:
  explicit TraceScope(Tracer* tracer);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Tracer* previous_;
};

// Times a block: records a span on the active tracer (if any) when it goes out of scope.
class TraceSpan {
 public:
  TraceSpan(const char* name, TraceTrack track)
      : name_(name), track_(track), tracer_(active_tracer()) {
    if (tracer_) start_ = Tracer::Clock::now();
  }
  ~TraceSpan() {
    if (tracer_) tracer_->span(name_, track_, start_, Tracer::Clock::now());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  TraceTrack track_;
  Tracer* tracer_;
  Tracer::Clock::time_point start_{};
};

}  // namespace nanoddp
