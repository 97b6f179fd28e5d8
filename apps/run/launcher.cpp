#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>

#include "common/error_file.h"
#include "error_folder.h"
#include "free_port.h"
#include "log_files.h"
#include "nanoddp/nn/file_io.h"
#include "output.h"
#include "report.h"
#include "shm_cleanup.h"
#include "signals.h"
#include "spawn.h"
#include "worker_env.h"

extern char** environ;

namespace nanoddp::run {

namespace {

using Clock = std::chrono::steady_clock;

template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  Console::err().write("nanoddp-run: " + fmt::format(format, std::forward<Args>(args)...) + "\n",
                       false);
}

bool failed(const WorkerResult& r) {
  return r.pid < 0 || !WIFEXITED(r.wait_status) || WEXITSTATUS(r.wait_status) != 0;
}

// One local worker during one attempt.
struct Worker {
  WorkerResult result;
  bool running = false;
  UniqueFd out_fd;
  UniqueFd err_fd;
  UniqueFd log_fd;
  std::string log_name;  // its path, when --log-dir is set
  std::unique_ptr<LineSink> out;
  std::unique_ptr<LineSink> err;
};

// Reads what a worker pipe holds now into its sink; at end of file flushes the last partial line
// and closes the pipe. The launcher's ends are non-blocking, so this never waits.
void pump(UniqueFd& fd, LineSink& sink) {
  char buffer[64 * 1024];
  for (int reads = 0; fd && reads < 16; ++reads) {  // bounded: other pipes get their turn
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n > 0) {
      sink.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {  // end of file, or an error that will not go away
      sink.flush();
      fd.reset();
    }
  }
}

// A worker's message for the launcher's summary: one line (its line breaks as spaces), its
// controls escaped as the worker's own messages are (nn::escape_controls: the C1 controls and
// stray bytes as well, an outside tester's), bounded (the whole of it is in the worker's own
// output above).
std::string one_line(std::string message) {
  constexpr std::size_t kMax = 500;
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::string out = nn::escape_controls(message);
  if (out.size() > kMax) {
    std::size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
    out = out.substr(0, cut) + " [...]";
  }
  return out;
}

// The state letter of /proc/PID/stat ('T': stopped), or '?'.
char process_state(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');  // the name in parentheses may hold anything
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

std::int64_t realtime_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", tm);
}

class Attempt {
 public:
  Attempt(const LaunchPlan& plan, const RoundSpec& round, SignalInbox& signals)
      : plan_(plan),
        options_(plan.options),
        round_(round),
        restart_count_(round.restart_count),
        signals_(signals),
        workers_(static_cast<std::size_t>(plan.options.nproc_per_node)),
        records_(workers_.size()) {}

  AttemptOutcome run();

 private:
  void open_logs();
  void start_worker(int local_rank);
  void begin_stop(int signo);
  void signal_groups(int signo);
  void kill_groups();  // SIGKILL to every group, once the grace period is over
  bool groups_empty() const;
  // How long a stop waits after the SIGKILL for the groups to empty before it gives up on them.
  static constexpr std::chrono::seconds kKillWait{2};
  // How long a worker that failed because another rank did waits, at most, for the rank that
  // failed first to exit on its own (consider_failures()).
  static constexpr std::chrono::seconds kSettle{3};
  // The same in elastic rounds for a bare communication failure (no rank named: a peer's
  // process or node went away). A peer that failed on its own is reported by its launcher at
  // once, so its verdict arrives within this; a node that died whole never reports, and
  // waiting kSettle for it only delayed the recovery (an outside operator measured the round's
  // end at 3.0-3.1 s after a kill, every time). Its loss is named later, from its silence.
  static constexpr std::chrono::milliseconds kCommSettle{500};
  void handle_signals();
  void poll_once();
  void reap();
  void consider_failures();
  std::string cause_text(const common::FailureRecord& record, int rank) const;
  bool any_running() const;
  void drain_and_close();
  void keep_logs_reachable();
  void remove_shm_segments();
  AttemptOutcome finish(Clock::time_point started);

  const LaunchPlan& plan_;
  const RunOptions& options_;
  const RoundSpec& round_;
  const int restart_count_;
  SignalInbox& signals_;
  std::vector<Worker> workers_;

