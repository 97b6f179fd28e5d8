// The programs in examples/, run as their users would run them: under nanoddp-run with two real
// processes over Gloo (and ddp_train alone, as a world of one).
#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

struct ExampleRun {
  std::string output;
  std::set<std::string> checksums;  // one per rank line; all ranks equal: one element
  int rank_lines = 0;
  double first_loss = 0, last_loss = 0;
  int epochs = 0;
};

ExampleRun parse(const std::string& output, int world_size) {
  ExampleRun run;
  const std::regex rank_line(R"(rank (\d+) of (\d+): parameters checksum ([0-9a-f]{16}))");
  const std::regex epoch_line(R"(epoch (\d+): loss ([0-9.e+-]+))");
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, rank_line)) {
      CHECK(std::stoi(m[2]) == world_size);
      run.checksums.insert(m[3]);
      ++run.rank_lines;
    } else if (std::regex_search(line, m, epoch_line)) {
      (run.epochs++ == 0 ? run.first_loss : run.last_loss) = std::stod(m[2]);
    }
  }
  return run;
}

// Runs build/bin/nanoddp-example-NAME under nanoddp-run with `ranks` processes (0: alone, no
// launcher), requires a clean exit and parses what it printed.
ExampleRun run_example(const std::string& name, int ranks) {
  std::vector<std::string> argv;
  if (ranks > 0) argv = {bin_path("nanoddp-run"), "--nproc-per-node", std::to_string(ranks)};
  argv.push_back(bin_path("nanoddp-example-" + name));
  const ProcessResult r = run_process(argv, {.timeout = std::chrono::seconds(120)});
  REQUIRE_MESSAGE((!r.timed_out && !r.signaled && r.exit_code == 0), r.output);
  ExampleRun run = parse(r.output, ranks > 0 ? ranks : 1);
  run.output = r.output;
  return run;
}

}  // namespace

TEST_CASE("example ddp_train: two ranks learn and end with the same parameters") {
  const ExampleRun run = run_example("ddp", 2);
  INFO(run.output);
  CHECK(run.rank_lines == 2);
  CHECK(run.checksums.size() == 1);  // DDP kept the ranks' parameters bit-identical
  CHECK(run.epochs == 4);
  CHECK(run.last_loss < run.first_loss / 5);
}

TEST_CASE("example ddp_train: alone it is a world of one") {
  const ExampleRun run = run_example("ddp", 0);
  INFO(run.output);
  CHECK(run.rank_lines == 1);
  CHECK(run.last_loss < run.first_loss / 5);
}

TEST_CASE("example custom_module: a user-defined residual model trains under DDP on two ranks") {
  const ExampleRun run = run_example("custom-module", 2);
  INFO(run.output);
  // The user's module names its parameters as PyTorch would (registered children, dotted).
  CHECK(run.output.find("blocks.1.fc2.weight    [32, 64]") != std::string::npos);
  CHECK(run.rank_lines == 2);
  CHECK(run.checksums.size() == 1);
  CHECK(run.epochs == 5);
  CHECK(run.last_loss < run.first_loss / 3);
}

TEST_CASE("example two_tower: two inputs, a shared encoder and an auxiliary loss under DDP") {
  const ExampleRun run = run_example("two-tower", 2);
  INFO(run.output);
  CHECK(run.rank_lines == 2);
  CHECK(run.checksums.size() == 1);  // the same parameters on both ranks, dropout and all
  CHECK(run.epochs == 5);
  CHECK(run.last_loss < run.first_loss / 2);
}
