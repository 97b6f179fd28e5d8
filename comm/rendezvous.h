#pragma once
// "Who am I?": rank, world size and the master's address, read from whichever launcher started
// this process: nanoddp-run and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/
// LOCAL_SIZE) or Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE)
// with MASTER_ADDR / MASTER_PORT. With none of them set: a world of one.
//
// Precedence: RANK/WORLD_SIZE, else OMPI_COMM_WORLD_*, else SLURM_PROCID/SLURM_NTASKS (Slurm
// only when SLURM_PROCID is set: SLURM_NTASKS alone is an allocation's shell, not a task). The
// local variables are optional as a pair: without them the job is taken to run on one machine
// (local rank = rank). Slurm without --ntasks-per-node gives its local world size through
// SLURM_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID.
//
// Launcher specifics (docs/scaling.md, "Launchers"):
// - torchrun with TORCHELASTIC_USE_AGENT_STORE=True (its static rendezvous): the agent already
//   serves a PyTorch TCPStore on MASTER_ADDR:MASTER_PORT; every rank connects to it as a client
//   (WorldInfo::agent_store) instead of rank 0 serving nanoddp's own store there.
// - Open MPI's mpirun without MASTER_ADDR, every rank on one machine (OMPI_COMM_WORLD_LOCAL_SIZE
//   = OMPI_COMM_WORLD_SIZE): the store is on 127.0.0.1 at a port derived from the job's id
//   (MASTER_PORT, if set, wins), and the job's id is the store's shared secret (unless
//   NANODDP_STORE_TOKEN is set), so two jobs that hash to the same port fail with a clear error
//   instead of joining each other's store. On several machines MASTER_ADDR stays required.
// - Slurm: SLURM_PROCID/SLURM_NTASKS of an sbatch script itself (no SLURM_STEP_ID, or the
//   batch, extern or interactive step's id) describe the script, not a task srun started; with
//   SLURM_NTASKS > 1 that is refused, saying to start the ranks with srun.

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace nanoddp::comm {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;  // NANODDP_RESTART_COUNT (or TORCHELASTIC_RESTART_COUNT)
  std::string launcher;   // "torchrun", "openmpi", "slurm" or "none"
  // NANODDP_LAUNCHER_PID: the nanoddp-run that started this process, 0 under any other
  // launcher. init_distributed() ties the process's life to it.
  int launcher_pid = 0;
  // torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True): connect to it.
  bool agent_store = false;
  // The store's shared secret when the launcher implies one (mpirun's job id); "" otherwise.
  std::string store_token;
};

// Reads an environment variable; nullopt when unset. Tests pass their own table.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// Throws an Error naming the variable for: a non-number, a rank outside [0, world), a world
// size < 1, a local rank outside the local world, a port outside 1..65535, a missing
// MASTER_ADDR/MASTER_PORT for a world > 1, variables of one launcher only partly set, or a
// NANODDP_LAUNCHER_PID that is not a pid, a TORCHELASTIC_USE_AGENT_STORE other than
// True/False, or an sbatch script's own SLURM_* variables (see above).
WorldInfo world_from_env(const EnvLookup& env = process_env());

// Whether the launcher that started this process stops the other ranks as soon as one exits
// with an error: nanoddp-run (NANODDP_LAUNCHER_PID), torchrun (TORCHELASTIC_RUN_ID), Open MPI's
// mpirun (OMPI_COMM_WORLD_RANK). Ranks started by hand (or by srun, which by default lets the
// others run on) have nobody to stop them, and must tell each other.
bool launcher_stops_other_ranks(const EnvLookup& env = process_env());

// The port an mpirun job without MASTER_PORT uses: a hash of `job_id` into 20000..32767 (below
// Linux's ephemeral ports, so an outgoing connection rarely holds it).
int port_for_job(const std::string& job_id);

// The default timeout of every collective and store wait: $NANODDP_TIMEOUT_S seconds, else 300.
std::chrono::milliseconds default_timeout(const EnvLookup& env = process_env());

}  // namespace nanoddp::comm
