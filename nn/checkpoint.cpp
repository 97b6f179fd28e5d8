#include "nanoddp/nn/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"

namespace nanoddp::nn {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOptimizerPrefix = "optimizer.";

// Every tensor the checkpoint holds, with a host copy of its values.
struct HostTensor {
  std::string name;
  Tensor target;  // where it is loaded back into
  std::vector<float> values;
};

std::vector<HostTensor> gather(const Module& model, const Optimizer& optimizer,
                               const std::vector<NamedTensor>* optimizer_state = nullptr) {
  std::vector<HostTensor> out;
  for (const NamedTensor& p : model.named_parameters()) {
    out.push_back({p.name, p.tensor, {}});
  }
  for (const NamedTensor& s : optimizer_state ? *optimizer_state : optimizer.state()) {
    out.push_back({kOptimizerPrefix + s.name, s.tensor, {}});
  }
  std::sort(out.begin(), out.end(),
            [](const HostTensor& a, const HostTensor& b) { return a.name < b.name; });
  return out;
}

// FNV-1a 64 over every tensor's bytes, in name order.
std::uint64_t tensors_checksum(
    const std::vector<std::pair<std::string, std::span<const std::byte>>>& tensors) {
  std::uint64_t state = kChecksumInit;
  for (const auto& [name, bytes] : tensors) state = checksum(bytes.data(), bytes.size(), state);
  return state;
}

std::optional<std::int64_t> step_of(const fs::path& file) {
  const std::string name = file.filename().string();
  constexpr std::string_view kPrefix = "step-", kSuffix = ".safetensors";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size() - kSuffix.size();
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last) return std::nullopt;
  return step;
}

std::int64_t metadata_int(const SafetensorsFile& file, const std::string& key) {
  const std::string& text = file.metadata_at(key);
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    fail("checkpoint '{}': metadata '{}' = '{}' is not an integer", file.path().string(), key,
         excerpt(text));
  }
  return value;
}

// A step, an epoch or a count: an integer that cannot be negative.
std::int64_t metadata_count(const SafetensorsFile& file, const std::string& key) {
  const std::int64_t value = metadata_int(file, key);
  if (value < 0) {
    fail("checkpoint '{}': metadata '{}' = {} is negative", file.path().string(), key, value);
  }
  return value;
}

std::string optimizer_kind(const Optimizer& optimizer) {
  const std::string d = optimizer.describe();
  return d.substr(0, d.find('('));
}

