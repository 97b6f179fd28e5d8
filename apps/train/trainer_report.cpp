// What a run reports: the log lines, the --metrics JSON lines and the --trace file.
#include "trainer.h"

#include "nanoddp/comm/gloo_process_group.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <span>
#include <string_view>

#include "common/memory_report.h"
#include "common/output_files.h"
#include "common/rescue.h"
#include "final_output.h"
#include "nanoddp/config.h"
#include "nanoddp/engine/host_sync.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/file_io.h"
#include "trainer_internal.h"

namespace nanoddp::train {

namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
}

}  // namespace

void Trainer::log(std::int64_t step, std::int64_t epoch, float loss, std::optional<double> accuracy,
                  Window& w) {
  if (!is_main()) return;
  const double samples_per_s = 1000.0 * w.samples / std::max(w.wall_ms, 1e-9);
  const double n = static_cast<double>(w.steps);
  const double eta_s = static_cast<double>(steps_ - step) * (w.wall_ms / n) / 1000.0;
  if (!o_.quiet) {
    std::string comm;
    if (ddp_)
      comm = fmt::format("  comm {:.3f} ms (exposed {:.3f})", w.comm_ms / n, w.exposed_comm_ms / n);
    fmt::print(
        "step {:>{}}/{}  epoch {}  loss {:.6e}{}  {} samples/s  step {:.3f} ms  data "
        "{:.3f} ms{}  eta {}\n",
        step, std::to_string(steps_).size(), steps_, epoch, loss,
        accuracy ? fmt::format("  accuracy {:.4f}", *accuracy) : "",
        // Whole samples at usual rates; a model slower than 10 samples/s keeps its digits.
        samples_per_s >= 10 ? fmt::format("{:.0f}", samples_per_s)
                            : fmt::format("{:.3g}", samples_per_s),
        w.step_ms / n, w.data_ms / n, comm, format_duration(eta_s));
    std::fflush(stdout);
  }
  if (metrics_ != nullptr) {
    nlohmann::json line = {{"step", step},
                           {"epoch", epoch},
                           {"loss", loss},
                           {"step_ms", w.step_ms / n},
                           {"data_ms", w.data_ms / n},
                           {"samples_per_s", samples_per_s},
                           {"world_size", world_size_},
                           {"steps_in_window", w.steps}};
    // Train accuracy over the window's steps (all ranks' samples), with the model as it was at
    // each step's forward pass.
    if (accuracy) line["accuracy"] = *accuracy;
    line["forward_ms"] = w.forward_ms / n;
    line["backward_ms"] = w.backward_ms / n;
    line["optimizer_ms"] = w.optimizer_ms / n;
    line["host_syncs_per_step"] = static_cast<double>(w.host_syncs) / n;
    // What the named parts leave of the step (zero_grad, bookkeeping, time the process was not
    // running), so that the columns add up to step_ms instead of leaving a silent gap.
    line["other_ms"] = (w.step_ms - w.forward_ms - w.backward_ms - w.optimizer_ms -
                        (device_.is_cpu() ? w.exposed_comm_ms : 0.0)) /
                       n;
    // On every line, 0 without DDP (one process without a launcher): one schema for every run.
    line["comm_ms"] = w.comm_ms / n;
    line["exposed_comm_ms"] = w.exposed_comm_ms / n;
    // Share of the all-reduce time hidden behind the backward pass.
    line["overlap_fraction"] =
        w.comm_ms > 0 ? std::clamp(1.0 - w.exposed_comm_ms / w.comm_ms, 0.0, 1.0) : 0.0;
    if (o_.skip_nonfinite) line["skipped_steps"] = skipped_steps_;
    // What this rank (rank 0) holds now (comm::ZeroMemory says what each count is; under --zero 2
    // gradient_bytes is the most the bucket buffers held at once so far, plus the shard).
    const comm::ZeroMemory memory_held = memory();
    line["zero_stage"] = ddp_ && ddp_->zero() != nullptr ? ddp_->zero()->stage() : 0;
    line["parameter_bytes"] = memory_held.parameter_bytes;
    line["gradient_bytes"] = memory_held.gradient_bytes;
    line["averaged_gradient_bytes"] = memory_held.averaged_gradient_bytes;
    line["optimizer_state_bytes"] = memory_held.optimizer_state_bytes;
    // Every rank's, as of the latest exchange (the first logged step, then the last step): the
    // ranks' shards differ when a bucket does not divide by the world size.
    // This rank's entry is its memory now, as the fields above (a stage-2 "most held so far"
    // may grow after the first exchange).
    std::vector<comm::ZeroMemory> per_rank = memory_per_rank_;
    if (static_cast<std::size_t>(rank_) < per_rank.size()) per_rank[rank_] = memory_held;
    line["memory_per_rank"] = common::memory_per_rank_json<nlohmann::json>(per_rank);
    write_metrics_line(line.dump());
  }
}

