#pragma once
// The driver's table on stdout: a header that says what the figures are, one row per point.

#include <nlohmann/json.hpp>

#include "options.h"

namespace nanoddp::bench_ddp {

void print_header(const Options& options, const nlohmann::ordered_json& machine,
                  const nlohmann::ordered_json& build);
// One row from a point's JSON record (the keys documented in driver.h).
void print_row(const nlohmann::ordered_json& record);

}  // namespace nanoddp::bench_ddp
