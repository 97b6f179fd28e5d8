#pragma once
// Where a tensor lives: the CPU, or CUDA device `index`.

#include <cstdint>
#include <string>

namespace nanoddp {

enum class DeviceType : std::uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  // "cpu", "cuda", "cuda:1"; anything else throws an Error that lists the accepted forms.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace nanoddp
