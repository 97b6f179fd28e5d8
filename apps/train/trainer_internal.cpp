#include "trainer_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "common/output_files.h"
#include "common/rescue.h"
#include "nanoddp/comm/rendezvous.h"
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
    parts.push_back(fmt::format("{} {} there, {} in this run ({})", key, nn::excerpt(before), value,
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
    parts.push_back(fmt::format("{} there, {} in this run", nn::excerpt(recorded), current));
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

}  // namespace nanoddp::train
