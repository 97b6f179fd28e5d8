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
  const std::vector<std::string> texts =
      exchange_on_all_ranks(store, rank, size, key, fmt::format("{}", fmt::join(items, "\n")));
  // The ranks that hold the very same items as more than half the ranks are the job; the others
  // are the odd ones out. Decided on the whole list, not on the first item that differs: one
  // rank's other seed must not hide another rank's other learning rate.
  std::map<std::string, std::vector<int>> by_text;
  for (int r = 0; r < size; ++r) by_text[texts[static_cast<std::size_t>(r)]].push_back(r);
  if (by_text.size() == 1) return;
  const std::vector<int>* majority = nullptr;
  for (const auto& entry : by_text) {
    if (2 * entry.second.size() > static_cast<std::size_t>(size)) majority = &entry.second;
  }

  std::vector<std::vector<std::string>> all;
  for (const std::string& text : texts) all.push_back(split_lines(text));
  std::size_t longest = 0;
  for (const auto& v : all) longest = std::max(longest, v.size());
  std::vector<std::size_t> differing;
  std::string first;
  for (std::size_t i = 0; i < longest; ++i) {
    // Group the ranks by what they hold at position i.
    std::map<std::string, std::vector<int>> holders;
    for (int r = 0; r < size; ++r) {
      const auto& v = all[static_cast<std::size_t>(r)];
      holders[i < v.size() ? "'" + v[i] + "'" : "nothing"].push_back(r);
    }
    if (holders.size() == 1) continue;
    differing.push_back(i);
    if (differing.size() > 1) continue;
    std::vector<std::string> parts;
    for (const auto& [value, ranks] : holders) {
      parts.push_back(
          fmt::format("{} {} {}", ranks_text(ranks), ranks.size() == 1 ? "has" : "have", value));
    }
    first =
        fmt::format("{} #{} (of {} on rank 0): {}", what, i, all[0].size(), fmt::join(parts, "; "));
  }
  std::string more;
  if (differing.size() > 1) {
    std::vector<std::string> others;
    for (std::size_t k = 1; k < differing.size(); ++k) {
      others.push_back(fmt::format("#{}", differing[k]));
    }
    more = fmt::format(" ({} {} differ{} too)", what, fmt::join(others, ", "),
                       others.size() == 1 ? "s" : "");
  }
  std::string odd_ones;
  std::vector<int> outside;
  if (majority != nullptr) {
    for (int r = 0; r < size; ++r) {
      if (std::find(majority->begin(), majority->end(), r) == majority->end()) outside.push_back(r);
    }
    odd_ones = fmt::format(" {} {} other {}s than most ranks.", ranks_text(outside),
                           outside.size() == 1 ? "has" : "have", what);
  }
  const std::string message = fmt::format(
      "the ranks disagree on {}{}.{} Every rank must run the same model and settings; this is "
      "rank {}.",
      first, more, odd_ones, rank);
  // On a rank of the majority this failure is another's, so that a launcher names one of the odd
  // ranks as the one that failed first. Without a majority (1 against 1, 2 against 2, or three
  // ways) no one is named: every rank's failure is its own.
  if (majority != nullptr &&
      std::find(majority->begin(), majority->end(), rank) != majority->end()) {
    throw PeerFailedError(outside.front(), message);
  }
  fail("{}", message);
}

}  // namespace nanoddp::comm
