#include "nanoddp/comm/consistency.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "nanoddp/comm/process_group.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  if (text.empty()) return lines;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return lines;
}

// "ranks 0, 2" / "rank 1"
std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::vector<std::string> exchange_on_all_ranks(Store& store, int rank, int size,
                                               const std::string& key, const std::string& value) {
  store.set(fmt::format("{}/{}", key, rank), value);
  std::vector<std::string> all;
  all.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) all.push_back(store.get_string(fmt::format("{}/{}", key, r)));
  return all;
}

void check_same_on_all_ranks(Store& store, int rank, int size, const std::string& key,
                             const std::string& what, const std::vector<std::string>& items) {
  std::vector<std::vector<std::string>> all;
  for (const std::string& text :
       exchange_on_all_ranks(store, rank, size, key, fmt::format("{}", fmt::join(items, "\n")))) {
    all.push_back(split_lines(text));
  }
  std::size_t longest = 0;
  for (const auto& v : all) longest = std::max(longest, v.size());
  for (std::size_t i = 0; i < longest; ++i) {
    // Group the ranks by what they hold at position i.
    std::map<std::string, std::vector<int>> holders;
    for (int r = 0; r < size; ++r) {
      const auto& v = all[static_cast<std::size_t>(r)];
      holders[i < v.size() ? "'" + v[i] + "'" : "nothing"].push_back(r);
    }
    if (holders.size() == 1) continue;
    std::vector<std::string> parts;
    for (const auto& [value, ranks] : holders) {
      parts.push_back(
          fmt::format("{} {} {}", ranks_text(ranks), ranks.size() == 1 ? "has" : "have", value));
    }
    const std::string message = fmt::format(
        "the ranks disagree on {} #{} (of {} on rank 0): {}. Every rank must run the same model "
        "and settings; this is rank {}.",
        what, i, all[0].size(), fmt::join(parts, "; "), rank);
    // The ranks outside the one largest group (of three or more ranks) are the odd ones: on a
    // rank of that group this failure is theirs, so that a launcher names one of them as the
    // one that failed first. A tie (1 against 1, 2 against 2) names no one.
    const std::vector<int>* largest = nullptr;
    bool tie = false;
    for (const auto& entry : holders) {
      const std::vector<int>& ranks = entry.second;
      if (largest == nullptr || ranks.size() > largest->size()) {
        largest = &ranks;
        tie = false;
      } else if (ranks.size() == largest->size()) {
        tie = true;
      }
    }
    if (!tie && std::find(largest->begin(), largest->end(), rank) != largest->end()) {
      for (int r = 0; r < size; ++r) {
        if (std::find(largest->begin(), largest->end(), r) == largest->end()) {
          throw PeerFailedError(r, message);
        }
      }
    }
    fail("{}", message);
  }
}

}  // namespace nanoddp::comm
