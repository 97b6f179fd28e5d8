#include "nanoddp/engine/device.h"

#include <atomic>
#include <charconv>

#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    const char* first = text.data() + 5;
    const char* last = text.data() + text.size();
    int index = -1;
    const auto [end, ec] = std::from_chars(first, last, index);
    if (ec == std::errc() && end == last && first != last && index >= 0) return cuda(index);
  }
  fail("unknown device '{}': expected 'cpu', 'cuda' or 'cuda:N' (N >= 0)", text);
}

namespace {
std::atomic<const char*> g_last_device_op{nullptr};
}  // namespace

void note_device_op(const char* op) {
  g_last_device_op.store(op, std::memory_order_relaxed);
}

const char* last_device_op() {
  return g_last_device_op.load(std::memory_order_relaxed);
}

DeviceChoice choose_device(const std::string& requested, int local_rank, int visible_devices) {
  const Device device = Device::parse(requested);
  if (device.is_cpu() || requested != "cuda") return {device, "requested"};
  if (visible_devices <= 0) return {Device::cuda(0), "no visible CUDA device"};
  const int rank = local_rank < 0 ? 0 : local_rank;
  return {Device::cuda(rank % visible_devices),
          fmt::format("local rank {} modulo {} visible CUDA device{}", rank, visible_devices,
                      visible_devices == 1 ? "" : "s")};
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return fmt::format("cuda:{}", index);
}

}  // namespace nanoddp