  bool stopping_ = false;
  bool killed_ = false;          // SIGKILL sent to every group
  Clock::time_point killed_at_;  // when
  Clock::time_point deadline_;   // of the grace period, while stopping
  int launcher_signal_ = 0;      // the first SIGINT/SIGTERM/SIGHUP the launcher got
  int first_failed_ = -1;        // index into workers_
  // Workers that failed on their own (not stopped by this launcher), in the order they were
  // reaped, until one is named as the first to fail; with their error files and exit times.
  ErrorFolder errors_;
  std::vector<int> failed_;
  std::vector<std::optional<common::FailureRecord>> records_;
  Clock::time_point settle_until_;    // see consider_failures()
  std::int64_t stopped_at_ns_ = 0;    // realtime_ns() when the stop began
  std::optional<std::string> ended_;  // round_.stop's reason, once it ended the round
  std::set<pid_t> orphans_;           // workers' children that ended after their parent (reap())
};

void Attempt::start_worker(int local_rank) {
  Worker& w = workers_[static_cast<std::size_t>(local_rank)];
  const int rank = round_.rank_offset + local_rank;
  w.result.rank = rank;
  w.result.local_rank = local_rank;

  const WorkerIdentity identity{.rank = rank,
                                .world_size = round_.world_size,
                                .local_rank = local_rank,
                                .local_world_size = options_.nproc_per_node,
                                .group_rank = round_.node_rank,
                                .master_addr = round_.master_addr,
                                .master_port = round_.master_port,
                                .restart_count = restart_count_,
                                .launcher_pid = static_cast<int>(::getpid()),
                                .store_token = round_.store_token,
                                .error_file = errors_.file(rank)};
  SpawnedProcess process =
      spawn_process(plan_.program_path, options_.command, worker_environment(identity, environ),
                    signals_.worker_defaults());
  if (process.pid < 0) {
    w.result.spawn_error = process.error;
    say("rank {} could not start '{}': {}", rank, plan_.program_path, std::strerror(process.error));
    return;
  }
  w.result.pid = process.pid;
  w.running = true;
  w.out_fd = std::move(process.out);
  w.err_fd = std::move(process.err);

  if (w.log_fd) {
    write_all(w.log_fd.get(), fmt::format("===== nanoddp-run: {}, rank {}, pid {}, {} =====\n",
                                          round_.label, rank, process.pid, utc_now()));
  }
  const std::string prefix = fmt::format("[rank {}] ", rank);
  const auto log_failed = std::make_shared<bool>(false);  // one warning for both sinks
  w.out = std::make_unique<LineSink>(Console::out(), prefix, fmt::format("rank {}'s stdout", rank),
                                     w.log_fd.get(), w.log_name, log_failed);
  w.err = std::make_unique<LineSink>(Console::err(), prefix, fmt::format("rank {}'s stderr", rank),
                                     w.log_fd.get(), w.log_name, log_failed);
}

// Before any worker starts. At start main() refused a --log-dir whose rank_*.log is not a
// regular file; what changed since (a restart after the folder was removed, a log replaced by a
// FIFO) costs a warning, not the job: its lines still reach the console.
void Attempt::open_logs() {
  if (options_.log_dir.empty()) return;
  std::error_code ec;
  if (!std::filesystem::exists(options_.log_dir, ec)) {
    std::filesystem::create_directories(options_.log_dir, ec);
    if (ec) {
      Console::logs_incomplete();
      say("warning: --log-dir '{}' is gone and cannot be made again ({}): the lines of {} go to "
          "the console only",
          options_.log_dir, ec.message(), round_.label);
    } else {
      say("warning: --log-dir '{}' was removed: made it again for {}", options_.log_dir,
          round_.label);
    }
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    const int rank = round_.rank_offset + static_cast<int>(i);
    w.log_name = log_path(options_.log_dir, rank);
    OpenedLog log = open_log(w.log_name);
    if (!log.fd) {
      Console::logs_incomplete();
      say("warning: --log-dir: '{}' {}: rank {}'s lines of {} go to the console only (the job "
          "goes on; remove it, and the next attempt writes there again)",
          w.log_name, log.error, rank, round_.label);
    }
    w.log_fd = std::move(log.fd);
  }
}

// Signals every worker's process group, including groups whose leader already exited: the
// worker's own children (data loaders, a shell's commands) live on in its group.
void Attempt::signal_groups(int signo) {
  for (const Worker& w : workers_) {
    if (w.result.pid > 0) ::kill(-w.result.pid, signo);
  }
}

void Attempt::kill_groups() {
  signal_groups(SIGKILL);
  killed_ = true;
  killed_at_ = Clock::now();
}

bool Attempt::groups_empty() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) {
    return w.result.pid <= 0 || (::kill(-w.result.pid, 0) != 0 && errno == ESRCH);
  });
}