// "3,3,1": each count a number in [0, optimizer_steps].
std::vector<std::int64_t> parse_param_steps(const std::string& path, const std::string& text,
                                            std::int64_t optimizer_steps) {
  std::vector<std::int64_t> steps;
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  while (p < end) {
    std::int64_t v = -1;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || v < 0 || v > optimizer_steps || (next != end && *next != ',')) {
      fail(
          "checkpoint '{}': metadata 'optimizer_param_steps' is not a list of step counts "
          "between 0 and {} (at character {})",
          path, optimizer_steps, p - text.data());
    }
    steps.push_back(v);
    p = next == end ? end : next + 1;
  }
  return steps;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const Module& model, const Optimizer& optimizer,
                            const TrainingState& state, int keep,
                            const std::vector<NamedTensor>* optimizer_state) {
  if (optimizer.sharded() && optimizer_state == nullptr) {
    fail(
        "save_checkpoint: the optimizer is sharded (ZeRO) and holds only its shard of the state; "
        "pass the whole state (comm::Zero::full_optimizer_state())");
  }
  // What load_checkpoint refuses is not written: a file listed as the newest checkpoint that
  // no resume can read (an outside tester's step -5).
  if (state.step < 0 || state.epoch < 0 || state.epoch_samples < 0) {
    fail(
        "save_checkpoint: the training state has a negative count (step {}, epoch {}, "
        "epoch_samples {}); each counts what is done, from 0",
        state.step, state.epoch, state.epoch_samples);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    // A symbolic link to nothing (a folder replaced by one during the run) fails with "File
    // exists", which names neither the link nor where it leads.
    std::error_code link_ec;
    if (fs::is_symlink(fs::symlink_status(dir, link_ec)) && !fs::exists(dir, link_ec)) {
      fail(
          "cannot create the checkpoint directory '{}': it is a symbolic link to '{}', which "
          "leads to no folder (a missing target, or a loop of links)",
          dir, fs::read_symlink(dir, link_ec).string());
    }
    fail("cannot create the checkpoint directory '{}': {}", dir, ec.message());
  }
  // A killed writer's temporary (".step-N.safetensors.tmp.HOST.PID.K"): never listed as a
  // checkpoint, but tens of megabytes.
  remove_stale_temporaries(dir, ".step-");

  std::vector<HostTensor> tensors = gather(model, optimizer, optimizer_state);
  std::vector<SafetensorsEntry> entries;
  std::vector<std::pair<std::string, std::span<const std::byte>>> bytes;
  for (HostTensor& t : tensors) {
    t.values = t.target.to_vector();
    entries.push_back(
        {.name = t.name, .dtype = "F32", .shape = t.target.shape(), .data = t.values.data()});
    bytes.emplace_back(t.name, std::as_bytes(std::span<const float>(t.values)));
  }
  SafetensorsMetadata metadata = {
      {"format", "nanoddp-checkpoint"},
      {"format_version", std::to_string(kCheckpointFormatVersion)},
      {"step", std::to_string(state.step)},
      {"epoch", std::to_string(state.epoch)},
      {"epoch_samples", std::to_string(state.epoch_samples)},
      {"seed", std::to_string(state.seed)},
      {"optimizer", optimizer.describe()},
      {"optimizer_kind", optimizer_kind(optimizer)},
      {"optimizer_steps", std::to_string(optimizer.steps())},
      // Per parameter, in the flat layout's order: a parameter skipped in a step (no gradient)
      // has taken fewer steps than the optimizer, and AdamW's bias correction depends on it.
      {"optimizer_param_steps", fmt::format("{}", fmt::join(optimizer.param_steps(), ","))},
      {"checksum", checksum_hex(tensors_checksum(bytes))},
      {"run_id", state.run_id},
  };
  for (const auto& [k, v] : state.info) metadata.emplace("info." + k, v);

  const std::string path =
      (fs::path(dir) / fmt::format("step-{:09}.safetensors", state.step)).string();
  // (Checked here, not atomically with the rename: this guards against another run's file that
  // is already there, not against two writers racing for the same name.)
  if (fs::is_directory(path, ec)) {
    fail("cannot write checkpoint '{}': a folder of that name is in the way; remove or rename it",
         path);
  }
  if (fs::exists(path, ec)) {
    fail(
        "cannot write checkpoint '{}': the file already exists (another run's checkpoint of the "
        "same step?) and is not overwritten. Use an empty directory, or resume from it.",
        path);
  }
  write_safetensors(path, entries, metadata);
  debug_log(DebugLevel::kInfo, "checkpoint: wrote {} (step {}, {} tensors)", path, state.step,
            entries.size());

  // Keep the newest `keep` up to this one: only this run's earlier steps are pruned.
  // Checkpoints of later steps, or of another run (another run_id, in a reused folder or
  // written concurrently), are not this run's to delete, and must never push out the one just
  // written. Reading a candidate's run_id costs its header only.
  if (keep > 0) {
    std::vector<std::string> earlier;
    for (const std::string& p : list_checkpoints(dir)) {
      if (step_of(p).value_or(state.step) >= state.step) continue;
      try {
        const SafetensorsMetadata other = read_safetensors_metadata(p);
        const auto id = other.find("run_id");
        if ((id == other.end() ? std::string() : id->second) == state.run_id) earlier.push_back(p);
      } catch (const Error&) {
        // Unreadable: not provably this run's, so left alone.
      }
    }
    const std::size_t keep_earlier = static_cast<std::size_t>(keep - 1);
    for (std::size_t i = 0; i + keep_earlier < earlier.size(); ++i) {
      // Not fatal (the new checkpoint is written), but not silent: the folder keeps growing.
      if (!fs::remove(earlier[i], ec) && ec) {
        fmt::print(stderr,
                   "nanoddp: warning: could not remove the old checkpoint '{}' (keeping {}): {}\n",
                   earlier[i], keep, ec.message());
        std::fflush(stderr);
      }
    }
  }
  return path;
}

