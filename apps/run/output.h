#pragma once
// Worker output, line by line: the bytes read from one worker pipe are cut into lines, and each
// complete line goes out as "[rank R] line\n" in one piece. The launcher is the only writer of
// its stdout and stderr and writes whole lines, so lines of different ranks never interleave
// mid-line, however the workers' writes were split by the pipes.
//
// Its stdout and stderr are Consoles: a reader that pauses (a pager, a terminal's Ctrl-S, a
// stalled log shipper) must not block the launcher. A blocked launcher stops reading the
// workers' pipes, a worker then blocks on its next line, and its peers time out blaming it: an
// outside tester lost a healthy job to `nanoddp-run ... | (sleep 30; cat)`.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace nanoddp::run {

// Writes all of `data` to `fd`, retrying after EINTR and short writes. Errors (a closed terminal,
// EPIPE from `| head`, a full disk) drop the rest. Returns 0 when everything was written, else
// the errno of the failure (ENOSPC for a write that made no progress on a full disk). Blocks
// while `fd` does: for files only, never for the launcher's stdout or stderr (Console).
int write_all(int fd, std::string_view data);

// The launcher's stdout or stderr. write() queues and returns at once; a thread of its own does
// the writes, which may block as long as the reader pauses. Up to kMaxQueued bytes wait; beyond
// that, worker lines are dropped (the --log-dir files still get them), and once the reader has
// caught up one line says how many were dropped. The launcher's own messages are kept up to
// twice that.
class Console {
 public:
  static constexpr std::size_t kMaxQueued = 4 << 20;

  static Console& out();  // STDOUT_FILENO
  static Console& err();  // STDERR_FILENO

  // `droppable`: a worker's line, which may be dropped while the reader is too far behind.
  void write(std::string_view data, bool droppable);
  // Waits until everything queued is written (or failed), up to `until`: before the launcher
  // exits. Returns whether it all went. Bounded: an outside tester's reader that never read
  // again kept a finished job's launcher waiting for ever. main() waits in slices, so that
  // SIGTERM and Ctrl-C still end the wait.
  bool flush(std::chrono::steady_clock::time_point until);
  // What a flush() that timed out left unwritten, as a note for the other console ("N bytes of
  // stdout, the last lines and the summary among them, ...") that says how the launcher exited
  // (`how`: "after waiting 10 s"); empty when nothing is left.
  std::string unwritten_note(const std::string& how);
  // Where the dropped lines can still be read, for the note about them.
  void set_drop_hint(std::string hint);
  // A rank's --log-dir file missed lines (a failed write, a log that could not be opened): the
  // note about dropped lines no longer says the files have every line (both consoles).
  static void logs_incomplete();

  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

 private:
  Console(int fd, std::string name);
  void run();  // the writer thread

  const int fd_;
  const std::string name_;
  std::mutex mutex_;
  std::condition_variable wake_;  // the writer: something to write
  std::condition_variable idle_;  // flush(): everything written
  std::string pending_;           // queued, not yet handed to write()
  std::size_t in_flight_ = 0;     // handed to write(), not yet written
  bool dropping_ = false;         // until the queue is down to half: no worker line is queued
  std::size_t dropped_lines_ = 0;
  std::string drop_hint_;
  bool started_ = false;
  bool write_failed_ = false;  // the writer thread's: a failed write has been said
};

class LineSink {
 public:
  // Lines up to this long are written whole. A longer one is written in pieces of this size,
  // so that a worker that never prints a newline cannot grow the launcher's memory; each piece
  // but the last ends in kCutMark (console and log alike), and the first cut of a sink is
  // announced on stderr: a reader must never take a piece for a whole line (an outside tester
  // found 64 KiB pieces passed off as lines).
  static constexpr std::size_t kMaxLine = 1 << 20;
  static constexpr std::string_view kCutMark = " [nanoddp-run: cut at 1 MiB, continued]";

  // `log_fd` < 0: no log file. Otherwise lines are also written there, without the prefix. When
  // a write there fails (a full disk), one warning naming `log_name` goes to stderr and the
  // log gets no more lines (a line cut short would look complete). Sinks sharing one log (a
  // rank's stdout and stderr) share `log_failed`, so that the warning comes once. `source`
  // names the stream in messages: "rank 1's stdout".
  LineSink(Console& out, std::string prefix, std::string source, int log_fd = -1,
           std::string log_name = {},
           std::shared_ptr<bool> log_failed = std::make_shared<bool>(false))
      : out_(out),
        prefix_(std::move(prefix)),
        source_(std::move(source)),
        log_fd_(log_fd),
        log_name_(std::move(log_name)),
        log_failed_(std::move(log_failed)) {}

  void feed(std::string_view bytes);
  // Writes a final line that did not end with a newline (adding one). Call when the pipe closed.
  void flush();

 private:
  void emit(std::string_view line, std::string_view mark = {});  // without its '\n'
  void cut();  // writes partial_'s first kMaxLine bytes as a marked piece

  Console& out_;
  std::string prefix_;
  std::string source_;
  bool cut_announced_ = false;
  int log_fd_;
  std::string log_name_;
  std::shared_ptr<bool> log_failed_;
  std::string partial_;  // bytes after the last newline seen
};

}  // namespace nanoddp::run
