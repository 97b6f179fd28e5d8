// world_from_env and default_timeout over tables of environments, good and bad.

#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/kernels/error.h"

using nanoddp::comm::EnvLookup;
using nanoddp::comm::WorldInfo;

namespace {

using Env = std::map<std::string, std::string>;

EnvLookup table(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

struct Good {
  const char* name;
  Env env;
  WorldInfo expected;
};

struct Bad {
  const char* name;
  Env env;
  std::string message;  // a substring of the error
};

const Env kMaster{{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}};

Env with_master(Env env) {
  env.insert(kMaster.begin(), kMaster.end());
  return env;
}

}  // namespace

TEST_CASE("world_from_env: launchers' environments give the expected world") {
  const std::vector<Good> rows = {
      {"nothing set: a world of one", {}, {.launcher = "none"}},
      {"torchrun, rank 1 of 4 on two nodes",
       with_master(
           {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}),
       {.rank = 1,
        .world_size = 4,
        .local_rank = 1,
        .local_world_size = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "torchrun"}},
      {"torchrun without local variables: one machine",
       with_master({{"RANK", "2"}, {"WORLD_SIZE", "3"}}),
       {.rank = 2,
        .world_size = 3,
        .local_rank = 2,
        .local_world_size = 3,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "torchrun"}},
      {"world of one needs no master",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}},
       {.launcher = "torchrun"}},
      {"restart count from NANODDP_RESTART_COUNT",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"NANODDP_RESTART_COUNT", "2"}},
       {.restart_count = 2, .launcher = "torchrun"}},
      {"restart count from TORCHELASTIC_RESTART_COUNT",
       {{"TORCHELASTIC_RESTART_COUNT", "3"}},
       {.restart_count = 3, .launcher = "none"}},
      {"nanoddp-run's NANODDP_LAUNCHER_PID",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"NANODDP_LAUNCHER_PID", "4242"}},
       {.launcher = "torchrun", .launcher_pid = 4242}},
      {"NANODDP_RESTART_COUNT wins over TORCHELASTIC_RESTART_COUNT",
       {{"NANODDP_RESTART_COUNT", "1"}, {"TORCHELASTIC_RESTART_COUNT", "5"}},
       {.restart_count = 1, .launcher = "none"}},
      {"Open MPI",
       with_master({{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
       {.rank = 3,
        .world_size = 4,
        .local_rank = 1,
        .local_world_size = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "openmpi"}},
      {"Slurm with --ntasks-per-node",
       with_master({{"SLURM_PROCID", "5"},
                    {"SLURM_NTASKS", "8"},
                    {"SLURM_STEP_ID", "0"},
                    {"SLURM_LOCALID", "1"},
                    {"SLURM_NTASKS_PER_NODE", "4"}}),
       {.rank = 5,
        .world_size = 8,
        .local_rank = 1,
        .local_world_size = 4,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "slurm"}},
      {"Slurm's SLURM_TASKS_PER_NODE by node id",
       with_master({{"SLURM_PROCID", "6"},
                    {"SLURM_NTASKS", "7"},
                    {"SLURM_STEPID", "3"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                    {"SLURM_NODEID", "3"}}),
       {.rank = 6,
        .world_size = 7,
        .local_rank = 0,
        .local_world_size = 1,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "slurm"}},
      {"SLURM_NTASKS alone (an allocation's shell) is not a launch",
       {{"SLURM_NTASKS", "4"}},
       {.launcher = "none"}},
      {"torchrun's variables win over Open MPI's and Slurm's",
       with_master({{"RANK", "1"},
                    {"WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_RANK", "0"},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "2"}}),
       {.rank = 1,
        .world_size = 2,
        .local_rank = 1,
        .local_world_size = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "torchrun"}},
      {"Open MPI wins over Slurm",
       with_master({{"OMPI_COMM_WORLD_RANK", "1"},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "2"}}),
       {.rank = 1,
        .world_size = 2,
        .local_rank = 1,
        .local_world_size = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "openmpi"}},
      {"a world of one takes MASTER_PORT when given",
       {{"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}},
       {.master_addr = "node7", .master_port = 1234, .launcher = "none"}},
      {"torchrun's static rendezvous: the agent serves the store",
       with_master({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}),
       {.world_size = 2,
        .local_world_size = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "torchrun",
        .agent_store = true}},
      {"torchrun's c10d rendezvous: rank 0 serves the store",
       with_master({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}}),
       {.world_size = 2,
        .local_world_size = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29400,
        .launcher = "torchrun"}},
      {"mpirun on one machine without MASTER_ADDR: loopback, the job's port and secret",
       {{"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"OMPI_MCA_ess_base_jobid", "910622721"}},
       {.rank = 1,
        .world_size = 2,
        .local_rank = 1,
        .local_world_size = 2,
        .master_addr = "127.0.0.1",
        .master_port = nanoddp::comm::port_for_job("910622721"),
        .launcher = "openmpi",
        .store_token = "openmpi-job-910622721"}},
      {"mpirun (Open MPI 5, PMIx) on one machine with MASTER_PORT",
       {{"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"PMIX_NAMESPACE", "prterun-vm-123@1"},
        {"MASTER_PORT", "23456"}},
       {.world_size = 2,
        .local_world_size = 2,
        .master_addr = "127.0.0.1",
        .master_port = 23456,
        .launcher = "openmpi",
        .store_token = "openmpi-job-prterun-vm-123@1"}},
      {"mpirun on one machine: NANODDP_STORE_TOKEN and the job's id make the secret",
       {{"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_MCA_ess_base_jobid", "7"},
        {"NANODDP_STORE_TOKEN", "s3cret"}},
       {.world_size = 2,
        .local_world_size = 2,
        .master_addr = "127.0.0.1",
        .master_port = nanoddp::comm::port_for_job("7"),
        .launcher = "openmpi",
        .store_token = "s3cret/openmpi-job-7"}},
      {"an sbatch script of one task is a world of one",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "42"}},
       {.launcher = "slurm"}},
  };
  for (const auto& row : rows) {
    CAPTURE(row.name);
    const WorldInfo w = nanoddp::comm::world_from_env(table(row.env));
    CHECK(w.rank == row.expected.rank);
    CHECK(w.world_size == row.expected.world_size);
    CHECK(w.local_rank == row.expected.local_rank);
    CHECK(w.local_world_size == row.expected.local_world_size);
    CHECK(w.master_addr == row.expected.master_addr);
    CHECK(w.master_port == row.expected.master_port);
    CHECK(w.restart_count == row.expected.restart_count);
    CHECK(w.launcher == row.expected.launcher);
    CHECK(w.launcher_pid == row.expected.launcher_pid);
    CHECK(w.agent_store == row.expected.agent_store);
    CHECK(w.store_token == row.expected.store_token);
  }
}

TEST_CASE("port_for_job: a port below the ephemeral range, different for different jobs") {
  const int a = nanoddp::comm::port_for_job("910622721");
  const int b = nanoddp::comm::port_for_job("910622722");
  CHECK(a != b);
  for (const int p : {a, b, nanoddp::comm::port_for_job("")}) {
    CHECK(p >= 20000);
    CHECK(p < 32768);
  }
  CHECK(a == nanoddp::comm::port_for_job("910622721"));  // every rank computes the same
}

TEST_CASE("world_from_env: bad environments fail with messages that name the variable") {
  const std::vector<Bad> rows = {
      {"not a number", with_master({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}),
       "RANK=abc is not a number"},
      {"trailing junk", with_master({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}),
       "RANK=1x is not a number"},
      {"empty", with_master({{"RANK", ""}, {"WORLD_SIZE", "2"}}), "RANK is set but empty"},
      {"rank outside the world", with_master({{"RANK", "3"}, {"WORLD_SIZE", "2"}}),
       "RANK=3 is outside the world of WORLD_SIZE=2 ranks (0..1)"},
      {"negative rank", with_master({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
       "RANK=-1 is outside the world"},
      {"world of zero", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 must be at least 1"},
      {"rank without world", {{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not"},
      {"world without rank", {{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
      {"missing MASTER_ADDR",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}},
       "WORLD_SIZE=2 but MASTER_ADDR is not set: set it to the address of rank 0's machine"},
      {"missing MASTER_PORT",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
       "WORLD_SIZE=2 but MASTER_PORT is not set"},
      {"Open MPI without MASTER_ADDR",
       {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       "OMPI_COMM_WORLD_SIZE=2 but MASTER_ADDR is not set"},
      {"Slurm without MASTER_ADDR",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}},
       "SLURM_NTASKS=4 but MASTER_ADDR is not set"},
      {"Slurm's task id without the task count",
       {{"SLURM_PROCID", "0"}},
       "SLURM_PROCID is set but SLURM_NTASKS is not"},
      {"port out of range",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
       "MASTER_PORT=70000 is not a port (1..65535)"},
      {"port not a number", {{"MASTER_PORT", "http"}}, "MASTER_PORT=http is not a number"},
      {"local rank outside the local world",
       with_master(
           {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
       "LOCAL_RANK=2 is outside the local world of LOCAL_WORLD_SIZE=2 ranks (0..1)"},
      {"local rank without local world",
       with_master({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}),
       "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"},
      {"local world larger than the world",
       with_master(
           {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}),
       "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"},
      {"Open MPI rank outside its world",
       with_master({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
       "OMPI_COMM_WORLD_RANK=2 is outside the world of OMPI_COMM_WORLD_SIZE=2 ranks (0..1)"},
      {"Slurm's unreadable SLURM_TASKS_PER_NODE",
       with_master({{"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "2"},
                    {"SLURM_STEP_ID", "0"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_TASKS_PER_NODE", "two"}}),
       "SLURM_TASKS_PER_NODE=two is not understood"},
      {"negative restart count",
       {{"NANODDP_RESTART_COUNT", "-1"}},
       "NANODDP_RESTART_COUNT=-1 must be 0 or more"},
      {"restart count not a number",
       {{"TORCHELASTIC_RESTART_COUNT", "x"}},
       "TORCHELASTIC_RESTART_COUNT=x is not a number"},
      {"empty MASTER_ADDR", {{"MASTER_ADDR", ""}}, "MASTER_ADDR is set but empty"},
      {"NANODDP_LAUNCHER_PID not a pid",
       {{"NANODDP_LAUNCHER_PID", "0"}},
       "NANODDP_LAUNCHER_PID=0 is not a process id"},
      {"NANODDP_LAUNCHER_PID not a number",
       {{"NANODDP_LAUNCHER_PID", "abc"}},
       "NANODDP_LAUNCHER_PID=abc is not a number"},
      {"rank out of int range",
       with_master({{"RANK", "99999999999999999999"}, {"WORLD_SIZE", "2"}}),
       "RANK=99999999999999999999 is out of range"},
      {"TORCHELASTIC_USE_AGENT_STORE neither True nor False",
       with_master({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "yes"}}),
       "TORCHELASTIC_USE_AGENT_STORE=yes is neither True nor False"},
      {"mpirun across machines without MASTER_ADDR",
       {{"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"OMPI_MCA_ess_base_jobid", "910622721"}},
       "OMPI_COMM_WORLD_SIZE=4 but MASTER_ADDR is not set: set it to the address of rank 0's "
       "machine (the ranks are on several machines: OMPI_COMM_WORLD_LOCAL_SIZE=2)"},
      {"an sbatch script's own variables (no step id)",
       with_master({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "42"}}),
       "SLURM_PROCID is set but SLURM_STEP_ID is not: this is the batch script of Slurm job 42, "
       "not a task that srun started, and its SLURM_NTASKS=4 ranks will never come. Start the "
       "ranks with srun"},
      {"an sbatch script's own variables (the batch step's id)",
       with_master({{"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "2"},
                    {"SLURM_STEP_ID", "4294967294"},
                    {"SLURM_JOB_ID", "42"}}),
       "SLURM_STEP_ID=4294967294 is the batch script's step, not an srun step: this is the batch "
       "script of Slurm job 42"},
      {"an sbatch script's own variables (old SLURM_STEPID, extern step)",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEPID", "4294967295"}},
       "not a task that srun started"},
  };
  for (const auto& row : rows) {
    CAPTURE(row.name);
    std::string message;
    try {
      (void)nanoddp::comm::world_from_env(table(row.env));
    } catch (const nanoddp::Error& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.find(row.message) != std::string::npos);
  }
}

TEST_CASE("default_timeout: NANODDP_TIMEOUT_S in seconds, else 300 s") {
  using std::chrono::milliseconds;
  CHECK(nanoddp::comm::default_timeout(table({})) == milliseconds(300000));
  CHECK(nanoddp::comm::default_timeout(table({{"NANODDP_TIMEOUT_S", "30"}})) ==
        milliseconds(30000));
  CHECK(nanoddp::comm::default_timeout(table({{"NANODDP_TIMEOUT_S", "0.25"}})) ==
        milliseconds(250));
  for (const char* bad : {"", "abc", "0", "-5", "inf", "nan", "10s", "1e30"}) {
    CAPTURE(bad);
    std::string message;
    try {
      (void)nanoddp::comm::default_timeout(table({{"NANODDP_TIMEOUT_S", bad}}));
    } catch (const nanoddp::Error& e) {
      message = e.what();
    }
    CHECK(message.find(std::string("NANODDP_TIMEOUT_S=") + bad +
                       " is not a positive number of seconds") != std::string::npos);
  }
}

TEST_CASE("process_env reads the real environment") {
  ::setenv("NANODDP_TEST_RENDEZVOUS_VAR", "42", 1);
  const auto env = nanoddp::comm::process_env();
  CHECK(env("NANODDP_TEST_RENDEZVOUS_VAR") == std::optional<std::string>("42"));
  ::unsetenv("NANODDP_TEST_RENDEZVOUS_VAR");
  CHECK_FALSE(env("NANODDP_TEST_RENDEZVOUS_VAR").has_value());
}
