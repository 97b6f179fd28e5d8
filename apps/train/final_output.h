#pragma once
// The run's final outputs (--save, --trace; --metrics when it has to be written again): written
// after training, when the world may have changed since their check before step 1. Nothing is
// lost and nothing of someone else's is replaced:
// - a folder removed during the run (a clean-up job, a user tidying up) is made again, with a
//   warning;
// - the output is written beside the target under a name of its own (staged), then put in place
//   in one step that does not replace a file another process wrote, touched, moved there or
//   re-pointed since `checked` (what the path named at its check; another job given the same
//   path), and that is checked afterwards to have put this run's own file there;
// - a write that fails (a full disk, the folder replaced by a file) or finds such a change goes
//   to common::rescue(), so that hours of training are not lost with the process; with no rescue
//   folder, the staged output is kept beside the target under a plain name.
// docs/reliability.md (row 71) lists what outside adversaries tried against it.

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/output_files.h"
#include "nanoddp/nn/file_io.h"

namespace nanoddp::train {

// While one lives, SIGINT, SIGTERM and SIGHUP wait: the final outputs are finished, or rescued,
// and then the signal acts as it would have (unless an error is already on its way out). A
// scheduler's SIGTERM during a long --save write used to end the process silently, its output in
// a hidden staged file that the next run removed. A wait for a lock ends at once on one.
class HeldSignals {
 public:
  HeldSignals();
  ~HeldSignals();
  HeldSignals(const HeldSignals&) = delete;
  HeldSignals& operator=(const HeldSignals&) = delete;
  static int arrived();  // the signal that arrived meanwhile, or 0
};

// Why an existing file cannot be replaced by rename though it may open for writing: an
// append-only or immutable file (chattr +a, +i: EPERM), or a mount point (a file bind-mounted
// there: EBUSY). Both passed the checks before step 1 and failed the install after the last.
struct NotReplaceable {
  std::string what;  // "is append-only (chattr +a)"
  std::string fix;   // what to do
  bool mount_point = false;
  char attribute = 0;  // 'a' or 'i' for a chattr attribute
};
std::optional<NotReplaceable> not_replaceable(const std::string& file);

// Whether `filename` is a name write_final_output gives its own files (".nanoddp-out.tmp.*",
// "..nanoddp-out.tmp.*"): an output named so would be taken for a killed run's leftover.
bool is_staged_name(const std::string& filename);

// Writes the output with `write(path)`, which says which file it made (nn::FileIdentity).
// `checked_target`: where the path led at its check (a symlink's target), "" when nothing was
// checked (--metrics). Returns "" when written where asked, else the error to stop with, naming
// where the output went. `lock_wait`: how long to wait for another job's lock on the file (0:
// NANODDP_TIMEOUT_S, at most 30 s; an output written during training waits less, as the other
// ranks wait for this one in their next collective).
std::string write_final_output(const char* flag, const std::string& path,
                               const std::function<nn::FileIdentity(const std::string&)>& write,
                               const common::FileState& checked,
                               const std::string& checked_target = {},
                               std::chrono::milliseconds lock_wait = {});

}  // namespace nanoddp::train
