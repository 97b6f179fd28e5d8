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
//
// On a GPU the host only enqueues work: two host clock reads around a kernel launch measure
// the launch (microseconds), not the kernel. So spans of device work (TraceSpan with a CUDA
// device) are bracketed by two events on the device's compute stream instead, and become the
// GPU's own times, mapped onto the host clock by a ClockAnchor, when the trace is written.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "nanoddp/engine/device.h"
#include "nanoddp/engine/stream.h"

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
  // A span of work on a device's stream, from event `begin` to event `end` (both recorded
  // after anchor_for(their device) was first called). It is resolved into host times when the
  // events have happened: events_json() waits for them.
  void device_span(std::string name, TraceTrack track, Event begin, Event end,
                   std::map<std::string, std::string> args = {});
  // A point in time on `device`: `host_time` on the CPU; on a CUDA device, when its compute
  // stream reaches the work enqueued so far (an event there, resolved like a device span).
  void instant_on(Device device, Clock::time_point host_time, std::string name, TraceTrack track,
                  std::map<std::string, std::string> args = {});
  // The clock anchor of `device`, made (one stream synchronisation) the first time it is asked
  // for: call it before recording a device span's first event.
  void anchor_for(Device device);

  // What events_json() does with a device span whose events have not happened yet.
  enum class Pending { kWait, kDrop };
  // This rank's events as a JSON array body (comma-separated objects, no brackets), with the
  // metadata that names the process ("rank R") and its tracks. Waits for pending device spans,
  // or leaves them out with kDrop (a failed run's trace: a hung device would never end the
  // wait); `dropped`, if given, counts those left out.
  std::string events_json(Pending pending = Pending::kWait, std::size_t* dropped = nullptr) const;
  // A complete trace file from several ranks' events_json() strings, as pieces to write one
  // after another (views into `ranks_events`, which must outlive them). The writing itself is
  // the caller's: the trainer writes atomically and checks which file it made.
  static std::vector<std::string_view> file_pieces(const std::vector<std::string>& ranks_events);

  int rank() const { return rank_; }
  // Events recorded so far; device spans count once events_json() has resolved them.
  std::size_t size() const;

 private:
  struct Record {  // one trace event, in host time
    std::string name;
    TraceTrack track;
    double ts_us;
    double dur_us;  // < 0: instant
    std::map<std::string, std::string> args;
  };
  struct DeviceSpan {
    std::string name;
    TraceTrack track;
    Event begin, end;  // an instant has only `begin`
    std::map<std::string, std::string> args;
    bool instant = false;
  };
  double to_us(Clock::time_point t) const;
  // Turns device spans into events (host times); returns how many kDrop left out. Called under
  // mutex_.
  std::size_t resolve_device_spans(Pending pending) const;

  int rank_;
  mutable std::mutex mutex_;
  mutable std::vector<Record> events_;
  mutable std::vector<DeviceSpan> device_spans_;
  std::map<int, ClockAnchor> anchors_;  // by CUDA device index
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

// Times a block: records a span on the active tracer (if any) when it goes out of scope. For
// host work (the default device, the CPU) the span is the host's time in the block. For a CUDA
// device it is when the device ran the work the block enqueued on its compute stream.
class TraceSpan {
 public:
  // The name is copied only when a tracer is active: untraced steps pay one atomic load.
  TraceSpan(const char* name, TraceTrack track, Device device = Device::cpu());
  // With a name built at run time (build it only when `tracer` is not null) and arguments.
  TraceSpan(Tracer* tracer, std::string name, TraceTrack track, Device device,
            std::map<std::string, std::string> args = {});
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  std::string name_;
  TraceTrack track_;
  Device device_;
  std::map<std::string, std::string> args_;
  Tracer::Clock::time_point start_{};
  Event begin_;  // CUDA only: on the compute stream, where the block's work starts

  void begin();
};

}  // namespace nanoddp