void Attempt::begin_stop(int signo) {
  if (!stopping_) {
    stopping_ = true;
    stopped_at_ns_ = realtime_ns();
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(options_.grace_period_s));
    for (Worker& w : workers_) {
      w.result.stopped_by_launcher = w.running;
      // A worker suspended (SIGSTOP) while the others failed is likely why they did: their
      // collectives waited for it until their timeout. Said in the table, as nothing else
      // points at it (an outside tester's).
      if (w.running && launcher_signal_ == 0 && process_state(w.result.pid) == 'T') {
        w.result.cause = "it was suspended (SIGSTOP) when the others failed";
      }
    }
  }
  signal_groups(signo);
  // A suspended worker acts on the signal only once continued: it would otherwise wait out the
  // whole grace period for its SIGKILL (as systemd does, SIGCONT follows).
  signal_groups(SIGCONT);
}

void Attempt::handle_signals() {
  for (const int signo : signals_.drain()) {
    if (signo == SIGCHLD) continue;  // reap() looks at every worker after each wake-up
    if (launcher_signal_ == 0 && stopping_) {
      // A worker failed and the others are being stopped already: a second SIGTERM would cut
      // short the clean-up they are doing (a second signal is "now" to many programs, this
      // launcher too), and the SIGKILL deadline stands.
      launcher_signal_ = signo;
      say("got {}: the workers are being stopped already (SIGKILL in {:.1f} s)", signal_name(signo),
          std::max(0.0, std::chrono::duration<double>(deadline_ - Clock::now()).count()));
    } else if (launcher_signal_ == 0) {
      launcher_signal_ = signo;
      say("got {}: forwarding it to the workers (SIGKILL after {} s)", signal_name(signo),
          options_.grace_period_s);
      begin_stop(signo);
    } else if (!killed_) {
      say("got {} again: killing the workers now", signal_name(signo));
      kill_groups();
    }
  }
}

// Reaps every child that ended: workers, and (the launcher being a child subreaper) the
// orphaned children of workers, which would otherwise linger as zombies in their group until
// init reaps them, and keep groups_empty() false.
void Attempt::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    const auto it = std::find_if(workers_.begin(), workers_.end(), [pid](const Worker& w) {
      return w.running && w.result.pid == pid;
    });
    if (it == workers_.end()) {  // a worker's orphan, or one of an earlier attempt
      orphans_.insert(pid);      // a wrapped program's rank 0 may have created a segment
      continue;
    }
    Worker& w = *it;
    w.running = false;
    w.result.wait_status = status;
    const auto i = static_cast<std::size_t>(it - workers_.begin());
    if (failed(w.result) && !w.result.stopped_by_launcher && first_failed_ < 0 &&
        launcher_signal_ == 0) {
      auto record = common::read_failure_record(errors_.file(w.result.rank));
      if (!record) {
        record = common::FailureRecord{.time_ns = realtime_ns()};  // when it was seen to exit
      } else if (record->caused_by_peer) {
        w.result.cause = cause_text(*record, w.result.rank);
        if (failed_.empty()) {
          const bool bare = round_.stop != nullptr && !record->peer_rank;
          settle_until_ = Clock::now() + (bare ? Clock::duration(kCommSettle) : kSettle);
          if (round_.on_settle) round_.on_settle();
        }
      }
      w.result.message = record->message;
      records_[i] = std::move(record);
      failed_.push_back(static_cast<int>(i));
    } else if (failed(w.result) && w.result.stopped_by_launcher && w.result.cause.empty()) {
      // Stopped by this launcher, but it had failed (or been told of a failure) before the stop
      // reached it: its row says so, as its own output does (an outside tester's). A record
      // written after the stop (a program that records its SIGTERM) is not.
      const auto record = common::read_failure_record(errors_.file(w.result.rank));
      if (record && record->time_ns < stopped_at_ns_) {
        w.result.cause = record->caused_by_peer ? cause_text(*record, w.result.rank)
                                                : std::string("it had failed on its own too");
      }
    }
  }
}

