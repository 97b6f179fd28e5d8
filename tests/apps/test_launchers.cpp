// nanoddp-train started the ways other launchers start it, where the launcher itself is not
// here (Slurm) or the case needs several machines (mpirun across nodes): the environment each
// launcher gives a rank, set by hand. The real torchrun and mpirun run in tests/apps/torchrun.sh
// and tests/apps/mpirun.sh.

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/subprocess.h"
#include "support/world.h"

using namespace nanoddp::testing;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> train(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {bin_path("nanoddp-train"),
                                   "--in",
                                   "8",
                                   "--out",
                                   "2",
                                   "--hidden",
                                   "16",
                                   "--layers",
                                   "2",
                                   "--batch",
                                   "8",
                                   "--steps",
                                   "30",
                                   "--log-every",
                                   "30"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("an sbatch script's own SLURM_* variables: refused at once, saying to use srun") {
  // Inside `sbatch --ntasks 4` but outside srun: SLURM_PROCID=0 and SLURM_NTASKS=4 describe the
  // script. Before, rank 0 served the store and waited NANODDP_TIMEOUT_S for 3 ranks that never
  // come.
  const std::map<std::string, std::string> script = {
      {"SLURM_JOB_ID", "4242"},     {"SLURM_PROCID", "0"},
      {"SLURM_NTASKS", "4"},        {"SLURM_LOCALID", "0"},
      {"SLURM_NODEID", "0"},        {"SLURM_TASKS_PER_NODE", "4"},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(free_port())},
      {"NANODDP_TIMEOUT_S", "60"}};
  // No step id, the batch step before Slurm 20.11 and since (an outside tester found the newer
  // batch and extern ids waited out the timeout), the extern step.
  for (const char* step : {"", "4294967294", "4294967291", "4294967292"}) {
    CAPTURE(step);
    ProcessOptions options{.env = script, .timeout = std::chrono::seconds(30)};
    if (*step != '\0') options.env["SLURM_STEP_ID"] = step;
    const auto start = Clock::now();
    const ProcessResult r = run_process(train({}), options);
    INFO(r.output);
    CHECK(Clock::now() - start < std::chrono::seconds(10));
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "not a task that srun started"));
    CHECK(contains(r.output, "Slurm job 4242"));
    CHECK(contains(r.output, "Start the ranks with srun"));
  }
}

TEST_CASE("srun's tasks (SLURM_PROCID, SLURM_STEP_ID, MASTER_ADDR) train as nanoddp-run's") {
  TempDir dir;
  ProcessOptions reference_options{.timeout = std::chrono::seconds(60)};
  const ProcessResult reference = run_process(
      [&] {
        std::vector<std::string> argv = {bin_path("nanoddp-run"), "--nproc-per-node", "2"};
        for (const auto& a : train({"--save", dir.file("reference.safetensors")})) {
          argv.push_back(a);
        }
        return argv;
      }(),
      reference_options);
  REQUIRE_MESSAGE(reference.exit_code == 0, reference.output);

  const std::string port = std::to_string(free_port());
  std::vector<std::future<ProcessResult>> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    ProcessOptions options{.env = {{"SLURM_JOB_ID", "4243"},
                                   {"SLURM_STEP_ID", "0"},
                                   {"SLURM_PROCID", std::to_string(rank)},
                                   {"SLURM_NTASKS", "2"},
                                   {"SLURM_LOCALID", std::to_string(rank)},
                                   {"SLURM_NODEID", "0"},
                                   {"SLURM_TASKS_PER_NODE", "2"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", port},
                                   {"NANODDP_TIMEOUT_S", "30"}},
                           .timeout = std::chrono::seconds(60)};
    tasks.push_back(std::async(std::launch::async, [&, rank, options] {
      return run_process(train({"--save", dir.file("srun.safetensors")}), options);
    }));
  }
  for (auto& t : tasks) {
    const ProcessResult r = t.get();
    INFO(r.output);
    CHECK(r.exit_code == 0);
  }
  CHECK(read_file(dir.file("srun.safetensors")) == read_file(dir.file("reference.safetensors")));
}

TEST_CASE("mpirun across machines without MASTER_ADDR: the clear error, at once") {
  // Two ranks of four on this machine (OMPI_COMM_WORLD_LOCAL_SIZE=2): rank 0's machine is not
  // known, so no loopback default.
  ProcessOptions options{.env = {{"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                 {"OMPI_MCA_ess_base_jobid", "910622721"}},
                         .timeout = std::chrono::seconds(30)};
  const ProcessResult r = run_process(train({}), options);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "OMPI_COMM_WORLD_SIZE=4 but MASTER_ADDR is not set"));
  CHECK(contains(r.output, "the ranks are on several machines"));
}

TEST_CASE("a restarted worker (TORCHELASTIC_RESTART_COUNT=1) without --resume is warned") {
  TempDir dir;
  ProcessOptions options{.env = {{"TORCHELASTIC_RESTART_COUNT", "1"}},
                         .timeout = std::chrono::seconds(30)};
  const ProcessResult plain = run_process(train({}), options);
  INFO(plain.output);
  CHECK(plain.exit_code == 0);
  CHECK(contains(plain.output, "this is restart 1 of the job"));
  CHECK(contains(plain.output, "--resume is not set: training starts again from step 0"));
  const ProcessResult resumed = run_process(
      train({"--checkpoint-dir", dir.path(), "--checkpoint-every", "10", "--resume"}), options);
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(!contains(resumed.output, "this is restart"));
  const ProcessResult first = run_process(train({}), ProcessOptions{});
  CHECK(!contains(first.output, "this is restart"));
}