namespace {

// The line's JSON, when it is one of nanoddp-train's records with an integer "step" (a '\r'
// before the newline is read past: a file edited on Windows).
std::optional<std::int64_t> record_step(std::string_view line) {
  if (line.ends_with('\r')) line.remove_suffix(1);
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
  // Ours: "steps_in_window" beside an integer "step" (another tool's lines with a step are kept).
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer() ||
      !record.contains("steps_in_window")) {
    return std::nullopt;
  }
  return record["step"].get<std::int64_t>();
}

// A last line without its newline that nanoddp-train was writing when it stopped: the start of
// one of its records (an object), not JSON on its own. Anything else is someone's line, kept.
bool cut_record(std::string_view line) {
  const auto first = line.find_first_not_of(" \t");
  return first != std::string_view::npos && line[first] == '{' &&
         nlohmann::json::parse(line, nullptr, false).is_discarded();
}

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ::ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

bool Trainer::purge_metrics(const std::filesystem::path& target) {
  // A temporary left by a resume killed while it rewrote (one run at a time holds the file's
  // lock, so none is being written now).
  const std::filesystem::path tmp = target.string() + ".resume-tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  // Pass 1, streaming (a metrics file may be large): is there anything to drop?
  std::int64_t dropped = 0;
  bool cut = false, unterminated = false;
  {
    std::ifstream in(target, std::ios::binary);
    if (!in.is_open()) {
      fmt::print(stderr,
                 "nanoddp-train: warning: --metrics '{}' cannot be read ({}): the steps after "
                 "step {} are not dropped, so they may appear twice\n",
                 o_.metrics_path, std::strerror(errno), start_step_);
      std::fflush(stderr);
      return false;
    }
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) {  // no newline after it
        unterminated = true;
        if (cut_record(line)) {
          cut = true;
          break;
        }
      }
      if (const auto step = record_step(line); step && *step > start_step_) ++dropped;
    }
  }
  if (dropped == 0 && !cut) return unterminated;
  // Pass 2: the kept lines into a temporary beside the file, with its mode and owner, then
  // renamed over it (through a symlink, over its target): a crash leaves the old file or the
  // new one, never half of either.
  struct stat info {};
  if (::stat(target.c_str(), &info) != 0) info.st_mode = 0644;
  // O_EXCL | O_NOFOLLOW: a symlink planted at the temporary's name is not followed.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  if (ok) {
    if (::fchown(fd, info.st_uid, info.st_gid) != 0) {
      // Refused unless root (the file then stays this user's): the mode is kept all the same.
    }
    ok = ::fchmod(fd, info.st_mode & 07777) == 0;
    std::ifstream in(target, std::ios::binary);
    ok = ok && in.is_open();
    for (std::string line; ok && std::getline(in, line);) {
      if (in.eof() && cut_record(line)) break;
      if (const auto step = record_step(line); step && *step > start_step_) continue;
      ok = write_all(fd, line) && write_all(fd, "\n");
    }
    // The whole file read, not a read error taken for its end (the rename would lose the rest).
    if (ok && (in.bad() || !in.eof())) {
      ok = false;
      errno = EIO;
    }
    ok = ok && ::fsync(fd) == 0;
    // Locked before it takes the file's place, so that the lock this run holds moves with it:
    // no moment in which another run could take the new file.
    ok = ok && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  }
  std::string why = ok ? std::string() : std::strerror(errno != 0 ? errno : EIO);
  if (ok) {
    std::filesystem::rename(tmp, target, ec);
    ok = !ec;
    if (ec) why = ec.message();
  }
  if (ok) {
    metrics_lock_ = common::FileLock(fd, {});  // keeps the descriptor, and so the lock
  } else {
    if (fd >= 0) ::close(fd);
    std::filesystem::remove(tmp, ec);
    // The metrics do not decide the run (a full disk while writing them is a warning too): the
    // resumed run appends after the old lines, on a line of its own.
    fmt::print(stderr,
               "nanoddp-train: warning: --metrics '{}': could not drop the lines of the steps "
               "after step {} ({}); the resumed run appends after them, so those steps appear "
               "twice\n",
               o_.metrics_path, start_step_, why);
    std::fflush(stderr);
    return unterminated;
  }
  fmt::print(
      stderr,
      "nanoddp-train: --metrics '{}': resuming at step {}; dropped {} line(s) of later steps "
      "(they are trained again){}\n",
      o_.metrics_path, start_step_, dropped, cut ? " and an incomplete last line" : "");
  std::fflush(stderr);
  return false;
}

