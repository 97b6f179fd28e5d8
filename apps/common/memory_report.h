#pragma once
// Every rank's memory (comm::gather_memory) as the JSON array that nanoddp-train's --metrics
// lines and nanoddp-bench-ddp's result both carry as "memory_per_rank": one object per rank, in
// rank order, with the four counts of comm::ZeroMemory.

#include <cstddef>
#include <vector>

#include "nanoddp/comm/zero.h"

namespace nanoddp::common {

// Json: nlohmann::json or nlohmann::ordered_json, whichever the record is built from.
template <class Json>
Json memory_per_rank_json(const std::vector<comm::ZeroMemory>& ranks) {
  Json out = Json::array();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    out.push_back({{"rank", r},
                   {"parameter_bytes", ranks[r].parameter_bytes},
                   {"gradient_bytes", ranks[r].gradient_bytes},
                   {"averaged_gradient_bytes", ranks[r].averaged_gradient_bytes},
                   {"optimizer_state_bytes", ranks[r].optimizer_state_bytes}});
  }
  return out;
}

}  // namespace nanoddp::common
