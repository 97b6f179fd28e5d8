#include "report.h"

#include <signal.h>
#include <sys/wait.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace nanoddp::run {

std::string signal_name(int signo) {
  switch (signo) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    default:
      return fmt::format("signal {}", signo);
  }
}

std::string describe(const WorkerResult& r) {
  if (r.pid < 0) return fmt::format("could not start: {}", std::strerror(r.spawn_error));
  if (WIFSIGNALED(r.wait_status)) {
    return fmt::format("killed by {}{}", signal_name(WTERMSIG(r.wait_status)),
                       WCOREDUMP(r.wait_status) ? " (core dumped)" : "");
  }
  return fmt::format("exit code {}", WEXITSTATUS(r.wait_status));
}

int exit_code_of(const WorkerResult& r) {
  if (r.pid < 0) return r.spawn_error == ENOENT ? 127 : 126;
  if (WIFSIGNALED(r.wait_status)) return 128 + WTERMSIG(r.wait_status);
  return WEXITSTATUS(r.wait_status);
}

std::string result_table(const std::vector<WorkerResult>& results) {
  std::string table = fmt::format("  {:>5}  {:>5}  {:>8}  {}\n", "rank", "local", "pid", "result");
  for (const WorkerResult& r : results) {
    std::string what = describe(r);
    if (r.stopped_by_launcher) what = fmt::format("stopped by launcher ({})", what);
    if (!r.cause.empty()) what += ", " + r.cause;
    if (r.failed_first) what += "  <- failed first";
    table += fmt::format("  {:>5}  {:>5}  {:>8}  {}\n", r.rank, r.local_rank,
                         r.pid < 0 ? std::string("-") : std::to_string(r.pid), what);
  }
  return table;
}

}  // namespace nanoddp::run