void Trainer::open_metrics() {
  if (const int fd = common::standard_stream(o_.metrics_path); fd != 0) {
    metrics_ = fd == 1 ? &std::cout : &std::cerr;  // the program's own stream (see the helper)
    return;
  }
  // Only a regular file is read back: a device, a FIFO (or /dev/stdout, above) would be read
  // forever, or block, and is only appended to.
  const bool device = common::names_a_device(o_.metrics_path);
  const std::filesystem::path target = common::resolved_path(o_.metrics_path);
  std::error_code ec;
  const bool regular = !device && std::filesystem::is_regular_file(target, ec);
  const bool needs_newline = start_step_ > 0 && regular && purge_metrics(target);
  // A resumed run continues the earlier run's metrics instead of erasing them; a new one empties
  // the file first. Either way it is written in append mode (O_APPEND): a file emptied under the
  // run (`: > m.jsonl`) then gets the next line at its start, where it used to get a hole of NUL
  // bytes up to the old length, glued to that line (an outside adversary's find).
  errno = 0;
  if (start_step_ == 0 && regular) {
    std::ofstream(o_.metrics_path, std::ios::trunc);  // (its failure is the open's below)
  }
  metrics_file_.open(o_.metrics_path, std::ios::app);
  if (!metrics_file_) {
    fail("cannot open --metrics file '{}' for writing: {}", o_.metrics_path,
         errno != 0 ? std::strerror(errno) : "unknown error");
  }
  metrics_ = &metrics_file_;
  // The old last line had none: the next line starts its own.
  if (needs_newline) metrics_file_ << "\n";
  if (device) return;  // nothing to lock
  // Held for the run since check_output_paths (another run on the same file is refused at its
  // start); a file created just now is locked here (lock_file takes regular files only).
  if (!metrics_lock_.held()) lock_metrics();
}

void Trainer::write_metrics_line(const std::string& line) {
  *metrics_ << line << "\n";
  metrics_->flush();
  if (*metrics_) return;
  // A full disk (or a vanished file system) used to truncate the file silently. Training goes
  // on, as its checkpoints and output do not depend on the metrics; said once, on stderr.
  fmt::print(stderr,
             "nanoddp-train: warning: writing --metrics file '{}' failed ({}); its last lines are "
             "missing and no more are written\n",
             o_.metrics_path, errno != 0 ? std::strerror(errno) : "unknown error");
  std::fflush(stderr);
  if (metrics_ == &metrics_file_) {
    metrics_file_.close();
  } else {
    metrics_->clear();  // std::cout or std::cerr: usable by others again
  }
  metrics_ = nullptr;
}

void Trainer::keep_metrics() {
  if (!is_main() || metrics_ != &metrics_file_ || !metrics_lock_.held()) return;
  metrics_file_.flush();
  struct stat held {
  }, named{};
  const std::string target = common::resolved_path(o_.metrics_path).string();
  if (::fstat(metrics_lock_.fd(), &held) != 0 ||
      (::stat(target.c_str(), &named) == 0 && named.st_dev == held.st_dev &&
       named.st_ino == held.st_ino)) {
    return;  // still under its name (the usual case)
  }
  if (held.st_nlink > 0) {  // renamed or moved: the lines are in it, under its new name
    fmt::print(stderr,
               "nanoddp-train: warning: --metrics '{}' no longer names this run's metrics file "
               "(moved or renamed during the run?); its lines went on into that file\n",
               o_.metrics_path);
    std::fflush(stderr);
    return;
  }
  // Its folder (or the file) was removed during the run: every line since went into a file that
  // no name reaches, to be freed at exit. The lock's descriptor still holds it; /proc reads it.
  std::vector<std::byte> bytes;
  try {
    bytes = nn::read_file_bytes(fmt::format("/proc/self/fd/{}", metrics_lock_.fd()));
  } catch (const std::exception& e) {
    fmt::print(stderr, "nanoddp-train: warning: --metrics '{}' was removed during the run: {}\n",
               o_.metrics_path, e.what());
    return;
  }
  const std::span<const std::byte> whole(bytes);
  const std::string problem =
      // Gone from its name: another file there now (the user's, another run's) is not replaced.
      write_final_output(
          "--metrics", o_.metrics_path,
          [&](const std::string& path) {
            return nn::write_file_atomically(path, std::span(&whole, 1));
          },
          common::FileState{});
  if (problem.empty()) {
    fmt::print(stderr,
               "nanoddp-train: warning: --metrics '{}' was removed during the run; written again "
               "whole\n",
               o_.metrics_path);
  } else {
    // As a full disk under --metrics: a warning, not a failed run (the metrics are a record of
    // the run, not its result).
    fmt::print(stderr, "nanoddp-train: warning: {}\n", problem);
  }
  std::fflush(stderr);
}

