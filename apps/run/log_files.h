#pragma once
// The --log-dir files, rank_R.log: opened so that nothing can block the launcher, and kept
// reachable by their name when the folder changes during an attempt.

#include <optional>
#include <string>

#include "nanoddp/comm/unique_fd.h"

namespace nanoddp::run {

// "<dir>/rank_<rank>.log"
std::string log_path(const std::string& dir, int rank);

// At start, before any worker: the first entry rank_*.log of `dir` that is not a regular file
// (after symlinks), as an error message naming it; nullopt when there is none. A FIFO there
// without a reader blocked the launcher's open() forever, with its signals in a signalfd, so
// that neither Ctrl-C nor `timeout` could end it (an outside tester's finding).
std::optional<std::string> unusable_log_entry(const std::string& dir);

struct OpenedLog {
  comm::UniqueFd fd;
  std::string error;  // when !fd: "is a FIFO, not a regular file", or the system's words
};

// Opens `path` for appending (creating it) without ever blocking: O_NONBLOCK, so that a FIFO
// without a reader fails at once, and anything that is not a regular file is refused.
OpenedLog open_log(const std::string& path);

// At the end of an attempt, once its workers have exited: when `path` no longer names the file
// `fd` holds, makes its lines reachable again and returns one warning saying where they are.
//   removed (no name left): `path` is written again, whole, its folder re-created; when the
//     name now holds another file (or cannot be written), the copy goes to a rescue folder
//     (common::rescue: nanoddp-rescue-PID-XXXXXX/rank_R.log in $TMPDIR, else /tmp);
//   renamed: its lines went on into the file under its new name, which the warning gives.
// nullopt when `path` still names it.
std::optional<std::string> keep_log_reachable(int fd, const std::string& path, int rank);

}  // namespace nanoddp::run
