#pragma once
// Streams and events: the ordering vocabulary of the engine.
//
// On CUDA a Stream is a cudaStream_t: work enqueued on one stream runs in order; work on two
// streams may overlap. An Event marks a point in a stream; another stream can wait for it
// without the host blocking. That is how the communication stream is made to start an
// all-reduce only after the backward kernel that wrote the gradients has finished.
//
// On the CPU kernels run synchronously on the calling thread, so a stream is just the thread
// and an event is a timestamp: recording it notes the time, waiting on it is a no-op. The same
// code then times CPU and GPU spans alike (Event::elapsed_ms).

#include <chrono>
#include <memory>

#include "nanoddp/engine/device.h"

namespace nanoddp {

enum class StreamPriority { kNormal, kHigh };

class Stream {
 public:
  Stream() = default;
  // The device's compute stream: every op on that device's tensors is enqueued here.
  static Stream compute(Device device);
  // A new stream (for example the high-priority communication stream of a process group).
  static Stream create(Device device, StreamPriority priority = StreamPriority::kNormal);

  // Wraps a native handle (a cudaStream_t kept alive by `handle`, or null for the CPU / the
  // legacy default stream).
  Stream(Device device, std::shared_ptr<void> handle)
      : device_(device), handle_(std::move(handle)) {}

  Device device() const { return device_; }
  // The cudaStream_t, or null on the CPU.
  void* native() const { return handle_.get(); }
  void synchronize() const;

 private:
  Device device_ = Device::cpu();
  std::shared_ptr<void> handle_;  // owns the cudaStream_t of created streams
};

class Event {
 public:
  explicit Event(Device device = Device::cpu());
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the current end of `stream`.
  void record(const Stream& stream);
  // Makes `stream` wait until this event has happened (the host does not block).
  void block(const Stream& stream) const;
  // Blocks the host until the event has happened.
  void synchronize() const;
  // True when the event has happened.
  bool query() const;
  // Milliseconds from this event to `later` (both recorded, on the same device).
  double elapsed_ms(const Event& later) const;
  Device device() const { return device_; }

 private:
  Device device_;
  void* handle_ = nullptr;  // cudaEvent_t on CUDA
  std::chrono::steady_clock::time_point cpu_time_{};
};

// Maps a device's event times onto the host's steady clock, for timelines and statistics. An
// event is recorded on `stream` and waited for; the host time read right after is taken as the
// moment it happened (late by the wake-up latency, microseconds). Any later event of the same
// device happened at that time plus the interval the device measured between the two. On the
// CPU an event is itself a host time, so the mapping is exact but for the few nanoseconds
// between recording the anchor and reading the clock.
class ClockAnchor {
 public:
  explicit ClockAnchor(const Stream& stream) : event_(stream.device()) {
    event_.record(stream);
    event_.synchronize();
    host_ = std::chrono::steady_clock::now();
  }
  Device device() const { return event_.device(); }
  // The host time taken as the anchor event's.
  std::chrono::steady_clock::time_point host_time() const { return host_; }
  // `later` must be recorded on this device and have happened (Event::query()).
  std::chrono::steady_clock::time_point host_time_of(const Event& later) const {
    return host_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double, std::milli>(event_.elapsed_ms(later)));
  }

 private:
  Event event_;
  std::chrono::steady_clock::time_point host_;
};

}  // namespace nanoddp