// A trace is held in memory on every rank and on rank 0 whole, then read whole by the tools
// that draw it (plot_trace.py reads up to 256 MiB, nanoddp-sim up to 1 GiB): a --trace-steps far
// beyond the few steps a timeline needs is said at its first step, not found at the end (an
// outside tester's 50,000 steps of a tiny model made 65 MB).
void Trainer::warn_of_trace_size() const {
  if (!is_main()) return;
  constexpr double kPlotLimit = 256.0 * (1 << 20);
  const std::int64_t traced = std::min(o_.trace_steps, steps_ - start_step_);
  const double bytes = static_cast<double>(tracer_->events_json().size()) *
                       static_cast<double>(traced) * world_size_;
  if (bytes <= kPlotLimit) return;
  fmt::print(stderr,
             "nanoddp-train: warning: --trace-steps {} will make a trace of about {:.0f} MiB "
             "(its first step's size x {} steps x {} rank(s)), held in memory until it is "
             "written; plot_trace.py reads at most 256 MiB and nanoddp-sim 1 GiB. A few steps "
             "show the timeline: --trace-steps 5\n",
             o_.trace_steps, bytes / (1 << 20), traced, world_size_);
  std::fflush(stderr);
}

// The trace of a run that stopped inside its traced steps (a collective that timed out, a NaN
// stop, a peer lost) cannot be gathered on rank 0: the peers may be gone or stuck. So each rank
// writes what it traced itself, as PyTorch's NCCL flight recorder dumps each rank's record, to
// T.rankR.partial.json beside --trace T: what a hung job's ranks were doing when it stopped is
// what a trace is most often asked for. --trace itself is left as it was. A device span that
// never ended (a hung GPU) is left out rather than waited for.
std::string partial_trace_path(const std::string& trace_path, int rank) {
  std::string path = trace_path;
  if (path.ends_with(".json")) path.resize(path.size() - 5);
  return path + fmt::format(".rank{}.partial.json", rank);
}

// A writer killed mid-write (a second Ctrl-C: the launcher's SIGKILL) leaves its hidden
// temporary, ".T.rankR.partial.json.tmp.HOST.PID.K", tens of megabytes that nothing listed (an
// outside tester's): removed at the next run's start when its writer, on this host, is gone.
void remove_stale_partial_traces(const std::string& trace_path) {
  namespace fs = std::filesystem;
  // ".T.rank": every rank's, by the name's part before its rank (built by append: GCC 12 warns
  // falsely of an overlapping copy for "." + a substring).
  const std::string name0 = fs::path(partial_trace_path(trace_path, 0)).filename().string();
  std::string prefix(1, '.');
  prefix.append(name0, 0, name0.rfind(".rank0.") + 5);
  const fs::path folder = fs::path(trace_path).parent_path();
  nn::remove_stale_temporaries(folder.empty() ? fs::path(".") : folder, prefix);
}

