// nanoddp's environment switches: a value the library does not understand is an error that names
// the variable (NANODDP_SHM=false used to mean "on", NANODDP_SHM_CHUNK_KB=abc 4 KiB).

#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>

#include "nanoddp/engine/env.h"
#include "nanoddp/kernels/error.h"

namespace {

constexpr const char* kName = "NANODDP_TEST_ENV_SWITCH";

// Sets the variable for one scope (nullptr: unset).
struct ScopedEnv {
  explicit ScopedEnv(const char* value) {
    if (value != nullptr) {
      ::setenv(kName, value, 1);
    } else {
      ::unsetenv(kName);
    }
  }
  ~ScopedEnv() { ::unsetenv(kName); }
};

std::string error_of(auto&& call) {
  try {
    call();
  } catch (const nanoddp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("env: a switch takes 0 or 1, unset or empty is the default, anything else is an error") {
  {
    ScopedEnv env(nullptr);
    CHECK(nanoddp::env_switch(kName, true));
    CHECK_FALSE(nanoddp::env_switch(kName, false));
  }
  {
    ScopedEnv env("");
    CHECK(nanoddp::env_switch(kName, true));
  }
  {
    ScopedEnv env("0");
    CHECK_FALSE(nanoddp::env_switch(kName, true));
  }
  {
    ScopedEnv env("1");
    CHECK(nanoddp::env_switch(kName, false));
  }
  for (const char* bad : {"false", "off", "no", "2", " 0", "0 ", "true"}) {
    ScopedEnv env(bad);
    const std::string message = error_of([] { nanoddp::env_switch(kName, true); });
    INFO(bad, ": ", message);
    CHECK(message.find(kName) != std::string::npos);
    CHECK(message.find(std::string("'") + bad + "'") != std::string::npos);
    CHECK(message.find("0 (off) or 1 (on)") != std::string::npos);
  }
}

TEST_CASE("env: a count is a whole number within its range, else an error naming the range") {
  {
    ScopedEnv env(nullptr);
    CHECK(nanoddp::env_count(kName, 512, 4, 65536) == 512);
  }
  {
    ScopedEnv env("64");
    CHECK(nanoddp::env_count(kName, 512, 4, 65536) == 64);
  }
  {
    ScopedEnv env("4");
    CHECK(nanoddp::env_count(kName, 512, 4, 65536) == 4);
  }
  for (const char* bad :
       {"abc", "3", "65537", "-1", "1.5", "0x10", "64k", "99999999999999999999"}) {
    ScopedEnv env(bad);
    const std::string message = error_of([] { nanoddp::env_count(kName, 512, 4, 65536); });
    INFO(bad, ": ", message);
    CHECK(message.find(kName) != std::string::npos);
    CHECK(message.find("from 4 to 65536") != std::string::npos);
  }
}
