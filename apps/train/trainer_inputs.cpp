// Input checks before step 1 (issue #13): outputs writable, the ranks' input files identical,
// an --init file of the same model; and loading the .npy dataset.
#include "trainer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "classification.h"
#include "common/output_files.h"
#include "final_output.h"
#include "nanoddp/comm/consistency.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"
#include "trainer_internal.h"

namespace nanoddp::train {

namespace {

// Creates `dir` if needed (into `created`) and creates (then removes) a small file in it:
// O_EXCL, so an existing file of that name is never touched. `flag` names the option in the
// message.
void check_dir_writable(const std::string& flag, const std::string& dir,
                        common::CreatedFolders& created) {
  std::error_code ec;
  created.create(dir, ec);
  if (ec) fail("{} '{}' cannot be created: {}", flag, dir, ec.message());
  if (!std::filesystem::is_directory(dir, ec)) {
    fail("{} '{}' is not a folder (it is a file); name a folder", flag, dir);
  }
  for (int k = 0;; ++k) {
    const std::filesystem::path probe =
        std::filesystem::path(dir) / fmt::format(".nanoddp-write-test.{}.{}", ::getpid(), k);
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST && k < 100) continue;
    if (fd < 0) {
      fail("{} '{}' is not writable (cannot create '{}': {})", flag, dir, probe.string(),
           std::strerror(errno));
    }
    ::close(fd);
    // Outputs are put in place by rename, and a staged file is removed when its write fails: a
    // folder that takes new files but lets none be renamed or removed (chattr +a) would fail
    // only after the last step.
    const std::string renamed = probe.string() + ".renamed";
    if (::rename(probe.c_str(), renamed.c_str()) != 0) {
      const int err = errno;
      const bool removed = ::unlink(probe.c_str()) == 0;
      fail(
          "{} '{}' lets files be created but not renamed (renaming '{}': {}), and outputs are put "
          "in place by rename: an append-only folder (chattr +a)? Remove the attribute or name "
          "another folder{}",
          flag, dir, probe.string(), std::strerror(err),
          removed ? "" : fmt::format(" (the probe '{}' is left there)", probe.string()));
    }
    if (::unlink(renamed.c_str()) != 0) {
      fail(
          "{} '{}' lets files be created but not removed (removing '{}': {}), as the run does "
          "with a staged file whose write failed: an append-only folder (chattr +a)? Remove the "
          "attribute or name another folder (the probe '{}' is left there)",
          flag, dir, renamed, std::strerror(errno), renamed);
    }
    return;
  }
}

// An output FILE given by `flag`, checked before step 1 instead of failing after the last one:
// it must name a file (not a folder, no trailing '/'), its folder must be writable (a probe file
// is created and removed there), and an existing file there must be writable.
void check_output_file(const std::string& flag, const std::string& path,
                       common::CreatedFolders& created, bool renamed_over = true) {
  std::error_code ec;
  // Written by renaming a complete file over the name: over the file the shell redirected stdout
  // to, that would replace the whole log (an outside tester's `--trace /dev/stdout > log`).
  if (common::standard_stream(path) != 0) {
    fail(
        "{} '{}' names this program's standard output or error, which a file written by rename "
        "would replace; give a file name",
        flag, path);
  }
  // Written by rename: a device or FIFO of that name (through a link too) would itself be
  // replaced, not written to; as root, --trace /dev/null replaced the system's /dev/null with a
  // file (an outside tester's).
  if (renamed_over) {
    const std::filesystem::file_status status = std::filesystem::status(path, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
        !std::filesystem::is_directory(status)) {
      fail(
          "{} '{}' exists and is not a regular file (a device, FIFO or socket), which the file "
          "written by rename would replace; name a regular file",
          flag, path);
    }
    ec.clear();
  }
  // A symlink loop fails only when the file is finally written, after training.
  (void)std::filesystem::status(path, ec);
  if (ec == std::errc::too_many_symbolic_link_levels) {
    fail("{} '{}' is a loop of symbolic links; give a file name", flag, path);
  }
  ec.clear();
  const std::filesystem::path before_slash = std::filesystem::path(path).parent_path();
  if (path.ends_with('/') && std::filesystem::exists(before_slash, ec) &&
      !std::filesystem::is_directory(before_slash, ec)) {
    fail("{} '{}' ends with '/', but '{}' is a file: drop the '/'", flag, path,
         before_slash.string());
  }
  // "x/.." and "x/." name folders even before x exists (the check below would create x first).
  const std::filesystem::path last = std::filesystem::path(path).filename();
  if (path.ends_with('/') || last == "." || last == ".." ||
      std::filesystem::is_directory(path, ec)) {
    fail("{} '{}' names a folder; give a file name (e.g. '{}')", flag, path,
         (std::filesystem::path(path) / "out").lexically_normal().string());
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  const std::string dir = folder.empty() ? std::string(".") : folder.string();
  check_dir_writable(fmt::format("the folder of {}", flag), dir, created);
  // Through a symlink to a file not written yet, the file written is its target: its folder
  // must be there too (an outside tester's link got replaced, its target never written).
  const std::filesystem::path target_folder = common::resolved_path(path).parent_path();
  if (!target_folder.empty() && !std::filesystem::equivalent(target_folder, dir, ec)) {
    check_dir_writable(fmt::format("the folder of {}'s link target", flag), target_folder.string(),
                       created);
  }
  // A rescue copy, should the output need one, is written under the file's own name through a
  // temporary ".NAME.tmp.HOST.PID.K" (the install itself stages it under a short name of its
  // own): a name that fits while that temporary does not would fail the rescue after training.
  // Through a symlink the file written is its target (a third tester's link to a long name).
  const std::filesystem::path target = common::resolved_path(path);
  const std::string given_name = std::filesystem::path(path).filename().string();
  const std::string name = target.filename().string().size() > given_name.size()
                               ? target.filename().string()
                               : given_name;
  const long limit = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const std::size_t name_max = limit > 0 ? static_cast<std::size_t>(limit) : 255;
  const std::size_t extra = 1 + 5 + nn::this_host().size() + 1 + 10 + 1 + 10;
  if (name.size() + extra > name_max) {
    fail(
        "{} '{}': the file name is too long to write safely: a rescue copy, should one be "
        "needed, is written as a temporary '.{}.tmp.{}.PID.K' first, which would pass the file "
        "system's limit of {} bytes. Use a name of at most {} bytes",
        flag, path, name.size() > 40 ? name.substr(0, 40) + "..." : name, nn::this_host(), name_max,
        name_max > extra ? name_max - extra : 0);
  }
  if (std::filesystem::exists(path, ec)) {
    // --metrics without --resume is truncated in place (a file mounted there is fine); with it,
    // rewritten whole and renamed over the old file, as the final outputs are.
    if (const auto why = not_replaceable(target.string());
        why && (renamed_over || !why->mount_point)) {
      fail("{} '{}' {}, and {}, which that refuses. {}", flag, path, why->what,
           renamed_over ? "the output is put in place by a rename over it"
                        : "the run truncates it at its start",
           why->fix);
    }
    // Opened without O_TRUNC and closed at once: the existing contents are kept.
    // O_NONBLOCK: a FIFO without a reader would block the open (it fails with ENXIO instead).
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("{} '{}' exists and is not writable: {}", flag, path, std::strerror(errno));
    ::close(fd);
  }
}

}  // namespace

// Every output path, checked by rank 0 (which writes them all) before the process group.
void Trainer::check_output_paths() {
  std::error_code ec;
  if (!o_.checkpoint_dir.empty() && std::filesystem::exists(o_.checkpoint_dir, ec) &&
      !std::filesystem::is_directory(o_.checkpoint_dir, ec)) {
    // With --resume this used to find "no checkpoint" and train from step 0, silently.
    fail("--checkpoint-dir '{}' is a file, not a folder: name the folder of the checkpoints",
         o_.checkpoint_dir);
  }
  if (o_.checkpoint_every > 0) {
    check_dir_writable("--checkpoint-dir", o_.checkpoint_dir, created_folders_);
    // Before looking at what it holds: a second run, even a --resume, on a folder a running job
    // writes would take that job's checkpoints for its own (an outside adversary's two jobs
    // failed only later, at a name clash, or resumed from each other).
    lock_checkpoint_dir();
    // Another run's checkpoints: this run would write beside them (a later --resume takes the
    // newest of either run) and could meet one of the same step. Refused rather than guessed.
    const std::vector<std::string> earlier = nn::list_checkpoints(o_.checkpoint_dir);
    if (!o_.resume && !earlier.empty()) {
      fail(
          "--checkpoint-dir '{}' already holds {} checkpoint(s) of an earlier run (newest: {}). "
          "Pass --resume to continue that run, or use an empty folder (or remove them) to start "
          "a new one",
          o_.checkpoint_dir, earlier.size(), earlier.back());
    }
  }
  if (!o_.save_path.empty()) {
    check_output_file("--save", o_.save_path, created_folders_);
    save_target_ = common::resolved_path(o_.save_path).string();
    save_checked_ = common::file_state(save_target_);
  }
  if (!o_.trace_path.empty()) {
    check_output_file("--trace", o_.trace_path, created_folders_);
    trace_target_ = common::resolved_path(o_.trace_path).string();
    trace_checked_ = common::file_state(trace_target_);
    if (trace_checked_.exists && world_.restart_count > 0 && is_main()) {
      // A restarted attempt traces its own first steps (run_config's restart says which): the
      // attempt that failed loses its trace, said rather than found out (an outside tester's).
      fmt::print(stderr,
                 "nanoddp-train: note: --trace '{}' exists (an earlier attempt's trace?); this "
                 "attempt ({} restart(s)) replaces it once its traced steps are done\n",
                 o_.trace_path, world_.restart_count);
    }
  }
  if (o_.metrics_path.empty() || common::standard_stream(o_.metrics_path) != 0) {
    // Nothing, or /dev/stdout and the like: written through the program's own stream.
  } else if (common::names_a_device(o_.metrics_path)) {
    // /dev/null, a FIFO, ...: appended to, so it must open for writing; no folder to probe (a
    // user other than root cannot create a file in /dev).
    const int fd = ::open(o_.metrics_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      fail("--metrics '{}' cannot be opened for writing: {}", o_.metrics_path,
           std::strerror(errno));
    }
    ::close(fd);
  } else {
    check_output_file("--metrics", o_.metrics_path, created_folders_, o_.resume);
  }
  check_paths_distinct();
  // Last (it creates a missing file, so after every refusal): taken before a resumed run
  // rewrites the file, and held while the run writes it.
  if (!o_.metrics_path.empty() && common::standard_stream(o_.metrics_path) == 0 &&
      !common::names_a_device(o_.metrics_path)) {
    lock_metrics();
  }
}

void Trainer::lock_checkpoint_dir() {
  bool busy = false;
  std::string problem;
  checkpoint_lock_ = common::lock_folder(o_.checkpoint_dir, &busy, &problem);
  // A restarted worker may start while the one it replaces is still exiting (a launcher of
  // another make): it waits for the lock a while rather than fail the restart.
  for (int tries = 0; busy && world_.restart_count > 0 && tries < 100; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    checkpoint_lock_ = common::lock_folder(o_.checkpoint_dir, &busy, &problem);
  }
  if (busy) {
    fail(
        "--checkpoint-dir '{}' is locked by another process (another run writing checkpoints "
        "there?); wait for it to end, or give this run a folder of its own",
        o_.checkpoint_dir);
  }
  if (!problem.empty()) {
    fmt::print(stderr,
               "nanoddp-train: warning: --checkpoint-dir '{}' cannot be locked ({}): another run "
               "writing the same folder would not be noticed\n",
               o_.checkpoint_dir, problem);
    std::fflush(stderr);
  }
}

// Two runs writing one file would interleave, or replace, each other's lines without a word.
void Trainer::lock_metrics() {
  bool busy = false;
  std::string problem;
  // The file itself: through a symlink (even to a file not written yet), its target.
  metrics_lock_ =
      common::lock_file(common::resolved_path(o_.metrics_path).string(), &busy, &problem);
  if (busy) {
    fail(
        "--metrics '{}' is being written by another run (it holds the file's lock); give this "
        "run a file of its own",
        o_.metrics_path);
  }
  if (!problem.empty()) {
    fmt::print(stderr,
               "nanoddp-train: warning: --metrics '{}' cannot be locked ({}): another run writing "
               "the same file would not be noticed\n",
               o_.metrics_path, problem);
    std::fflush(stderr);
  }
}

// Two outputs on one file lose one of them silently (--save f --trace f kept the trace), and an
// output on an input destroys it (--metrics X.npy overwrote the data): refused before step 1.
// The final --save must not take a checkpoint's name either (a later --resume would find the
// parameters file where it expects the checkpoint).
void Trainer::check_paths_distinct() const {
  struct Named {
    const char* flag;
    const std::string* path;
    bool output;
  };
  const Named all[] = {{"--save", &o_.save_path, true},        {"--trace", &o_.trace_path, true},
                       {"--metrics", &o_.metrics_path, true},  {"--data", &o_.data_path, false},
                       {"--targets", &o_.targets_path, false}, {"--init", &o_.init_path, false}};
  // "f" and "./f", or a symlink to a file not written yet, name one file: compared resolved.
  const auto canonical = [](const std::string& path) { return common::resolved_path(path); };
  for (std::size_t i = 0; i < std::size(all); ++i) {
    if (all[i].path->empty()) continue;
    for (std::size_t j = i + 1; j < std::size(all); ++j) {
      if (all[j].path->empty() || !(all[i].output || all[j].output)) continue;
      // (A hard link is another name of the same inode: same_file compares those.)
      if (canonical(*all[i].path) == canonical(*all[j].path) ||
          common::same_file(*all[i].path, *all[j].path)) {
        fail("{} '{}' and {} '{}' name the same file: {}", all[i].flag, *all[i].path, all[j].flag,
             *all[j].path,
             all[j].output ? "one output would overwrite the other; give each its own file"
                           : "the output would overwrite the input; write it elsewhere");
      }
    }
  }
  // Nor a name the final outputs' writer gives its own files: the next run would take the output
  // for a killed run's leftover and remove it (a third adversary's --save did).
  for (const Named& output : all) {
    if (!output.output || output.path->empty()) continue;
    for (const std::string& name : {std::filesystem::path(*output.path).filename().string(),
                                    common::resolved_path(*output.path).filename().string()}) {
      if (is_staged_name(name)) {
        fail(
            "{} '{}' takes a name nanoddp-train gives its staged outputs (.nanoddp-out.tmp.*), "
            "which a later run may remove as a leftover: name it otherwise",
            output.flag, *output.path);
      }
    }
  }
  // Nor may any other output (an outside tester's --metrics ckpt/step-000000003.safetensors was
  // accepted, and the run failed at step 3), by its name or through a symlink to a checkpoint
  // (a second tester's resumed run appended its metrics to one).
  if (!o_.checkpoint_dir.empty()) {
    const std::filesystem::path checkpoints = canonical(o_.checkpoint_dir);
    // A checkpoint's name, or a checkpoint writer's temporary (which the next save removes).
    const auto is_checkpoint = [&](const std::filesystem::path& p) {
      const std::string name = p.filename().string();
      return p.parent_path() == checkpoints && (nn::checkpoint_step_from_name(name).has_value() ||
                                                nn::temporary_writer(name).has_value());
    };
    // A hard link to a checkpoint is one too (a third tester appended metrics to the
    // checkpoint it resumed from).
    std::vector<std::string> existing;
    std::error_code listing;
    for (const auto& entry : std::filesystem::directory_iterator(o_.checkpoint_dir, listing)) {
      if (is_checkpoint(canonical(entry.path().string())))
        existing.push_back(entry.path().string());
    }
    for (const Named& output : all) {
      if (!output.output || output.path->empty()) continue;
      const std::filesystem::path given(*output.path);
      const std::filesystem::path folder =
          canonical(given.parent_path().empty() ? std::string(".") : given.parent_path().string());
      const bool linked = std::any_of(existing.begin(), existing.end(), [&](const std::string& c) {
        return common::same_file(*output.path, c);
      });
      if (is_checkpoint(folder / given.filename()) || is_checkpoint(canonical(*output.path)) ||
          linked) {
        fail("{} '{}' takes the name of a checkpoint in --checkpoint-dir '{}': write it elsewhere",
             output.flag, *output.path, o_.checkpoint_dir);
      }
    }
  }
}

void Trainer::load_npy_dataset() {
  if (!classify()) {
    // Integer targets are class labels: regression would ask to convert them to float, which
    // trains the wrong model. Point at the task that reads them instead.
    std::optional<nn::NpyHeader> labels;
    try {
      labels = nn::read_npy_header(o_.targets_path, nn::NpyContents::kLabels);
    } catch (const Error&) {
    }
    if (labels) {
      fail(
          "--targets '{}' holds {} integers of dtype '{}': class labels. Train a classifier with "
          "--task classify --classes K (regression needs a 2-D float array)",
          o_.targets_path, labels->shape[0], labels->dtype);
    }
  }
  try {
    if (classify()) {
      dataset_ = std::make_unique<NpyClassification>(o_.data_path, o_.targets_path, o_.classes);
    } else {
      dataset_ = std::make_unique<nn::NpyDataset>(o_.data_path, o_.targets_path);
    }
    // Recorded in checkpoints (data_description): a --resume on other data of the same shape
    // is refused, not trained on silently.
    npy_checksums_ =
        fmt::format("checksums {} / {}", nn::checksum_hex(nn::file_checksum(o_.data_path)),
                    nn::checksum_hex(nn::file_checksum(o_.targets_path)));
  } catch (const Error& e) {
    // The reader names the file; say which flag gave it.
    const std::string what = e.what();
    const bool data = what.find(o_.data_path) != std::string::npos;
    const bool targets = what.find(o_.targets_path) != std::string::npos;
    fail("{}: {}",
         data && !targets   ? "--data"
         : !data && targets ? "--targets"
                            : "--data/--targets",
         what);
  }
}

// The ranks must load the same bytes, not merely the same path: two nodes' copies of a file can
// differ, and one path can name other files on other nodes. Each rank checksums what it read.
void Trainer::check_same_inputs() {
  std::vector<std::string> items;
  std::vector<std::string> paths;
  const auto add = [&](const std::string& flag, const std::string& path) {
    items.push_back(fmt::format("{}: {}", flag, file_fingerprint(path)));
    paths.push_back(fmt::format("{} '{}'", flag, path));
  };
  if (!o_.data_path.empty()) {
    items.push_back(fmt::format("--data/--targets shape: {} samples x {} -> {}", dataset_->size(),
                                dataset_->in_features(), dataset_->out_features()));
    paths.push_back("--data/--targets");
    add("--data", o_.data_path);
    add("--targets", o_.targets_path);
  }
  if (!o_.init_path.empty() && !init_superseded_) add("--init", o_.init_path);
  check_same_files("train/inputs", items, paths);
}

void Trainer::check_same_files(const std::string& key, const std::vector<std::string>& items,
                               const std::vector<std::string>& paths) {
  try {
    comm::check_same_on_all_ranks(*dist_->store, rank_, world_size_, key, "input file", items);
  } catch (const comm::StoreError&) {
    throw;  // a peer that never published its files (dead or late): not a difference
  } catch (const Error& e) {
    // Name this rank's file of the item that differs, as every rank may have another path.
    const std::string what = e.what();
    std::string here;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (what.find(fmt::format("#{} ", i)) != std::string::npos) here = paths[i];
    }
    const std::string message =
        fmt::format("{}{}", what, here.empty() ? "" : fmt::format(" This rank read {}.", here));
    if (const auto* peer = dynamic_cast<const comm::PeerFailedError*>(&e)) {
      throw comm::PeerFailedError(peer->rank(), message);
    }
    fail("{}", message);
  }
}

