#pragma once
// Training runs that a flag must not change: the same configuration run plainly and with the
// flag has to save the same parameters, bit for bit.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "support/saved_parameters.h"
#include "support/subprocess.h"

namespace nanoddp::testing {

// For flags that change when or where work runs, never the arithmetic (the optimizer in
// backward, prefetching): each configuration is trained twice, plainly and with `flag`, and
// the two saved files are compared with check_same_bits. `train(args, config, with_flag)` runs
// one job on `args` (configs[config], --save FILE in `dir`, and the flag if with_flag) plus
// whatever every run shares, and REQUIREs that it succeeded; config and with_flag are there to
// name any other file a run writes (a trace).
template <typename Train>
void check_flag_keeps_bits(const std::string& flag,
                           const std::vector<std::vector<std::string>>& configs, const TempDir& dir,
                           Train train) {
  for (std::size_t c = 0; c < configs.size(); ++c) {
    CAPTURE(fmt::format("{}", fmt::join(configs[c], " ")));
    std::vector<std::string> saved;
    for (const bool with_flag : {false, true}) {
      saved.push_back(dir.file(fmt::format("c{}-{}.safetensors", c, with_flag)));
      std::vector<std::string> args = configs[c];
      args.insert(args.end(), {"--save", saved.back()});
      if (with_flag) args.push_back(flag);
      train(std::move(args), c, with_flag);
    }
    check_same_bits(saved[0], saved[1]);
  }
}

}  // namespace nanoddp::testing
