#pragma once
// The machine's load around a measurement, said the same way by every benchmark: other
// processes competing for the cores slow every figure without a trace in them.
//
// Header-only, like cli.h: a dependency of the executables only.

#include <fmt/format.h>
#include <stdlib.h>

#include <optional>
#include <string>

namespace nanoddp::common {

// The 1-minute load average, or -1 when the system does not say.
inline double load_1m() {
  double load[1] = {-1};
  return ::getloadavg(load, 1) == 1 ? load[0] : -1;
}

// A warning when the 1-minute load average exceeded the cores at the start of a measurement, or
// at its end beyond `threads_here` (the measurement's own threads, which count in the load at
// its end); nullopt otherwise. A 1-minute average lags: a heuristic that catches sustained
// outside load, not a blip. `what` names the measurement ("this point", "this size").
inline std::optional<std::string> load_warning(double load_start, double load_end, int cores,
                                               int threads_here, const std::string& what) {
  if (load_start > cores || load_end > cores + threads_here) {
    return fmt::format(
        "load average {:.2f} at the start, {:.2f} at the end of {} on {} core(s): other "
        "processes competed for the cores, every time here may be inflated",
        load_start, load_end, what, cores);
  }
  return std::nullopt;
}

}  // namespace nanoddp::common