// An --init file written by nanoddp-train --save records the model it came from: another
// activation (the one setting the tensors' shapes do not show) computes another function.
void Trainer::check_init_model() const {
  const nn::SafetensorsMetadata metadata = nn::read_safetensors_metadata(o_.init_path);
  // The task (files from before it was recorded, and PyTorch's, have none: their shapes decide).
  if (const auto task = metadata.find("task");
      task != metadata.end() && task->second != task_description()) {
    fail("--init '{}' was saved by a --task {} run; this run has --task {}", o_.init_path,
         nn::excerpt(task->second), task_description());
  }
  // The activation is invisible in the shapes: its own key is compared whenever the file has
  // one, whatever "model" says (an outside tester's file recorded another activation there
  // beside a "model" this run matched, and was accepted).
  // (With --layers 0 the model is one Linear: no activation takes part.)
  if (const auto act = metadata.find("activation");
      act != metadata.end() && act->second != o_.activation && o_.layers > 0) {
    // The flag to pass, when the file names an activation there is one for (a crafted file's
    // text was offered as the flag's value, an outside tester's).
    const bool known = act->second == "relu" || act->second == "gelu";
    fail(
        "--init '{}' was saved from another model: its metadata key 'activation' is '{}', this "
        "run's model uses '{}' (--activation). {}",
        o_.init_path, nn::excerpt(act->second), o_.activation,
        known ? fmt::format("Pass --activation {}, or start from a file of this model", act->second)
              : std::string("No --activation runs that model (relu or gelu): start from a file "
                            "of this model"));
  }
  const auto model = metadata.find("model");
  // Without "model" (files written before it was recorded, PyTorch's state_dict) the shapes
  // are all that is left to check.
  if (model == metadata.end()) return;
  const std::string difference = model_difference(model->second, model_->describe());
  if (!difference.empty()) {
    fail("--init '{}' was saved from another model (metadata key 'model' is '{}'): {}",
         o_.init_path, nn::excerpt(model->second), difference);
  }
}

}  // namespace nanoddp::train
