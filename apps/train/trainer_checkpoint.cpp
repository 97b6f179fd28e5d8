// Checkpoints: saving the training state every --checkpoint-every steps, --resume, and --save.
#include "trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <exception>
#include <filesystem>
#include <regex>

#include "common/rescue.h"
#include "final_output.h"
#include "nanoddp/comm/consistency.h"
#include "nanoddp/comm/process_group.h"
#include "nanoddp/config.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"
#include "trainer_internal.h"

namespace nanoddp::train {

void Trainer::resume() {
  // Every rank lists its own --checkpoint-dir, and the ranks compare what they found: one path
  // (a relative one, a node-local folder) can name another folder on each node. Rank 0 alone
  // used to decide, and when its folder was empty the whole job restarted from step 0, silently,
  // beside the other nodes' checkpoints.
  const std::vector<std::string> all = nn::list_checkpoints(o_.checkpoint_dir);
  const std::string path = all.empty() ? "" : all.back();
  if (distributed_) check_same_newest_checkpoint(path);
  if (path.empty()) {
    if (is_main()) {
      fmt::print("resume: no checkpoint in {}, starting from step 0\n", o_.checkpoint_dir);
    }
    return;
  }
  // The ranks agree on its name; the file may still differ (another run's copy on one node).
  if (distributed_) {
    check_same_files("train/resume-file", {fmt::format("--resume: {}", file_fingerprint(path))},
                     {fmt::format("the checkpoint '{}'", path)});
  }
  check_checkpoint_model(path);
  nn::TrainingState state;
  try {
    state = nn::load_checkpoint(path, *model_, *optimizer_);
  } catch (const Error& e) {
    // The loader names the file and what differs in the library's terms; the flags that set
    // the optimizer's kind and state are this program's.
    const std::string what = e.what();
    fail("--resume: {}{}", what,
         what.find("optimizer") != std::string::npos
             ? " (the optimizer's settings come from --optimizer and --momentum)"
             : "");
  }
  if (count_nonfinite(params_->values()) > 0) {
    fail("--resume: checkpoint '{}' holds NaN/Inf parameters; resume from an earlier one", path);
  }
  run_id_ = state.run_id;  // this run continues that one: its checkpoints are ours to prune
  const std::int64_t global_batch = world_size_ * o_.batch * o_.grad_accum;
  if (state.epoch_samples % global_batch != 0) {
    fail(
        "checkpoint '{}' stopped after {} samples of epoch {}, which is not a whole number of "
        "this run's global batches ({} ranks x --batch {} x --grad-accum {} = {}). Resume with "
        "the same global batch.",
        path, state.epoch_samples, state.epoch, world_size_, o_.batch, o_.grad_accum, global_batch);
  }
  if (state.seed != o_.seed) {
    fail("checkpoint '{}' was trained with --seed {}, this run has --seed {}", path, state.seed,
         o_.seed);
  }
  // Other data would pass the position check below (it only counts samples): compare what the
  // data was. (Checkpoints written before this key existed have none to compare.)
  const auto data = state.info.find("data");
  if (data != state.info.end() && data->second != data_description()) {
    // "checksums D / T": of --data, then --targets; say which file changed.
    const std::regex sums("checksums ([0-9a-f]+) / ([0-9a-f]+)");
    std::smatch then, now;
    const std::string current = data_description();
    std::string which;
    if (std::regex_search(data->second, then, sums) && std::regex_search(current, now, sums)) {
      which = then[1] != now[1] && then[2] != now[2] ? " (--data and --targets differ)"
              : then[1] != now[1]                    ? " (--data differs)"
              : then[2] != now[2]                    ? " (--targets differs)"
                                                     : "";
    }
    fail("checkpoint '{}' was trained on other data{}: {}; this run: {}. Resume with the same data",
         path, which, nn::excerpt(data->second), current);
  }
  start_step_ = state.epoch * steps_per_epoch_ + state.epoch_samples / global_batch;
  if (state.step != start_step_) {
    fail(
        "checkpoint '{}' is at step {} but its data position (epoch {}, {} samples) is step {} "
        "with this run's global batch and data set; resume with the same data and global batch",
        path, state.step, state.epoch, state.epoch_samples, start_step_);
  }
  // --skip-nonfinite's count goes on across the restart.
  if (const auto skipped = state.info.find("skipped_steps"); skipped != state.info.end()) {
    const std::string& text = skipped->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), skipped_steps_);
    if (ec != std::errc() || end != text.data() + text.size() || skipped_steps_ < 0) {
      fail("checkpoint '{}': info 'skipped_steps' = '{}' is not a count", path, nn::excerpt(text));
    }
  }
  if (start_step_ > steps_) {
    fail(
        "checkpoint '{}' is at step {}, past this run's last step {}: raise --steps (or "
        "--epochs), or resume from an earlier checkpoint",
        path, start_step_, steps_);
  }
  if (is_main()) {
    fmt::print("resume: loaded {} (step {}){}\n", path, start_step_,
               start_step_ == steps_ ? "; it is the last step: nothing left to train" : "");
  }
}

