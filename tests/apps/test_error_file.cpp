// The error file a failed worker leaves for its launcher (apps/common/error_file.h): what
// nanoddp-train writes under each launcher, and what nanoddp-run reads, in nanoddp's format and
// in torchelastic's (PyTorch's `record` decorator).

#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "common/error_file.h"
#include "support/files.h"
#include "support/subprocess.h"

using nanoddp::common::read_failure_record;
using nanoddp::common::record_failure;
using nanoddp::testing::read_file;
using nanoddp::testing::TempDir;

namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("error file: nanoddp-run's NANODDP_ERROR_FILE gets every failure, with its cause") {
  TempDir dir;
  const std::string path = dir.file("rank-1.json");
  ScopedEnv ours("NANODDP_ERROR_FILE", path);
  ScopedEnv torchrun("TORCHELASTIC_ERROR_FILE", path);
  const std::int64_t before = now_ns();

  SUBCASE("its own failure") {
    record_failure("cannot create the checkpoint directory 'ck': \"quoted\"\n", false);
    const auto r = read_failure_record(path);
    REQUIRE(r.has_value());
    CHECK(r->message == "cannot create the checkpoint directory 'ck': \"quoted\"\n");
    CHECK_FALSE(r->caused_by_peer);
    CHECK_FALSE(r->peer_rank.has_value());
    CHECK(r->time_ns >= before);
    CHECK(r->time_ns <= now_ns());
    // torchelastic's layout, which torchrun's summary reads: message.message and a timestamp.
    const std::string text = read_file(path);
    CHECK(text.find(R"("message":{"message":"cannot create)") != std::string::npos);
    CHECK(text.find(R"("extraInfo":{"timestamp":")") != std::string::npos);
  }
  SUBCASE("another rank's failure, named") {
    record_failure("rank 0 failed writing a checkpoint", true, 0);
    const auto r = read_failure_record(path);
    REQUIRE(r.has_value());
    CHECK(r->caused_by_peer);
    CHECK(r->peer_rank == 0);
  }
  SUBCASE("a peer that died: no rank known") {
    record_failure("allreduce #7: connection closed by rank 3", true);
    const auto r = read_failure_record(path);
    REQUIRE(r.has_value());
    CHECK(r->caused_by_peer);
    CHECK_FALSE(r->peer_rank.has_value());
  }
  // Renamed into place whole: no staged file is left beside it.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 1);
}

TEST_CASE("error file: under torchrun alone a failure caused by a peer writes nothing") {
  // torchrun compares whole seconds and takes the lower rank on a tie: a file from the rank that
  // was only told of the failure could rank it before the one that failed.
  TempDir dir;
  const std::string path = dir.file("error.json");
  ScopedEnv ours("NANODDP_ERROR_FILE", std::nullopt);
  ScopedEnv torchrun("TORCHELASTIC_ERROR_FILE", path);
  record_failure("rank 0 failed writing a checkpoint", true, 0);
  CHECK_FALSE(std::filesystem::exists(path));
  record_failure("cannot create the checkpoint directory", false);
  const auto r = read_failure_record(path);
  REQUIRE(r.has_value());
  CHECK(r->message == "cannot create the checkpoint directory");
}

// An outside tester's: torchrun started from a shell that had NANODDP_ERROR_FILE (from an
// earlier nanoddp-run job, say) had every rank write there, and torchrun's summary lost the
// message.
TEST_CASE("error file: under torchrun an inherited NANODDP_ERROR_FILE is not used") {
  TempDir dir;
  const std::string inherited = dir.file("inherited.json");
  const std::string own = dir.file("attempt_0-1-error.json");
  ScopedEnv ours("NANODDP_ERROR_FILE", inherited);
  ScopedEnv torchrun("TORCHELASTIC_ERROR_FILE", own);
  record_failure("rank 0 failed writing a checkpoint", true, 0);
  CHECK_FALSE(std::filesystem::exists(own));
  record_failure("cannot create the checkpoint directory", false);
  const auto r = read_failure_record(own);
  REQUIRE(r.has_value());
  CHECK(r->message == "cannot create the checkpoint directory");
  CHECK_FALSE(std::filesystem::exists(inherited));
}

TEST_CASE("error file: no launcher asked for one, or it cannot be written: nothing thrown") {
  TempDir dir;
  {
    ScopedEnv ours("NANODDP_ERROR_FILE", std::nullopt);
    ScopedEnv torchrun("TORCHELASTIC_ERROR_FILE", std::nullopt);
    CHECK_NOTHROW(record_failure("x", false));
  }
  {
    // Set by hand without torchrun's: nothing to write to.
    ScopedEnv ours("NANODDP_ERROR_FILE", dir.file("alone.json"));
    ScopedEnv torchrun("TORCHELASTIC_ERROR_FILE", std::nullopt);
    record_failure("x", false);
    CHECK_FALSE(std::filesystem::exists(dir.file("alone.json")));
  }
  ScopedEnv ours("NANODDP_ERROR_FILE", "/nonexistent-folder/rank-0.json");
  ScopedEnv torchrun("TORCHELASTIC_ERROR_FILE", "/nonexistent-folder/rank-0.json");
  CHECK_NOTHROW(record_failure("x", false));
}

TEST_CASE("error file: nanoddp-run reads torchelastic's layouts and refuses what is not one") {
  TempDir dir;
  const std::string path = dir.file("e.json");
  SUBCASE("PyTorch's record(): message.message, extraInfo.timestamp as a string") {
    write(path, R"({"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": )"
                R"("Traceback ...", "timestamp": "1700000000"}}})");
    const auto r = read_failure_record(path);
    REQUIRE(r.has_value());
    CHECK(r->message == "ValueError: bad batch");
    CHECK(r->time_ns == 1'700'000'000LL * 1'000'000'000LL);
    CHECK_FALSE(r->caused_by_peer);
  }
  SUBCASE("the plain layout: a message string and a timestamp") {
    write(path, R"({"message": "Signal 6 received", "timestamp": 12})");
    const auto r = read_failure_record(path);
    REQUIRE(r.has_value());
    CHECK(r->message == "Signal 6 received");
    CHECK(r->time_ns == 12'000'000'000LL);
  }
  SUBCASE("not JSON, no message, a list, empty, missing") {
    for (const char* text : {"not json", R"({"timestamp": 1})", "[1, 2]", ""}) {
      write(path, text);
      CHECK_FALSE(read_failure_record(path).has_value());
    }
    CHECK_FALSE(read_failure_record(dir.file("missing.json")).has_value());
  }
  SUBCASE("larger than any worker's record") {
    write(path, R"({"message": ")" + std::string(300 * 1024, 'x') + R"("})");
    CHECK_FALSE(read_failure_record(path).has_value());
  }
  SUBCASE("nested deep") {
    write(path, std::string(100000, '[') + std::string(100000, ']'));
    CHECK_FALSE(read_failure_record(path).has_value());
  }
  SUBCASE("nanoddp's fields of the wrong types are ignored") {
    write(path, R"({"message": "m", "nanoddp": {"time_ns": "soon", "caused_by_peer": 1, )"
                R"("peer_rank": 99999999999}})");
    const auto r = read_failure_record(path);
    REQUIRE(r.has_value());
    CHECK(r->time_ns == 0);
    CHECK_FALSE(r->caused_by_peer);
    CHECK_FALSE(r->peer_rank.has_value());
  }
}
