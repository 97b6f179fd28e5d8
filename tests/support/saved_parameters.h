#pragma once
// Comparing the parameters two training runs saved (nanoddp-train --save FILE.safetensors), and
// editing a saved file's metadata.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "nanoddp/nn/safetensors.h"

namespace nanoddp::testing {

// Every tensor of the file, in name order, concatenated.
inline std::vector<float> all_parameters(const std::string& path) {
  const auto file = nanoddp::nn::read_safetensors(path);
  std::vector<float> out;
  for (const auto& name : file.names()) {
    const auto v = file.to_f32(name);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Two saved files hold the same tensors, bit for bit (for changes that must not change the
// arithmetic: the optimizer in backward, prefetching), and finite: two runs that both went to
// NaN or inf hold the same bits whatever either computed on the way.
inline void check_same_bits(const std::string& a_path, const std::string& b_path) {
  const auto a = nanoddp::nn::read_safetensors(a_path);
  const auto b = nanoddp::nn::read_safetensors(b_path);
  REQUIRE(a.names() == b.names());
  for (const auto& name : a.names()) {
    CAPTURE(name);
    const auto x = a.to_f32(name), y = b.to_f32(name);
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    const auto bad = std::find_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
    CHECK_MESSAGE(bad == x.end(), a_path, " holds ", bad == x.end() ? 0.0f : *bad);
  }
}

// ||a - b|| / ||a|| over all parameters (float32 summation order differs between one rank
// summing W*B samples and W ranks summing B each and averaging: equal up to rounding).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(diff / norm);
}

// Writes the tensors of safetensors file `path` again as `out`, with one metadata entry set to
// `value`: a checkpoint whose metadata is wrong (an older format version, a bad step).
inline void rewrite_metadata(const std::string& path, const std::string& out,
                             const std::string& key, const std::string& value) {
  const nanoddp::nn::SafetensorsFile file = nanoddp::nn::read_safetensors(path);
  std::vector<std::vector<float>> values;
  values.reserve(file.names().size());  // entries point into these
  std::vector<nanoddp::nn::SafetensorsEntry> entries;
  for (const auto& name : file.names()) {
    values.push_back(file.to_f32(name));
    entries.push_back(
        {.name = name, .dtype = "F32", .shape = file.at(name).shape, .data = values.back().data()});
  }
  nanoddp::nn::SafetensorsMetadata md = file.metadata();
  md[key] = value;
  nanoddp::nn::write_safetensors(out, entries, md);
}

}  // namespace nanoddp::testing
