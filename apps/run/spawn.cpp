#include "spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>

namespace nanoddp::run {

namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

bool make_pipe(UniqueFd& read_end, UniqueFd& write_end) {
  int fds[2];
  // Close-on-exec on both ends: no worker inherits another worker's pipes (which would keep
  // them open after that worker exits). dup2 onto 1 and 2 clears the flag for the copies.
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
  // Only the launcher's end is non-blocking; the worker writes to a normal blocking pipe.
  return fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK) == 0;
}

}  // namespace

SpawnedProcess spawn_process(const std::string& path, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const sigset_t& defaults) {
  SpawnedProcess result;
  UniqueFd out_write;
  UniqueFd err_write;
  if (!make_pipe(result.out, out_write) || !make_pipe(result.err, err_write)) {
    result.error = errno;
    return result;
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // No stdin: N workers cannot share one, and a worker (in a background process group) that
  // read the terminal would be stopped by SIGTTIN and hang the job.
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // The worker gets the default disposition of the signals the launcher handles or ignores for
  // itself (`defaults`), and an empty signal mask, whatever the launcher inherited itself.
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setpgroup(&attributes, 0);  // a new group whose id is the worker's pid
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);

  std::vector<char*> args = c_strings(argv);
  std::vector<char*> envp = c_strings(env);
  pid_t pid = -1;
  // glibc's posix_spawn reports a failed exec (ENOENT, EACCES, ...) as its return value.
  const int rc = posix_spawn(&pid, path.c_str(), &actions, &attributes, args.data(), envp.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.error = rc;
    result.out.reset();
    result.err.reset();
    return result;
  }
  result.pid = pid;
  return result;  // the write ends close here: the worker holds the only copies
}

}  // namespace nanoddp::run
