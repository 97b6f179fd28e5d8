#include "nanoddp/engine/debug_log.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <string>

namespace nanoddp {
namespace {

using Clock = std::chrono::steady_clock;

// Times in the lines count from the first use in this process.
const Clock::time_point kStart = Clock::now();

std::atomic<int> g_rank{-2};  // -2: not set yet (read RANK); -1: unknown

void write_all(const std::string& line) {
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // stderr is gone: debug output is best effort
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

DebugLevel parse_level(const char* value) {
  if (value == nullptr) return DebugLevel::kOff;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v.empty() || v == "0" || v == "OFF") return DebugLevel::kOff;
  if (v == "1" || v == "INFO") return DebugLevel::kInfo;
  if (v == "2" || v == "DETAIL") return DebugLevel::kDetail;
  write_all(fmt::format(
      "nanoddp: warning: NANODDP_DEBUG={} is not understood (expected OFF, INFO or DETAIL); "
      "using INFO\n",
      value));
  return DebugLevel::kInfo;
}

int current_rank() {
  int rank = g_rank.load(std::memory_order_relaxed);
  if (rank == -2) {
    const char* env = std::getenv("RANK");
    char* end = nullptr;
    const long parsed = env != nullptr ? std::strtol(env, &end, 10) : -1;
    rank = (env != nullptr && *env != '\0' && end != nullptr && *end == '\0' && parsed >= 0 &&
            parsed < (1L << 30))
               ? static_cast<int>(parsed)
               : -1;
    g_rank.store(rank, std::memory_order_relaxed);
  }
  return rank;
}

// Read when the library loads, so that a misspelt value is reported at start-up even by a run
// that never reaches a debug line.
const DebugLevel kLevel = parse_level(std::getenv("NANODDP_DEBUG"));

}  // namespace

DebugLevel debug_level() {
  return kLevel;
}

void set_debug_rank(int rank) {
  g_rank.store(rank, std::memory_order_relaxed);
}

void debug_write(DebugLevel level, const std::string& message) {
  if (!debug_enabled(level)) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - kStart).count();
  const int rank = current_rank();
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : std::string("rank ?");
  // A multi-line message gets the prefix on every line, all in one write.
  const std::string prefix = fmt::format("[nanoddp {} +{:.3f}s] ", who, seconds);
  std::string out;
  std::size_t begin = 0;
  while (begin < message.size()) {
    std::size_t end = message.find('\n', begin);
    if (end == std::string::npos) end = message.size();
    out += prefix;
    out.append(message, begin, end - begin);
    out += '\n';
    begin = end + 1;
  }
  if (out.empty()) out = prefix + "\n";
  write_all(out);
}

}  // namespace nanoddp
