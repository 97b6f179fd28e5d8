// Usage: nanoddp-test-torch-store PORT
// Every Store operation of TorchStore against PyTorch's own TCPStore server on 127.0.0.1:PORT
// (tests/comm/torch_store.py starts it, sets "from_torch" = "hello", a 2000-byte "big", and
// "late" 0.3 s after this program sets "about_to_wait"). Prints one line per check; exits 1 at the
// first that fails. torch_store.py then reads back what this program wrote.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "nanoddp/comm/store.h"
#include "nanoddp/comm/torch_store.h"

using nanoddp::comm::PrefixStore;
using nanoddp::comm::StoreError;
using nanoddp::comm::TorchStore;
using nanoddp::comm::TorchStoreOptions;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

void check(bool ok, const std::string& what) {
  fmt::print("{} {}\n", ok ? "ok" : "FAILED", what);
  if (!ok) std::exit(1);
}

std::string text(const nanoddp::comm::Bytes& b) {
  return {b.begin(), b.end()};
}

nanoddp::comm::Bytes bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// Runs `f`, which must throw a StoreError containing `needle`; returns the seconds it took.
template <typename F>
double expect_error(F f, const std::string& needle, const std::string& what) {
  const auto start = Clock::now();
  std::string message = "(no error)";
  try {
    f();
  } catch (const StoreError& e) {
    message = e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  check(message.find(needle) != std::string::npos, fmt::format("{}: {}", what, message));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: nanoddp-test-torch-store PORT\n");
    return 2;
  }
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[1]));
  TorchStore store({.host = "127.0.0.1", .port = port, .timeout = 10s, .max_value_bytes = 1000});

  check(store.get_string("from_torch") == "hello", "get of a key torch set");
  store.set("from_nanoddp", std::string("\x00\x01 binary \xff", 11));
  check(store.add("counter", 5) == 5, "add to an absent key");
  check(store.add("counter", 7) == 12, "add again");
  check(store.get_string("counter") == "12", "a counter reads as decimal text");
  check(store.check({"from_torch", "counter"}), "check of present keys");
  check(!store.check({"from_torch", "absent"}), "check with one key absent");

  store.set("about_to_wait", std::string("1"));
  const auto start = Clock::now();
  store.wait({"late"});  // torch_store.py sets it 0.3 s after "about_to_wait"
  check(Clock::now() - start > 100ms, "wait blocks until the key is set");
  check(store.get_string("late") == "x", "get after wait");

  const auto empty = nanoddp::comm::Bytes{};
  check(text(store.compare_set("cas", empty, bytes("v1"))) == "v1", "compare_set of absent key");
  check(text(store.compare_set("cas", bytes("wrong"), bytes("v2"))) == "v1",
        "compare_set with the wrong expected value keeps the value");
  check(text(store.compare_set("cas", bytes("v1"), bytes("v2"))) == "v2", "compare_set swaps");
  check(store.remove("cas"), "remove of a present key");
  check(!store.remove("cas"), "remove of an absent key");
  check(!store.check({"cas"}), "a removed key is gone");

  const double waited =
      expect_error([&] { store.wait({"never"}, 300ms); }, "'never' is still missing",
                   "wait for a key nobody sets times out");
  check(waited >= 0.25 && waited < 3, fmt::format("  ... after {:.2f} s (0.3 s asked)", waited));
  check(store.get_string("from_torch") == "hello", "the next call reconnects and works");
  expect_error([&] { store.get("big"); }, "more than the limit of 1000",
               "a value over max_value_bytes is refused");
  check(store.get_string("from_torch") == "hello", "and the connection after that works");

  PrefixStore prefixed("nanoddp", std::make_shared<TorchStore>(TorchStoreOptions{
                                      .host = "127.0.0.1", .port = port, .timeout = 10s}));
  prefixed.set("restart0/rank0", std::string("addr"));
  check(prefixed.get_string("restart0/rank0") == "addr", "through a PrefixStore");

  // A port where nothing listens: the connection retries fail within the timeout.
  const double gave_up =
      expect_error([&] { TorchStore({.host = "127.0.0.1", .port = 1, .timeout = 300ms}); },
                   "cannot reach torchrun's store at 127.0.0.1:1", "nothing listening");
  check(gave_up < 3, fmt::format("  ... after {:.2f} s (0.3 s asked)", gave_up));
  fmt::print("all TorchStore checks passed\n");
  return 0;
}
