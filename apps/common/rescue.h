#pragma once
// Where a run's output goes when it cannot be written where it was asked to go (its folder
// replaced by a file, a full disk, another job's file at its name): a fresh folder of its own,
// so that nothing is lost with the process and nothing of anyone else's is touched. One rule for
// nanoddp-train's outputs and checkpoints and nanoddp-run's logs.

#include <functional>
#include <string>

namespace nanoddp::common {

// Calls `write(folder)` in a fresh folder (mkdtemp: a new name, mode 0700, never a file, folder
// or link someone put at a name that is easy to guess), "nanoddp-rescue-PID-XXXXXX", in $TMPDIR,
// else (or when that fails: a full or read-only $TMPDIR) in /tmp. `write` throws on failure.
// Returns the folder, or "" with `problem` set (each attempt's error; the folders removed).
std::string rescue(const std::function<void(const std::string& folder)>& write,
                   std::string* problem);

}  // namespace nanoddp::common