void Trainer::write_partial_trace(const std::string& cause) const noexcept {
  if (partial_trace_written_.exchange(true)) return;
  const std::int64_t step = step_;
  const std::string path = partial_trace_path(o_.trace_path, rank_);
  try {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      throw std::runtime_error(S_ISLNK(st.st_mode)
                                   ? "it is a symbolic link; left as it is"
                                   : "it exists and is not a regular file; left as it is");
    }
    std::size_t dropped = 0;
    const std::string events = tracer_->events_json(Tracer::Pending::kDrop, &dropped);
    // partial: the tools refuse to take it for a whole run (nanoddp-sim) or say what it is.
    const std::string config = fmt::format(
        R"({{"name":"run_config","ph":"M","pid":{},"args":{{"batch":{},"grad_accum":{},)"
        R"("first_step":{},"last_step":{},"restart":{},"partial":true,"rank":{},)"
        R"("world_size":{},"stopped_in_step":{}}}}})",
        rank_, o_.batch, o_.grad_accum, start_step_ + 1, step, world_.restart_count, rank_,
        world_size_, step);
    std::vector<std::span<const std::byte>> chunks;
    const std::vector<std::string> all = {config, events};
    for (const std::string_view piece : Tracer::file_pieces(all)) {
      chunks.push_back(std::as_bytes(std::span(piece)));
    }
    // Its folder was checked before step 1: one removed since (a clean-up job) is made again,
    // and a write that fails goes to a rescue folder, as the whole trace's would (an outside
    // tester lost both ranks' partial traces to a folder removed during the run).
    std::string written = path;
    try {
      const std::filesystem::path folder = std::filesystem::path(path).parent_path();
      std::error_code ignored;
      if (!folder.empty()) std::filesystem::create_directories(folder, ignored);
      nn::write_file_atomically(path, chunks);
    } catch (const std::exception& e) {
      std::string problem;
      const std::string name = std::filesystem::path(path).filename().string();
      const std::string rescued = common::rescue(
          [&](const std::string& into) { nn::write_file_atomically(into + "/" + name, chunks); },
          &problem);
      if (rescued.empty()) throw std::runtime_error(fmt::format("{}; {}", e.what(), problem));
      written = rescued + "/" + name;
      fmt::print(stderr, "nanoddp-train: warning: rank {} could not write '{}': {}\n", rank_, path,
                 e.what());
    }
    fmt::print(
        stderr,
        "nanoddp-train: note: rank {} {} in step {}, inside its traced steps: what it "
        "traced is in '{}' (this rank's events alone{})\n",
        rank_, cause, step, written,
        dropped > 0 ? fmt::format("; {} device span(s) that never ended left out", dropped) : "");
  } catch (const std::exception& e) {
    try {  // on the way out of a failed run: nothing may replace its error
      fmt::print(stderr,
                 "nanoddp-train: note: rank {} could not write what it traced to '{}': {}\n", rank_,
                 path, e.what());
    } catch (...) {
    }
  } catch (...) {
  }
  std::fflush(stderr);
}

std::vector<std::string> Trainer::gather_trace_events() {
  std::vector<std::string> all;  // each rank's events, on rank 0
  if (!distributed_) {
    all.push_back(tracer_->events_json());
  } else {
    // Every rank hands its events to rank 0 through the store, in pieces far below the store's
    // value limit (a long trace exceeded it: the job failed after training); rank 0 takes each
    // piece and removes it, then writes one file.
    constexpr std::size_t kPiece = 4u << 20;
    const std::string events = tracer_->events_json();
    const std::size_t pieces = (events.size() + kPiece - 1) / kPiece;
    for (std::size_t k = 0; k < pieces; ++k) {
      dist_->store->set(fmt::format("train/trace/{}/{}", rank_, k),
                        events.substr(k * kPiece, kPiece));
    }
    dist_->store->set(fmt::format("train/trace/{}/pieces", rank_), std::to_string(pieces));
    if (is_main()) {
      for (int r = 0; r < world_size_; ++r) {
        const std::string count = dist_->store->get_string(fmt::format("train/trace/{}/pieces", r));
        std::string text;
        for (std::size_t k = 0; k < std::stoull(count); ++k) {
          const std::string key = fmt::format("train/trace/{}/{}", r, k);
          text += dist_->store->get_string(key);
          dist_->store->remove(key);
        }
        all.push_back(std::move(text));
      }
    }
  }
  return all;
}

