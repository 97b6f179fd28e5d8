#include "nanoddp/engine/env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "nanoddp/kernels/error.h"

namespace nanoddp {

namespace {

std::string_view read(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string_view(value) : std::string_view();
}

}  // namespace

bool env_switch(const char* name, bool default_on) {
  const std::string_view value = read(name);
  if (value.empty()) return default_on;
  if (value == "0") return false;
  if (value == "1") return true;
  fail("{}='{}' is not understood: set it to 0 (off) or 1 (on), or unset it", name, value);
}

std::uint64_t env_count(const char* name, std::uint64_t fallback, std::uint64_t min,
                        std::uint64_t max) {
  const std::string_view value = read(name);
  if (value.empty()) return fallback;
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < min || n > max) {
    fail("{}='{}' is not understood: set it to a whole number from {} to {}, or unset it", name,
         value, min, max);
  }
  return n;
}

}  // namespace nanoddp
