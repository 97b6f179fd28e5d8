#pragma once
// A private folder for the workers' error files (common/error_file.h), one per attempt, removed
// with it; and the removal of such folders that launchers killed before their end left behind.
//
// Why the clean-up: a launcher killed by SIGKILL (the OOM killer, a scheduler's hard stop)
// removes nothing, and each attempt left an empty folder in /tmp for good. A folder is another
// launcher's to remove only when that launcher is gone: its pid names no process, no one holds
// the folder's lock (a launcher in another pid namespace sharing /tmp shows no pid here, but it
// holds its lock), it has not changed for a minute, and it holds nothing but error files.

#include <string>

namespace nanoddp::run {

class ErrorFolder {
 public:
  // Without a folder (no writable $TMPDIR or /tmp) the workers get no error file, and the
  // launcher names the first worker to exit; a warning says so.
  ErrorFolder();
  ~ErrorFolder();
  ErrorFolder(const ErrorFolder&) = delete;
  ErrorFolder& operator=(const ErrorFolder&) = delete;
  // Rank `rank`'s error file, or "" without a folder.
  std::string file(int rank) const;

 private:
  std::string path_;
  int lock_fd_ = -1;  // the folder itself, flock()ed while it lives
};

// Removes the error folders in `base` that dead launchers of this user left (see above); returns
// how many, and names the first in `example`.
int remove_stale_error_folders(const std::string& base, std::string* example);

}  // namespace nanoddp::run