// The ranks' newest checkpoint (its file name, or none) must be rank 0's. Each rank publishes
// it with its host and folder, so that the message says where each view comes from.
void Trainer::check_same_newest_checkpoint(const std::string& newest) {
  std::error_code ec;
  const std::filesystem::path folder =
      std::filesystem::absolute(o_.checkpoint_dir, ec).lexically_normal();
  std::string name =
      newest.empty() ? std::string("none") : std::filesystem::path(newest).filename().string();
  if (newest.empty()) {
    // Why this rank sees none, when not for want of checkpoints: rank 0 checked its own folder
    // before the group (a file, unreadable: refused there), the others only list theirs.
    std::error_code status_ec;
    const auto status = std::filesystem::status(o_.checkpoint_dir, status_ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
      name = "none (not a folder)";
    } else if (std::filesystem::is_directory(status)) {
      std::error_code list_ec;
      std::filesystem::directory_iterator listing(o_.checkpoint_dir, list_ec);
      if (list_ec) name = fmt::format("none (unreadable: {})", list_ec.message());
    } else if (std::filesystem::is_symlink(
                   std::filesystem::symlink_status(o_.checkpoint_dir, status_ec))) {
      name = "none (a link to nothing)";
    }
  }
  // The folder last: it is the one part that may hold a newline.
  const std::vector<std::string> views = comm::exchange_on_all_ranks(
      *dist_->store, rank_, world_size_, "train/resume-newest",
      fmt::format("{}\n{}\n{}", name, nn::this_host(),
                  (ec ? std::filesystem::path(o_.checkpoint_dir) : folder).string()));
  struct View {
    std::string newest, host, folder;
  };
  const auto parse = [](const std::string& text) {
    const auto first = text.find('\n');
    const auto second = text.find('\n', first + 1);
    if (first == std::string::npos || second == std::string::npos) return View{text, "?", "?"};
    return View{text.substr(0, first), text.substr(first + 1, second - first - 1),
                text.substr(second + 1)};
  };
  const View main = parse(views[0]);
  // Ranks with the same view (one node's ranks, usually) are named together: rank 0's first,
  // then those whose newest checkpoint differs from it (other folders that agree are no news).
  std::vector<std::pair<View, std::vector<int>>> groups;
  for (int r = 0; r < world_size_; ++r) {
    const View view = parse(views[static_cast<std::size_t>(r)]);
    const auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
      return g.first.newest == view.newest && g.first.host == view.host &&
             g.first.folder == view.folder;
    });
    if (same != groups.end()) {
      same->second.push_back(r);
    } else if (r == 0 || view.newest != main.newest) {
      groups.push_back({view, {r}});
    }
  }
  if (groups.size() == 1) return;
  constexpr std::size_t kNamed = 8;  // groups named in full; a huge job's message stays short
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < groups.size() && i < kNamed; ++i) {
    const auto& [view, ranks] = groups[i];
    parts.push_back(fmt::format(
        "{} {} on host {} {} {} in '{}'", ranks.size() == 1 ? "rank" : "ranks",
        fmt::join(ranks, ", "), view.host, ranks.size() == 1 ? "sees" : "see",
        view.newest.starts_with("none") ? "no checkpoint" + view.newest.substr(4) : view.newest,
        view.folder));
  }
  if (groups.size() > kNamed) {
    parts.push_back(fmt::format("and {} more such group(s)", groups.size() - kNamed));
  }
  fail(
      "--resume: the ranks see different checkpoints in --checkpoint-dir '{}': {}. One path can "
      "name another folder on each node (a relative path, a node-local folder), and resuming "
      "from one rank's view would leave the others' behind. Give every node the same shared "
      "folder, as an absolute path (--checkpoint-dir /shared/path). This is rank {}.",
      o_.checkpoint_dir, fmt::join(parts, "; "), rank_);
}

