#pragma once
// The driver's table on stdout: a header that says what the figures are, one row per point.

#include <nlohmann/json.hpp>
#include <string>

#include "options.h"

namespace nanoddp::bench_ddp {

void print_header(const Options& options, const nlohmann::ordered_json& machine,
                  const nlohmann::ordered_json& build, const nlohmann::ordered_json& provenance);
// One row from a point's JSON record (the keys documented in driver.h).
void print_row(const nlohmann::ordered_json& record);

// --csv: the same records, one row each, flat.
std::string csv_header();
std::string csv_row(const nlohmann::ordered_json& record);

}  // namespace nanoddp::bench_ddp
