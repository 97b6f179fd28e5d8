#include "output.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace nanoddp::run {

int write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

Console::Console(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}

// Never destroyed: at exit their thread may still be blocked in write() on a paused reader.
Console& Console::out() {
  static Console* const console = new Console(STDOUT_FILENO, "stdout");
  return *console;
}

Console& Console::err() {
  static Console* const console = new Console(STDERR_FILENO, "stderr");
  return *console;
}

void Console::set_drop_hint(std::string hint) {
  const std::lock_guard lock(mutex_);
  drop_hint_ = std::move(hint);
}

void Console::write(std::string_view data, bool droppable) {
  const std::lock_guard lock(mutex_);
  if (!started_) {
    started_ = true;
    // The writer thread blocks every signal: the launcher reads its own from a signalfd in the
    // main thread (signals.h), and a signal left deliverable here would act by its default.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    std::thread([this] { run(); }).detach();
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }
  const std::size_t queued = pending_.size() + in_flight_;
  const std::size_t limit = droppable ? kMaxQueued : 2 * kMaxQueued;
  if ((droppable && dropping_) || queued + data.size() > limit) {
    dropping_ = true;
    dropped_lines_ += std::max<std::size_t>(
        1, static_cast<std::size_t>(std::count(data.begin(), data.end(), '\n')));
    return;
  }
  pending_.append(data);
  wake_.notify_one();
}

bool Console::flush(std::chrono::steady_clock::time_point until) {
  std::unique_lock lock(mutex_);
  return idle_.wait_until(lock, until, [this] { return pending_.empty() && in_flight_ == 0; });
}

std::string Console::unwritten_note(const std::string& how) {
  const std::lock_guard lock(mutex_);
  const std::size_t bytes = pending_.size() + in_flight_;
  if (bytes == 0 && dropped_lines_ == 0) return {};
  return fmt::format(
      "nanoddp-run: {} stopped reading: up to {} bytes of its output (a line being written may "
      "have gone in part), the last lines and any summary among them, {}were not written when "
      "the launcher exited {}{}\n",
      name_ == "stdout" ? "whatever reads stdout" : "whatever reads stderr", bytes,
      dropped_lines_ > 0 ? fmt::format("and {} lines dropped before them, ", dropped_lines_) : "",
      how, drop_hint_);
}

void Console::logs_incomplete() {
  for (Console* console : {&out(), &err()}) {
    console->set_drop_hint(
        "; the --log-dir files have them up to the log failure warned about above, not after");
  }
}

namespace {

// Whether stdout and stderr are one file or pipe (`2>&1`): their writers then take turns, as a
// line longer than PIPE_BUF is written in pieces that the other's writes could land between (an
// outside tester's lines over 4 KiB came out spliced into each other).
std::mutex* shared_sink_mutex() {
  static std::mutex* const shared = [] {
    struct stat out {
    }, err{};
    const bool same = ::fstat(STDOUT_FILENO, &out) == 0 && ::fstat(STDERR_FILENO, &err) == 0 &&
                      out.st_dev == err.st_dev && out.st_ino == err.st_ino;
    return same ? new std::mutex : nullptr;
  }();
  return shared;
}

}  // namespace