// What the checkpoint's header records about its model, compared before its tensors are read:
// the task and --classes first (a 5-class checkpoint must say "--classes 5", not that a bias has
// the wrong shape), then the model (the activation does not show in the shapes). Checkpoints
// written before these keys existed have none to compare; the loader checks their shapes.
void Trainer::check_checkpoint_model(const std::string& path) const {
  nn::SafetensorsMetadata metadata;
  try {
    metadata = nn::read_safetensors_metadata(path);
  } catch (const Error&) {
    return;  // a damaged file: the loader's message says what is wrong with it
  }
  if (const auto task = metadata.find("info.task");
      task != metadata.end() && task->second != task_description()) {
    fail(
        "--resume: checkpoint '{}' was trained with --task {}; this run has --task {}. Resume "
        "with the same --task and --classes",
        path, nn::excerpt(task->second), task_description());
  }
  if (const auto model = metadata.find("info.model"); model != metadata.end()) {
    const std::string difference = model_difference(model->second, model_->describe());
    if (!difference.empty()) {
      fail("--resume: checkpoint '{}' was saved from another model: {}. Resume with the same model",
           path, difference);
    }
  }
}

std::string Trainer::task_description() const {
  return classify() ? fmt::format("classify --classes {}", o_.classes) : std::string("regression");
}