// "because rank R failed", for a record that says another rank's failure caused this one. A
// rank the record names that is not another rank of this round is not repeated.
std::string Attempt::cause_text(const common::FailureRecord& record, int rank) const {
  if (!record.peer_rank) return "after a communication failure";
  if (*record.peer_rank == rank || *record.peer_rank >= round_.world_size) {
    return "because another rank failed";
  }
  return fmt::format("because rank {} failed", *record.peer_rank);
}

bool Attempt::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

// Names the worker that failed first and stops the others. That is the earliest failure of a
// worker's own: a worker whose error file says another rank's failure caused its own often exits
// first (after rank 0 failed to write a checkpoint, rank 1 was told through the store and
// exited while rank 0 was still saying why). So while only such workers have failed, the
// others are given up to kSettle to end on their own before they are stopped (and, in elastic
// rounds, another node up to kSettle to end the round with its verdict); the first of them is
// named only when none did.
void Attempt::consider_failures() {
  if (first_failed_ >= 0 || failed_.empty() || launcher_signal_ != 0) return;
  int named = -1;
  for (const int i : failed_) {
    const auto& r = records_[static_cast<std::size_t>(i)];
    if (!r->caused_by_peer &&
        (named < 0 || r->time_ns < records_[static_cast<std::size_t>(named)]->time_ns)) {
      named = i;
    }
  }
  if (named < 0) {
    // Another node's verdict ended the round (elastic): the rank that failed first is named
    // there, and every local failure so far was caused by it.
    if (ended_) return;
    // Elastic rounds wait even with no local worker left: the node of the rank that failed
    // first may still end the round with its verdict.
    const bool others_may_say = any_running() || round_.stop != nullptr;
    if (!stopping_ && others_may_say && Clock::now() < settle_until_) return;
    named = failed_.front();
  }
  first_failed_ = named;
  const WorkerResult& w = workers_[static_cast<std::size_t>(named)].result;
  say("rank {} (pid {}) failed: {}; stopping the other workers (SIGTERM, SIGKILL after {} s)",
      w.rank, w.pid, describe(w), options_.grace_period_s);
  if (round_.on_failure && !ended_) {
    round_.on_failure(fmt::format("rank {} failed: {}{}", w.rank, describe(w),
                                  w.cause.empty() ? std::string() : ", " + w.cause),
                      exit_code_of(w));
  }
  begin_stop(SIGTERM);
}

void Attempt::poll_once() {
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  if (round_.stop != nullptr && !ended_) fds.push_back({round_.stop->fd(), POLLIN, 0});
  const std::size_t first_pipe = fds.size();
  std::vector<std::pair<UniqueFd*, LineSink*>> pipes;
  for (Worker& w : workers_) {
    for (auto [fd, sink] : {std::pair{&w.out_fd, w.out.get()}, std::pair{&w.err_fd, w.err.get()}}) {
      if (*fd) {
        fds.push_back({fd->get(), POLLIN, 0});
        pipes.emplace_back(fd, sink);
      }
    }
  }
  // SIGCHLD wakes the poll; the timeout is a backstop. While stopping, a worker's grandchildren
  // can outlive it without any notification, so their groups are re-checked every 50 ms.
  int timeout_ms = 1000;
  if (!failed_.empty() && first_failed_ < 0) {
    timeout_ms = 50;  // settling: consider_failures() decides when the time is up
  } else if (stopping_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<long long>(left, 5, 50));
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout or EINTR
  if (fds[0].revents != 0) handle_signals();
  if (first_pipe == 2 && fds[1].revents != 0 && launcher_signal_ == 0) {
    ended_ = round_.stop->reason();
    if (first_failed_ < 0) {
      say("{} ended: {}; stopping this node's workers (SIGTERM, SIGKILL after {} s)", round_.label,
          *ended_, options_.grace_period_s);
    }
    begin_stop(SIGTERM);
  }
  for (std::size_t i = first_pipe; i < fds.size(); ++i) {
    if (fds[i].revents != 0) pump(*pipes[i - first_pipe].first, *pipes[i - first_pipe].second);
  }
}

