// Streams and events (engine/stream.h) for a build without CUDA: only the CPU exists, where a
// stream is the calling thread and an event is a timestamp (engine/stream_cpu.h).

#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/stream_cpu.h"

namespace nanoddp {

Stream Stream::compute(Device device) {
  require_device(device);  // throws for CUDA devices
  return Stream(Device::cpu(), nullptr);
}

Stream Stream::create(Device device, StreamPriority /*priority*/) {
  require_device(device);
  return Stream(Device::cpu(), nullptr);
}

void Stream::synchronize() const {}

Event::Event(Device device) : device_(device) {
  require_device(device);
}

Event::~Event() = default;

Event::Event(Event&& other) noexcept
    : device_(other.device_), handle_(other.handle_), cpu_time_(other.cpu_time_) {}

Event& Event::operator=(Event&& other) noexcept {
  device_ = other.device_;
  handle_ = other.handle_;
  cpu_time_ = other.cpu_time_;
  return *this;
}

void Event::record(const Stream& /*stream*/) {
  cpu_time_ = detail::cpu_event_now();
}

void Event::block(const Stream& /*stream*/) const {}

void Event::synchronize() const {}

bool Event::query() const {
  return true;
}

double Event::elapsed_ms(const Event& later) const {
  return detail::cpu_elapsed_ms(cpu_time_, later.cpu_time_);
}

}  // namespace nanoddp