std::string Trainer::write_trace(std::vector<std::string> all) {
  if (!is_main()) return {};
  // What the events alone do not say: nanoddp-sim checks a scaling baseline's batch with it;
  // the steps traced are the run's own numbers (a resumed or restarted run's first traced step
  // is not step 1) and the launcher's attempt.
  const std::int64_t first = start_step_ + 1;
  const std::int64_t last = last_traced_step_ > 0 ? last_traced_step_ : start_step_;
  all.insert(all.begin(),
             fmt::format(R"({{"name":"run_config","ph":"M","pid":0,"args":{{"batch":{},)"
                         R"("grad_accum":{},"first_step":{},"last_step":{},"restart":{}}}}})",
                         o_.batch, o_.grad_accum, first, last, world_.restart_count));
  // Through a symlink (even to a file not written yet) its target; the link stays.
  std::string problem = write_final_output(
      "--trace", o_.trace_path,
      [&](const std::string& path) {
        std::vector<std::span<const std::byte>> chunks;
        for (const std::string_view piece : Tracer::file_pieces(all)) {
          chunks.push_back(std::as_bytes(std::span(piece)));
        }
        return nn::write_file_atomically(path, chunks);
      },
      trace_checked_, trace_target_,
      // During training the other ranks wait for this one in their next collective, for
      // NANODDP_TIMEOUT_S: a lock held by another job is waited for a quarter of that at most
      // (the whole of it timed them out, blaming rank 0: an outside tester's).
      last_traced_step_ > 0 && last_traced_step_ < steps_
          ? std::min<std::chrono::milliseconds>(comm::default_timeout() / 4,
                                                std::chrono::seconds(5))
          : std::chrono::milliseconds(0));
  if (problem.empty() && !o_.quiet) {
    fmt::print("trace written to {} (steps {} to {})\n", o_.trace_path, first, last);
    std::fflush(stdout);
  }
  return problem;
}

void Trainer::print_banner() const {
  if (is_main() && !o_.quiet) {
    fmt::print("nanoddp-train {} | device {} | {} | {} parameters | {}\n", NANODDP_VERSION,
               device_.str(), model_->describe(), params_->numel(), optimizer_->describe());
    fmt::print("data: {} samples x {} -> {} | {} rank(s) x batch {}{} | {} steps ({} per epoch)\n",
               dataset_->size(), dataset_->in_features(),
               classify() ? fmt::format("{} classes", o_.classes)
                          : std::to_string(dataset_->out_features()),
               world_size_, o_.batch,
               o_.grad_accum > 1 ? fmt::format(" x {} micro-batches", o_.grad_accum) : "", steps_,
               steps_per_epoch_);
    if (ddp_) {
      // Plain "gloo" is TCP: say whose ring, as it changes the step's speed.
      std::string backend = dist_->group->backend_name();
      const auto* gloo = dynamic_cast<const comm::GlooProcessGroup*>(dist_->group.get());
      if (gloo != nullptr && backend == "gloo" && world_size_ > 1) {
        backend += gloo->uses_tcp_ring() ? " (nanoddp's TCP ring)" : " (Gloo's TCP ring)";
      }
      fmt::print(
          "ddp: backend {} | {} buckets (first {} MiB, then {} MiB) | overlap {} | hook {}\n",
          backend, ddp_->reducer().buckets().size(), o_.first_bucket_mb, o_.bucket_cap_mb,
          o_.overlap ? "on" : "off",
          o_.zero == 2 ? o_.comm_hook + " (each bucket reduce-scattered: --zero 2)" : o_.comm_hook);
      if (ddp_->zero() != nullptr) fmt::print("{}\n", ddp_->zero()->describe());
    }
    // Seen before step 1 through a pipe too (tee, a launcher): the run has passed its checks.
    std::fflush(stdout);
  }
}

void Trainer::print_summary(double run_seconds, std::optional<float> first_loss, float last_loss,
                            std::optional<double> last_accuracy) const {
  if (!is_main()) return;
  // "nan", not "-nan": the sign of a NaN means nothing.
  const auto text = [](std::optional<float> v) {
    if (!v) return std::string("-");
    return std::isnan(*v) ? std::string("nan") : fmt::format("{:.6e}", *v);
  };
  fmt::print(
      "done: {} steps in {:.2f} s, loss {} -> {}{}{}{}\n", steps_ - start_step_, run_seconds,
      text(first_loss), text(first_loss ? std::optional(last_loss) : std::nullopt),
      last_accuracy ? fmt::format(", train accuracy {:.4f}", *last_accuracy) : "",
      o_.skip_nonfinite ? fmt::format(", {} step(s) skipped for NaN/Inf", skipped_steps_) : "",
      o_.save_path.empty() ? "" : fmt::format(", parameters saved to {}", o_.save_path));
}

}  // namespace nanoddp::train