// After the last worker ended: its last lines are in the pipe buffers (or still held open by a
// child that outlived it, which is not waited for).
void Attempt::drain_and_close() {
  for (Worker& w : workers_) {
    for (auto [fd, sink] : {std::pair{&w.out_fd, w.out.get()}, std::pair{&w.err_fd, w.err.get()}}) {
      while (*fd) {
        char buffer[64 * 1024];
        const ssize_t n = ::read(fd->get(), buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR) continue;
        if (n > 0) {
          sink->feed(std::string_view(buffer, static_cast<std::size_t>(n)));
          continue;
        }
        fd->reset();
      }
      if (sink != nullptr) sink->flush();
    }
  }
}

// Once every worker has ended: a log whose name was removed (the folder with it, c16 of an outside
// tester) or renamed during the attempt held lines no name reached, lost without a word.
void Attempt::keep_logs_reachable() {
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (!w.log_fd) continue;
    if (auto warning = keep_log_reachable(w.log_fd.get(), w.log_name,
                                          round_.rank_offset + static_cast<int>(i))) {
      say("{}", *warning);
    }
  }
}

// Once every worker has ended: the shared-memory segments they left (see shm_cleanup.h), named
// after the worker's pid, or an orphan's when PROGRAM is a wrapper that forked the real rank.
void Attempt::remove_shm_segments() {
  std::set<pid_t> pids = orphans_;
  for (const Worker& w : workers_) {
    if (w.result.pid > 0) pids.insert(w.result.pid);
  }
  for (const RemovedSegment& segment : remove_shm_segments_of(pids)) {
    const auto it = std::find_if(workers_.begin(), workers_.end(),
                                 [&](const Worker& w) { return w.result.pid == segment.creator; });
    say("removed /dev/shm/{}, left by {} (pid {}) during the shared-memory set-up", segment.name,
        it != workers_.end() ? fmt::format("rank {}", it->result.rank) : "a worker's child",
        segment.creator);
  }
}

AttemptOutcome Attempt::run() {
  const auto started = Clock::now();
  open_logs();
  // Ctrl-Z stops the launcher's process group only: the workers run in groups of their own.
  signals_.set_job_control([this](int signo) { signal_groups(signo); });
  struct Reset {
    SignalInbox& signals;
    ~Reset() { signals.set_job_control(nullptr); }
  } reset{signals_};
  for (int i = 0; i < options_.nproc_per_node && !stopping_; ++i) {
    start_worker(i);
    if (workers_[static_cast<std::size_t>(i)].result.pid < 0) {
      first_failed_ = i;
      begin_stop(SIGTERM);
    }
  }
  for (;;) {
    poll_once();
    reap();
    consider_failures();
    const bool any_running =
        std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
    // Not while a failure waits to be named (consider_failures()): an elastic round's last
    // worker that failed because of another node's rank waits for that node's verdict.
    if (!stopping_ && !any_running && (failed_.empty() || first_failed_ >= 0)) break;
    // After the SIGKILL too, until the groups are empty: a killed worker's child takes a moment
    // to die and be reaped (by this launcher, its subreaper); leaving before would hand it to
    // init alive. Bounded: a process in an uninterruptible wait dies only when that wait ends.
    if (stopping_ && !any_running &&
        (groups_empty() || (killed_ && Clock::now() - killed_at_ >= kKillWait))) {
      break;
    }
    if (stopping_ && !killed_ && Clock::now() >= deadline_) {
      say("grace period of {} s is over: SIGKILL to the workers still running",
          options_.grace_period_s);
      kill_groups();
    }
  }
  drain_and_close();
  keep_logs_reachable();
  remove_shm_segments();
  return finish(started);
}

