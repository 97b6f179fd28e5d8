#include "trainer_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "common/output_files.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/safetensors.h"

namespace nanoddp::train {

namespace {

// The settings of nn::Mlp::describe(), "MLP(in=4, out=2, hidden=8, ...)", as key -> value.
std::map<std::string, std::string> model_settings(const std::string& description) {
  std::map<std::string, std::string> settings;
  const auto open = description.find('('), close = description.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return settings;
  std::string_view rest = std::string_view(description).substr(open + 1, close - open - 1);
  while (!rest.empty()) {
    const auto comma = rest.find(", ");
    const std::string_view item = rest.substr(0, comma);
    if (const auto eq = item.find('='); eq != std::string_view::npos) {
      settings.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
  }
  return settings;
}

}  // namespace

std::int64_t count_nonfinite(const Tensor& t) {
  Tensor count = Tensor::empty({}, t.device());
  backend_for(t.device()).count_nonfinite(t.data(), t.numel(), count.data());
  return static_cast<std::int64_t>(count.item());
}

std::string model_difference(const std::string& recorded, const std::string& current) {
  if (recorded == current) return {};
  static const std::map<std::string, std::string> kFlags = {{"in", "--in, or --data's columns"},
                                                            {"out", "--out, or --targets' columns"},
                                                            {"hidden", "--hidden"},
                                                            {"layers", "--layers"},
                                                            {"activation", "--activation"}};
  const auto then = model_settings(recorded), now = model_settings(current);
  std::vector<std::string> parts;
  for (const auto& [key, value] : now) {
    const auto it = then.find(key);
    if (it == then.end() || it->second == value) continue;  // not recorded, or the same
    const std::string& before = it->second;
    const auto flag = kFlags.find(key);
    parts.push_back(fmt::format("{} {} there, {} in this run ({})", key, before, value,
                                flag == kFlags.end() ? key : flag->second));
  }
  if (parts.empty()) {
    // Every setting this run's description names is recorded, with the same value: the same
    // model (a file of an earlier version describes a --layers 0 model with a hidden width and
    // an activation that take no part, which this version no longer names).
    const bool all_recorded =
        !now.empty() && std::all_of(now.begin(), now.end(),
                                    [&](const auto& kv) { return then.contains(kv.first); });
    if (all_recorded) return {};
    parts.push_back(fmt::format("{} there, {} in this run", recorded, current));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string file_fingerprint(const std::string& path) {
  try {
    return fmt::format("{} bytes, checksum {}", std::filesystem::file_size(path),
                       nn::checksum_hex(nn::file_checksum(path)));
  } catch (const std::exception& e) {
    return fmt::format("unreadable ({})", e.what());
  }
}

std::string rescue_path(const std::string& name) {
  // Not beside the output (its disk may be the full one) but where temporary files go.
  std::error_code ec;
  const char* tmpdir = std::getenv("TMPDIR");
  const std::filesystem::path folder =
      tmpdir != nullptr && *tmpdir != '\0' && std::filesystem::is_directory(tmpdir, ec) ? tmpdir
                                                                                        : "/tmp";
  return (folder / fmt::format("nanoddp-rescue-{}-{}", ::getpid(), name)).string();
}

std::string write_final_output(const char* flag, const std::string& path,
                               const std::function<void(const std::string&)>& write,
                               const common::FileState* checked) {
  namespace fs = std::filesystem;
  const fs::path target = common::resolved_path(path);  // a symlink's target; the link stays
  const fs::path folder = target.parent_path();
  std::error_code ec;
  // Checked writable before step 1, so a missing folder was removed since. Made again as a
  // user's `mkdir -p` would; a component that is now a file makes this fail, and the rescue
  // below takes over.
  if (!folder.empty() && !fs::exists(folder, ec) && fs::create_directories(folder, ec)) {
    fmt::print(stderr,
               "nanoddp-train: warning: the folder '{}' of {} '{}' was removed during the run; "
               "made it again\n",
               folder.string(), flag, path);
    std::fflush(stderr);
  }
  std::string problem;
  if (checked != nullptr && common::file_state(target.string()) != *checked) {
    problem = fmt::format(
        "'{}' was written by another process during this run (another job given the same {}?) "
        "and is left as it is",
        target.string(), flag);
  } else {
    try {
      write(target.string());
      return {};
    } catch (const std::exception& e) {
      problem = e.what();
      while (problem.ends_with('.')) problem.pop_back();  // it is quoted in a sentence below
    }
  }
  const std::string rescue = rescue_path(target.filename().string());
  try {
    write(rescue);
  } catch (const std::exception& e) {
    return fmt::format("{} '{}' could not be written ({}), nor its rescue copy '{}' ({})", flag,
                       path, problem, rescue, e.what());
  }
  return fmt::format(
      "{} '{}' could not be written ({}). It was written to '{}' instead: move it where it "
      "belongs",
      flag, path, problem, rescue);
}

}  // namespace nanoddp::train
