#pragma once
// nanoddp's own environment switches (NANODDP_SHM, NANODDP_HUGEPAGES, ...), read one way: a value
// the library does not understand is an error naming the variable, never a silent default.
// (Before, NANODDP_SHM=false meant "on", and NANODDP_SHM_CHUNK_KB=abc meant 4 KiB.)

#include <cstdint>

namespace nanoddp {

// Unset or empty: `default_on`; "0": off; "1": on; anything else throws nanoddp::Error.
bool env_switch(const char* name, bool default_on);

// Unset or empty: `fallback`; a decimal whole number in [min, max]: that number; anything else
// throws nanoddp::Error naming the variable and the range.
std::uint64_t env_count(const char* name, std::uint64_t fallback, std::uint64_t min,
                        std::uint64_t max);

}  // namespace nanoddp