std::optional<std::int64_t> checkpoint_step_from_name(const std::string& filename) {
  return step_of(fs::path(filename));
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    // A folder (or a FIFO) with a checkpoint's name is not one: it is said when it is in the way.
    std::error_code kind;
    if (!entry.is_regular_file(kind)) continue;
    if (auto step = step_of(entry.path())) found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

void load_parameters(const std::string& path, Module& model) {
  debug_log(DebugLevel::kInfo, "parameters: loading {}", path);
  const std::vector<NamedTensor> params = model.named_parameters();
  // A training checkpoint also holds the optimizer's state: for evaluation its parameters are
  // what is wanted, and the optimizer's tensors are skipped.
  const SafetensorsMetadata metadata = read_safetensors_metadata(path);
  const bool checkpoint = metadata.contains("optimizer_kind");
  const auto ours = [&](const std::string& name) {
    return !(checkpoint && name.starts_with(kOptimizerPrefix));
  };
  // First from the header alone: a file holding other (perhaps huge) tensors is refused before
  // its body is read.
  std::vector<std::string> model_names, extra, absent;
  for (const NamedTensor& p : params) model_names.push_back(p.name);
  std::vector<std::string> file_names;
  for (const auto& [name, shape] : read_safetensors_shapes(path)) {
    file_names.push_back(name);
    if (ours(name) &&
        std::find(model_names.begin(), model_names.end(), name) == model_names.end()) {
      extra.push_back(name);
    }
  }
  for (const std::string& name : model_names) {
    if (std::find(file_names.begin(), file_names.end(), name) == file_names.end()) {
      absent.push_back(name);
    }
  }
  if (!extra.empty()) {
    fail(
        "'{}' does not hold this model's parameters: {}not in the model {} (the model has: {}; "
        "names follow PyTorch's state_dict of the same nn.Sequential)",
        path, absent.empty() ? "" : fmt::format("missing {}; ", fmt::join(absent, ", ")),
        fmt::join(extra, ", "), fmt::join(model_names, ", "));
  }
  const SafetensorsFile file = read_safetensors(path);
  std::vector<std::string> missing, unexpected;
  for (const NamedTensor& p : params) {
    const SafetensorsTensor* stored = file.find(p.name);
    if (stored == nullptr) {
      missing.push_back(p.name);
    } else if (stored->shape != p.tensor.shape()) {
      fail("'{}': '{}' has shape {} but the model's parameter is {}: the file holds another model",
           path, p.name, shape_str(stored->shape), shape_str(p.tensor.shape()));
    } else if (stored->dtype != "F32" && stored->dtype != "BF16" && stored->dtype != "F16" &&
               stored->dtype != "F64") {
      fail("'{}': '{}' is {}; parameters load from F32, BF16, F16 or F64", path, p.name,
           stored->dtype);
    }
  }
  for (const std::string& name : file.names()) {
    const bool known = std::any_of(params.begin(), params.end(),
                                   [&](const NamedTensor& p) { return p.name == name; });
    if (!known && ours(name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::vector<std::string> expected;
    for (const NamedTensor& p : params) expected.push_back(p.name);
    fail(
        "'{}' does not hold this model's parameters: {}{}{} (the model has: {}; names follow "
        "PyTorch's state_dict of the same nn.Sequential)",
        path, missing.empty() ? "" : fmt::format("missing {}", fmt::join(missing, ", ")),
        !missing.empty() && !unexpected.empty() ? "; " : "",
        unexpected.empty() ? "" : fmt::format("not in the model {}", fmt::join(unexpected, ", ")),
        fmt::join(expected, ", "));
  }
  std::vector<std::vector<float>> values;
  for (const NamedTensor& p : params) {
    values.push_back(file.to_f32(p.name));
    const std::vector<float>& v = values.back();
    const auto first = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
    if (first != v.end()) {
      const auto bad = std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
      fail(
          "'{}': '{}' holds {} non-finite value(s) (the first, {}, at flat index {}): a model "
          "that starts from NaN or Inf trains to NaN. Use parameters saved before they "
          "diverged.",
          path, p.name, bad, std::isnan(*first) ? "nan" : fmt::format("{}", *first),
          first - v.begin());
    }
  }
  const NoGrad no_grad;  // writing parameters in place is no step of the model's function
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor target = params[i].tensor;
    target.copy_from(Tensor::from_vector(values[i], target.shape()));
  }
}

TrainingState load_checkpoint(const std::string& path, Module& model, Optimizer& optimizer) {
  debug_log(DebugLevel::kInfo, "checkpoint: loading {}", path);
  if (optimizer.sharded()) {
    fail(
        "checkpoint '{}': the optimizer is sharded (ZeRO); load the checkpoint into the whole "
        "optimizer before DDP shards it",
        path);
  }
  const SafetensorsFile file = read_safetensors(path);
  const auto& md = file.metadata();
  if (md.find("format") == md.end() || md.at("format") != "nanoddp-checkpoint") {
    fail("'{}' is not a nanoddp checkpoint (no format=nanoddp-checkpoint in its metadata)", path);
  }
  const std::int64_t version = metadata_int(file, "format_version");
  if (version != kCheckpointFormatVersion) {
    fail(
        "checkpoint '{}' has format version {}, but this nanoddp reads version {}; resume it "
        "with the nanoddp that wrote it",
        path, version, kCheckpointFormatVersion);
  }
  if (file.metadata_at("optimizer_kind") != optimizer_kind(optimizer)) {
    fail(
        "checkpoint '{}' holds {} state, but this run uses {}; resume with the optimizer the "
        "checkpoint was written with",
        path, excerpt(file.metadata_at("optimizer_kind")), optimizer_kind(optimizer));
  }

  // Check everything before touching the model: names, shapes, dtype, checksum.
  std::vector<HostTensor> tensors = gather(model, optimizer);
  std::vector<std::pair<std::string, std::span<const std::byte>>> bytes;
  for (const std::string& name : file.names()) bytes.emplace_back(name, file.at(name).bytes);
  std::sort(bytes.begin(), bytes.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::string actual = checksum_hex(tensors_checksum(bytes));
  if (actual != file.metadata_at("checksum")) {
    fail(
        "checkpoint '{}' is corrupted: its tensors' checksum is {} but the file records {}. Use "
        "an earlier checkpoint.",
        path, actual, excerpt(file.metadata_at("checksum")));
  }
  for (const HostTensor& t : tensors) {
    const SafetensorsTensor* stored = file.find(t.name);
    if (stored == nullptr) {
      fail(
          "checkpoint '{}' has no tensor '{}': it was saved from a different model or "
          "optimizer",
          path, t.name);
    }
    if (stored->shape != t.target.shape()) {
      fail(
          "checkpoint '{}': '{}' has shape {} but the model expects {}: it was saved from a "
          "different model",
          path, t.name, shape_str(stored->shape), shape_str(t.target.shape()));
    }
    if (stored->dtype != "F32") {
      fail("checkpoint '{}': '{}' is {}, expected F32", path, t.name, stored->dtype);
    }
  }
  if (file.names().size() != tensors.size()) {
    std::vector<std::string> unexpected;
    for (const std::string& name : file.names()) {
      const bool known = std::any_of(tensors.begin(), tensors.end(),
                                     [&](const HostTensor& t) { return t.name == name; });
      if (!known) unexpected.push_back("'" + name + "'");
    }
    fail(
        "checkpoint '{}' holds {} tensors, but the model and optimizer have {}; not expected: {}. "
        "It was saved from a different model, or with different optimizer settings (momentum "
        "buffers exist only with momentum > 0)",
        path, file.names().size(), tensors.size(), fmt::join(unexpected, ", "));
  }

  // The metadata too, before anything is copied: a bad value must leave the model untouched.
  TrainingState state;
  const std::int64_t optimizer_steps = metadata_count(file, "optimizer_steps");
  state.step = metadata_count(file, "step");
  state.epoch = metadata_count(file, "epoch");
  state.epoch_samples = metadata_count(file, "epoch_samples");
  if (const std::optional<std::int64_t> named = step_of(path); named && *named != state.step) {
    fail(
        "checkpoint '{}' is named for step {} but its metadata records step {}: it was renamed "
        "or copied over another; use a checkpoint whose name and contents agree",
        path, *named, state.step);
  }
  if (const auto id = md.find("run_id"); id != md.end()) state.run_id = id->second;
  const std::string& seed = file.metadata_at("seed");
  const auto [seed_end, seed_ec] =
      std::from_chars(seed.data(), seed.data() + seed.size(), state.seed);
  if (seed_ec != std::errc() || seed_end != seed.data() + seed.size()) {
    fail("checkpoint '{}': metadata 'seed' = '{}' is not a number", path, excerpt(seed));
  }

  // Checkpoints written before per-parameter step counts had every parameter at every step.
  std::vector<std::int64_t> param_steps;
  if (const auto it = md.find("optimizer_param_steps"); it != md.end()) {
    param_steps = parse_param_steps(path, it->second, optimizer_steps);
    if (param_steps.size() != optimizer.param_steps().size()) {
      fail("checkpoint '{}' has step counts for {} parameters, but the model has {}", path,
           param_steps.size(), optimizer.param_steps().size());
    }
  }

  const NoGrad no_grad;  // parameters and optimizer state are written in place
  for (HostTensor& t : tensors) {
    t.values = file.to_f32(t.name);
    t.target.copy_from(Tensor::from_vector(t.values, t.target.shape()));
  }
  optimizer.set_steps(optimizer_steps, param_steps);
  for (const auto& [k, v] : md) {
    if (k.starts_with("info.")) state.info[k.substr(5)] = v;
  }
  return state;
}

}  // namespace nanoddp::nn