AttemptOutcome Attempt::finish(Clock::time_point started) {
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::vector<WorkerResult> results;
  for (const Worker& w : workers_) results.push_back(w.result);

  if (launcher_signal_ != 0) {
    if (first_failed_ >= 0) results[static_cast<std::size_t>(first_failed_)].failed_first = true;
    Console::err().write(result_table(results), false);
    say("stopped by {} after {:.1f} s: exiting with code {}", signal_name(launcher_signal_),
        seconds, 128 + launcher_signal_);
    return {Outcome::kInterrupted, 128 + launcher_signal_, {}};
  }
  if (first_failed_ >= 0) {
    WorkerResult& first = results[static_cast<std::size_t>(first_failed_)];
    // In elastic rounds a local rank that failed because of another is not marked as the one
    // that failed first: that rank is on another node (which may be lost, and is named when
    // its silence shows it), not here.
    const auto& record = records_[static_cast<std::size_t>(first_failed_)];
    const bool consequence = round_.stop != nullptr && record && record->caused_by_peer;
    first.failed_first = !consequence;
    say("{} failed after {:.1f} s", round_.label, seconds);
    Console::err().write(result_table(results), false);
    say("rank {} (pid {}) failed {}: {}{}{}", first.rank, first.pid,
        consequence ? "first on this node, as a consequence of a failure on another node" : "first",
        describe(first), first.cause.empty() ? std::string() : ", " + first.cause,
        first.message.empty() ? std::string() : ": " + one_line(first.message));
    return {Outcome::kFailed, exit_code_of(first), {}};
  }
  if (ended_) {
    say("{} ended after {:.1f} s: {}", round_.label, seconds, *ended_);
    Console::err().write(result_table(results), false);
    return {Outcome::kEnded, 1, *ended_};
  }
  if (std::any_of(results.begin(), results.end(), failed)) {
    // Unreachable by the loop above; a failure must never be reported as a success.
    throw std::logic_error(fmt::format("{}: a worker failed, but none was named", round_.label));
  }
  say("all {} workers exited 0 ({}, {:.1f} s)", results.size(), round_.label, seconds);
  return {Outcome::kSucceeded, 0, {}};
}

}  // namespace

StopRequest::StopRequest() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error(fmt::format("pipe2: {}", std::strerror(errno)));
  }
  read_end_.reset(fds[0]);
  write_end_.reset(fds[1]);
}

void StopRequest::request(const std::string& reason) {
  const std::lock_guard lock(mutex_);
  if (reason_) return;
  reason_ = reason;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(write_end_.get(), &byte, 1);  // stays readable
}

std::optional<std::string> StopRequest::reason() const {
  const std::lock_guard lock(mutex_);
  return reason_;
}

AttemptOutcome run_round(const LaunchPlan& plan, const RoundSpec& round, SignalInbox& signals) {
  return Attempt(plan, round, signals).run();
}

void adopt_orphans() {
#ifdef __linux__
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
}

int run_launcher(const LaunchPlan& plan) {
  SignalInbox signals;
  adopt_orphans();
  const int attempts = plan.options.max_restarts + 1;
  for (int restart = 0;; ++restart) {
    // A fresh free port per attempt: the previous rank 0's port may still be in TIME_WAIT.
    const int port = plan.master_port != 0 ? plan.master_port : find_free_port(plan.master_addr);
    const RoundSpec round{.node_rank = plan.options.node_rank,
                          .rank_offset = plan.options.node_rank * plan.options.nproc_per_node,
                          .world_size = plan.options.nnodes * plan.options.nproc_per_node,
                          .master_addr = plan.master_addr,
                          .master_port = port,
                          .store_token = plan.store_token,
                          .restart_count = restart,
                          .label = fmt::format("attempt {} of {}", restart + 1, attempts)};
    const AttemptOutcome outcome = Attempt(plan, round, signals).run();
    if (outcome.outcome != Outcome::kFailed) return outcome.exit_code;
    if (outcome.exit_code == kUsageExitCode) {
      say("the first failure is exit code 2, a usage error (bad flags, values or inputs): not "
          "restarting, it would fail the same way; fix the command");
      return outcome.exit_code;
    }
    if (restart + 1 < attempts) {
      say("restarting the group (attempt {} of {})", restart + 2, attempts);
      continue;
    }
    say("no restarts left (--max-restarts {}): exiting with code {}", plan.options.max_restarts,
        outcome.exit_code);
    return outcome.exit_code;
  }
}

}  // namespace nanoddp::run
