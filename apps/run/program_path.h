#pragma once
// Finds PROGRAM the way execvp would, before any worker starts, so that a typo is one clear
// error instead of N identical worker failures (and N restarts of them).

#include <string>

namespace nanoddp::run {

struct ProgramLookup {
  std::string path;   // the file to execute, when found
  std::string error;  // otherwise why not, for the user
  int exit_code = 0;  // 127: not found; 126: found but not an executable file (as shells do)
};

// A name with a '/' is used as is; otherwise each directory of $PATH is searched (execvp's
// default PATH when it is unset). Only regular files with execute permission qualify.
ProgramLookup find_program(const std::string& name);

}  // namespace nanoddp::run