// --checkpoint-dir removed, renamed or replaced during the run: the checkpoints go to what the
// name reaches now (made again if missing), which is said once, and the lock moves with them,
// so that the folder this run writes is the one it holds (an outside adversary's `rm -rf ck;
// mkdir ck` went unnoticed, and a second run was then let in).
void Trainer::follow_checkpoint_dir() {
  if (!checkpoint_lock_.held()) return;
  struct stat held {
  }, named{};
  if (::fstat(checkpoint_lock_.fd(), &held) == 0 &&
      ::stat(o_.checkpoint_dir.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
      held.st_ino == named.st_ino) {
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(o_.checkpoint_dir, ec);
  // Still no folder there (a dangling link, a file): the checkpoint's write says why, once; a
  // warning that checkpoints go there, and one that it cannot be locked, would be wrong.
  if (::stat(o_.checkpoint_dir.c_str(), &named) != 0 || !S_ISDIR(named.st_mode)) return;
  fmt::print(stderr,
             "nanoddp-train: warning: --checkpoint-dir '{}' is not the folder this run locked at "
             "its start (removed, renamed or replaced during the run); checkpoints go to the "
             "folder the name reaches now\n",
             o_.checkpoint_dir);
  std::fflush(stderr);
  lock_checkpoint_dir();
}

void Trainer::save_checkpoint(std::int64_t step, std::int64_t epoch, std::int64_t step_in_epoch) {
  require_finite_parameters(step, "checkpoint");  // on every rank: they hold the same values
  // --zero: each rank holds a shard of the optimizer's state; every rank takes part in
  // gathering it whole, so that the file is the one --zero 0 writes (any world size and stage
  // resumes it).
  std::optional<std::vector<nn::NamedTensor>> full_state;
  if (ddp_ && ddp_->zero() != nullptr) full_state = ddp_->zero()->full_optimizer_state();
  // Rank 0 writes; the others wait for its outcome, through the store (host to host), before
  // the next step. A failed write (a full disk, a folder turned read-only) then ends every rank
  // at once, each saying why; it used to end rank 0 alone, and the others waited in the next
  // step's collectives until their timeout. They only give up the start of the next step's
  // forward and backward, which would wait for rank 0's first bucket anyway.
  const auto key = [](std::int64_t s) { return fmt::format("train/checkpoint/{}", s); };
  if (!is_main()) {
    const std::string outcome = dist_->store->get_string(key(step));
    if (outcome != "ok") {
      throw comm::PeerFailedError(
          0, fmt::format("rank 0 failed writing a checkpoint at step {}, so every rank stops: {}",
                         step, outcome));
    }
    return;
  }
  nn::TrainingState state{.step = step,
                          .epoch = epoch,
                          .epoch_samples = step_in_epoch * world_size_ * o_.batch * o_.grad_accum,
                          .seed = o_.seed,
                          .run_id = run_id_,
                          .info = {{"model", model_->describe()},
                                   {"task", task_description()},
                                   {"data", data_description()},
                                   {"world_size", std::to_string(world_size_)},
                                   {"batch", std::to_string(o_.batch)},
                                   {"grad_accum", std::to_string(o_.grad_accum)},
                                   {"skipped_steps", std::to_string(skipped_steps_)}}};
  // The position of the NEXT step: a checkpoint after the last step of an epoch points at the
  // start of the following one.
  if (step_in_epoch == steps_per_epoch_) {
    state.epoch += 1;
    state.epoch_samples = 0;
  }
  std::string outcome = "ok";
  std::exception_ptr failure;
  try {
    follow_checkpoint_dir();
    nn::save_checkpoint(o_.checkpoint_dir, *model_, *optimizer_, state, o_.keep,
                        full_state ? &*full_state : nullptr);
  } catch (const std::exception& e) {
    failure = std::current_exception();
    outcome = e.what();
    if (outcome == "ok" || outcome.empty()) outcome = "(no message)";
    // The run stops here; the steps since the last good checkpoint are not lost with it.
    std::string written, again;
    const std::string where = common::rescue(
        [&](const std::string& folder) {
          written = nn::save_checkpoint(folder, *model_, *optimizer_, state, 1,
                                        full_state ? &*full_state : nullptr);
        },
        &again);
    while (outcome.ends_with('.')) outcome.pop_back();
    outcome += where.empty() ? fmt::format(", nor could it be rescued ({})", again)
                             : fmt::format(
                                   ". This checkpoint was written to '{}' instead: move it into "
                                   "--checkpoint-dir, then --resume",
                                   written);
  }
  if (distributed_) {
    try {
      dist_->store->set(key(step), outcome);
      // Every rank read the previous checkpoint's outcome before joining this step's
      // collectives: its key is no longer needed.
      if (step > o_.checkpoint_every) dist_->store->remove(key(step - o_.checkpoint_every));
    } catch (const std::exception&) {
      // The store is gone: the others find out through it too; this rank's own error comes next.
    }
  }
  if (failure) fail("{}", outcome);
}

// The loss and the gradients can be finite while the update itself overflows (a huge --lr):
// parameters are checked before they are written, so no checkpoint or --save holds NaN or Inf.
// Every rank checks (DDP keeps them equal), so all stop together.
void Trainer::require_finite_parameters(std::int64_t step, const char* what) {
  wait_for_parameters();
  const std::int64_t bad = count_nonfinite(params_->values());
  if (bad > 0) {
    fail(
        "after step {} the parameters hold {} NaN/Inf value(s) although the loss and gradients "
        "were finite: the update overflowed (lower --lr?). Not written ({}); the last good "
        "checkpoint, if any, is kept",
        step, bad, what);
  }
}

std::string Trainer::save_parameters() {
  wait_for_parameters();
  if (o_.save_path.empty() || !is_main()) return {};
  std::vector<nn::NamedTensor> named = model_->named_parameters();
  std::vector<std::vector<float>> host;
  std::vector<nn::SafetensorsEntry> entries;
  host.reserve(named.size());
  for (const nn::NamedTensor& p : named) {
    host.push_back(p.tensor.to_vector());
    entries.push_back(
        {.name = p.name, .dtype = "F32", .shape = p.tensor.shape(), .data = host.back().data()});
  }
  const nn::SafetensorsMetadata metadata = {{"format", "nanoddp-parameters"},
                                            {"nanoddp_version", NANODDP_VERSION},
                                            {"step", std::to_string(steps_)},
                                            {"seed", std::to_string(o_.seed)},
                                            {"world_size", std::to_string(world_size_)},
                                            {"activation", o_.activation},
                                            {"task", task_description()},
                                            {"model", model_->describe()}};
  return write_final_output(
      "--save", o_.save_path,
      [&](const std::string& path) { return nn::write_safetensors(path, entries, metadata); },
      save_checked_, save_target_);
}

}  // namespace nanoddp::train
