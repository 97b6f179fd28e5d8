#pragma once
// The simulator's one exception type. It does not link the nanoddp library (it models clusters
// that library never runs on), so it has its own, with the same habit: the message says what was
// wrong, with which value, and what to do about it. main() turns it into exit code 2.

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace nanoddp::sim {

class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw SimError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nanoddp::sim
