#pragma once
// One exception type for what a user did wrong or what the system refused. Messages say what was
// wrong, with which value, and what to do about it.

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace nanoddp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nanoddp

// Internal invariant or argument check: the message is formatted only on failure.
#define NANODDP_CHECK(cond, ...)                                                      \
  do {                                                                                \
    if (!(cond)) ::nanoddp::fail("{} ({}:{})", fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