void Console::run() {
  // Whole lines, at most PIPE_BUF bytes a write() where they fit: such a write to a pipe is
  // atomic, so that stdout's and stderr's lines do not interleave mid-line when both go to one
  // pipe (`2>&1 | tee`). A longer line goes out alone.
  const auto piece = [](std::string_view rest) {
    const std::size_t end = rest.substr(0, PIPE_BUF).rfind('\n');
    if (end != std::string_view::npos) return end + 1;
    const std::size_t line_end = rest.find('\n');
    return line_end == std::string_view::npos ? rest.size() : line_end + 1;
  };
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return !pending_.empty(); });
    std::string batch;
    batch.swap(pending_);
    in_flight_ = batch.size();
    lock.unlock();
    std::string_view rest(batch);
    while (!rest.empty()) {
      const std::size_t size = piece(rest);
      // Every write takes the turn, short ones too: a short line written while the other stream
      // is part-way through a long one lands inside it (the summary line did, under ASan).
      std::unique_lock<std::mutex> turn;
      if (shared_sink_mutex() != nullptr) turn = std::unique_lock(*shared_sink_mutex());
      ssize_t n = ::write(fd_, rest.data(), size);
      // A long line is written whole while holding the turn (a pipe takes it in pieces).
      while (turn.owns_lock() && n > 0 && static_cast<std::size_t>(n) < size) {
        const ssize_t more = ::write(fd_, rest.data() + n, size - static_cast<std::size_t>(n));
        if (more < 0 && errno == EINTR) continue;
        if (more < 0 && errno == EAGAIN) {
          pollfd writable{fd_, POLLOUT, 0};
          ::poll(&writable, 1, -1);
          continue;
        }
        if (more <= 0) break;
        n += more;
      }
      if (n > 0) {
        rest.remove_prefix(static_cast<std::size_t>(n));
        const std::lock_guard progress(mutex_);
        in_flight_ = rest.size();
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {  // inherited O_NONBLOCK: wait for room
        pollfd writable{fd_, POLLOUT, 0};
        ::poll(&writable, 1, -1);
      } else {
        // EPIPE after `| head`: the reader chose to stop, the rest is dropped without a word.
        // Anything else (a full disk, /dev/full, an I/O error) is said once, on the other
        // stream, so that lines missing from a file do not go unnoticed.
        const int error = errno;
        if (n < 0 && error != EPIPE && !write_failed_) {
          write_failed_ = true;
          std::string hint;
          {
            const std::lock_guard read(mutex_);
            hint = drop_hint_;
          }
          Console& other = this == &out() ? err() : out();
          other.write(fmt::format("nanoddp-run: warning: writing to {} failed ({}): its lines are "
                                  "dropped from here on{}\n",
                                  name_, std::strerror(error), hint),
                      false);
        }
        break;  // the workers go on
      }
    }
    lock.lock();
    in_flight_ = 0;
    // The reader has caught up (half the bound, so that a reader just keeping pace does not
    // flip between dropping and keeping at every line): say what it missed.
    if (dropping_ && pending_.size() <= kMaxQueued / 2) {
      dropping_ = false;
      pending_ += fmt::format(
          "[nanoddp-run: {} line{} of output dropped while {} was blocked (over {} MiB "
          "waiting){}]\n",
          dropped_lines_, dropped_lines_ == 1 ? "" : "s", name_, kMaxQueued >> 20, drop_hint_);
      dropped_lines_ = 0;
    }
    if (pending_.empty()) idle_.notify_all();
  }
}

void LineSink::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, newline);
    if (newline != std::string_view::npos && partial_.empty() && piece.size() <= kMaxLine) {
      emit(piece);  // the usual case: a whole line within one read
    } else {
      partial_.append(piece);
      // Cut an overlong line at kMaxLine so memory stays bounded; visibly (kCutMark). Exactly
      // there, however the reads split it (a line of 1 MiB + 1 that came in one read was kept).
      while (partial_.size() > kMaxLine) cut();
      if (newline == std::string_view::npos) return;
      emit(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
}

void LineSink::cut() {
  if (!cut_announced_) {
    cut_announced_ = true;
    Console::err().write(fmt::format("nanoddp-run: warning: {} has a line longer than {} MiB: "
                                     "lines are kept whole up to that size, so it is written in "
                                     "pieces, each but the last ending in '{}'\n",
                                     source_, kMaxLine >> 20, kCutMark.substr(1)),
                         false);
  }
  emit(std::string_view(partial_).substr(0, kMaxLine), kCutMark);
  partial_.erase(0, kMaxLine);
}

void LineSink::flush() {
  if (partial_.empty()) return;
  emit(partial_);
  partial_.clear();
}

void LineSink::emit(std::string_view line, std::string_view mark) {
  std::string out;
  out.reserve(prefix_.size() + line.size() + mark.size() + 1);
  out.append(prefix_).append(line).append(mark).push_back('\n');
  // The log first: it gets every line, even those the console drops.
  if (log_fd_ >= 0 && !*log_failed_) {
    if (const int error = write_all(log_fd_, std::string_view(out).substr(prefix_.size()))) {
      // Said once per file; the launcher goes on supervising (and printing) the workers.
      *log_failed_ = true;
      Console::logs_incomplete();
      Console::err().write("nanoddp-run: warning: writing '" + log_name_ + "' failed (" +
                               std::strerror(error) +
                               "): its last line is missing or cut short and no more lines "
                               "are written there\n",
                           false);
    }
  }
  out_.write(out, true);
}

}  // namespace nanoddp::run
