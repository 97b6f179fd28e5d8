#include "nanoddp/engine/device.h"

#include <charconv>

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

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return fmt::format("cuda:{}", index);
}

}  // namespace nanoddp
