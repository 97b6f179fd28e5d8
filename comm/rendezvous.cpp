#include "nanoddp/comm/rendezvous.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

// The variables of one launcher.
struct Launcher {
  const char* name;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
};

constexpr Launcher kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Launcher kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Launcher kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                          "SLURM_NTASKS_PER_NODE"};

// An integer variable, strictly: digits with an optional sign, nothing else.
long long parse_int(const std::string& name, const std::string& text) {
  if (text.empty()) fail("{} is set but empty; it must be a number", name);
  long long v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range) fail("{}={} is out of range", name, text);
  if (ec != std::errc() || ptr != end) fail("{}={} is not a number", name, text);
  return v;
}

std::optional<long long> int_var(const EnvLookup& env, const std::string& name) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  return parse_int(name, *text);
}

// Slurm's SLURM_TASKS_PER_NODE, e.g. "2(x3),1": tasks on node 0..2 = 2, on node 3 = 1.
std::vector<long long> expand_tasks_per_node(const std::string& text) {
  const auto bad = [&] {
    fail(
        "SLURM_TASKS_PER_NODE={} is not understood (expected e.g. \"4\" or \"2(x3),1\"); set "
        "SLURM_NTASKS_PER_NODE, or launch with srun --ntasks-per-node",
        text);
  };
  std::vector<long long> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    long long count = 0;
    long long repeat = 1;
    const char* b = item.data();
    const char* e = item.data() + item.size();
    auto [p, ec] = std::from_chars(b, e, count);
    if (ec != std::errc() || p == b) bad();
    if (p != e) {
      const std::string rest(p, e);
      if (rest.size() < 4 || rest.rfind("(x", 0) != 0 || rest.back() != ')') bad();
      const char* rb = p + 2;
      const char* re = e - 1;
      auto [q, ec2] = std::from_chars(rb, re, repeat);
      if (ec2 != std::errc() || q != re || repeat < 1 || repeat > 1'000'000) bad();
    }
    out.insert(out.end(), static_cast<std::size_t>(repeat), count);
    pos = comma + 1;
  }
  return out;
}

std::string rank_range(long long n) {
  return n == 1 ? "0" : fmt::format("0..{}", n - 1);
}

// Steps an sbatch script (or salloc's shell) runs in, as Slurm numbers them (slurm.h): since
// Slurm 20.11 the batch step is 0xfffffffb, the extern step 0xfffffffc, a pending step
// 0xfffffffd and the interactive step 0xfffffffa; before, batch was 0xfffffffe (NO_VAL) and
// extern 0xffffffff (INFINITE). Slurm also prints them as words.
bool is_slurm_script_step(const std::string& step) {
  for (const char* id : {"4294967290", "4294967291", "4294967292", "4294967293", "4294967294",
                         "4294967295", "batch", "extern", "interactive", "pending"}) {
    if (step == id) return true;
  }
  return false;
}

// An sbatch script's own SLURM_PROCID/SLURM_NTASKS: refused when they promise other ranks.
void refuse_slurm_batch_script(const EnvLookup& env, long long world) {
  auto step = env("SLURM_STEP_ID");
  if (!step) step = env("SLURM_STEPID");
  if (step && !is_slurm_script_step(*step)) return;  // a task srun started
  if (world <= 1) return;                            // a script that is its own one-rank job
  fail(
      "SLURM_PROCID is set but {}: this is the batch script of Slurm job {}, not a task that "
      "srun started, and its SLURM_NTASKS={} ranks will never come. Start the ranks with srun "
      "(srun PROGRAM ..., or srun one nanoddp-run per node)",
      step ? fmt::format("SLURM_STEP_ID={} is the batch script's step, not an srun step", *step)
           : std::string("SLURM_STEP_ID is not"),
      env("SLURM_JOB_ID").value_or("?"), world);
}

bool parse_bool(const std::string& name, const std::string& text) {
  if (text == "True" || text == "true" || text == "1") return true;
  if (text == "False" || text == "false" || text == "0") return false;
  fail("{}={} is neither True nor False", name, text);
}

// The id of an mpirun job: Open MPI 4's OMPI_MCA_ess_base_jobid, else PMIx's namespace (Open
// MPI 5), else the head node's URI.
std::optional<std::string> openmpi_job_id(const EnvLookup& env) {
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri"}) {
    if (auto v = env(name); v && !v->empty()) return v;
  }
  return std::nullopt;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

WorldInfo world_from_env(const EnvLookup& env) {
  WorldInfo info;
  info.launcher = "none";

  // The first launcher whose variables are present wins: torchrun / nanoddp-run, Open MPI, Slurm.
  // Slurm's SLURM_NTASKS alone marks an allocation (a shell from salloc or sbatch), not a
  // launched task, so Slurm counts only when SLURM_PROCID is set.
  const Launcher* launcher = nullptr;
  for (const Launcher* l : {&kTorchrun, &kOpenMpi, &kSlurm}) {
    const bool has_rank = env(l->rank).has_value();
    const bool has_world = env(l->world).has_value();
    if (l == &kSlurm && !has_rank) continue;
    if (has_rank && !has_world) fail("{} is set but {} is not", l->rank, l->world);
    if (has_world && !has_rank) fail("{} is set but {} is not", l->world, l->rank);
    if (has_rank) {
      launcher = l;
      break;
    }
  }

  if (launcher != nullptr) {
    const Launcher& l = *launcher;
    info.launcher = l.name;
    const long long world = *int_var(env, l.world);
    const long long rank = *int_var(env, l.rank);
    if (world < 1) fail("{}={} must be at least 1", l.world, world);
    if (world > (1 << 24)) fail("{}={} is not a plausible number of ranks", l.world, world);
    if (rank < 0 || rank >= world) {
      fail("{}={} is outside the world of {}={} ranks ({})", l.rank, rank, l.world, world,
           rank_range(world));
    }

    std::optional<long long> local_rank = int_var(env, l.local_rank);
    std::optional<long long> local_world = int_var(env, l.local_world);
    std::string local_world_name = l.local_world;
    if (launcher == &kSlurm && local_rank && !local_world) {
      // SLURM_NTASKS_PER_NODE exists only with --ntasks-per-node; SLURM_TASKS_PER_NODE always.
      if (const auto text = env("SLURM_TASKS_PER_NODE")) {
        const auto per_node = expand_tasks_per_node(*text);
        const long long node = int_var(env, "SLURM_NODEID").value_or(0);
        if (node < 0 || node >= static_cast<long long>(per_node.size())) {
          fail("SLURM_NODEID={} has no entry in SLURM_TASKS_PER_NODE={}", node, *text);
        }
        local_world = per_node[static_cast<std::size_t>(node)];
        local_world_name = "SLURM_TASKS_PER_NODE";
      }
    }
    if (local_rank && !local_world) fail("{} is set but {} is not", l.local_rank, l.local_world);
    if (local_world && !local_rank) fail("{} is set but {} is not", local_world_name, l.local_rank);
    if (!local_rank) {
      // No local variables: assume one machine, where the local rank is the rank.
      local_rank = rank;
      local_world = world;
    }
    if (*local_world < 1) fail("{}={} must be at least 1", local_world_name, *local_world);
    if (*local_world > world) {
      fail("{}={} is larger than {}={}", local_world_name, *local_world, l.world, world);
    }
    if (*local_rank < 0 || *local_rank >= *local_world) {
      fail("{}={} is outside the local world of {}={} ranks ({})", l.local_rank, *local_rank,
           local_world_name, *local_world, rank_range(*local_world));
    }
    info.rank = static_cast<int>(rank);
    info.world_size = static_cast<int>(world);
    info.local_rank = static_cast<int>(*local_rank);
    info.local_world_size = static_cast<int>(*local_world);
    if (launcher == &kSlurm) refuse_slurm_batch_script(env, world);
  }

  auto addr = env("MASTER_ADDR");
  auto port_text = env("MASTER_PORT");
  if (launcher == &kOpenMpi && !addr && info.local_world_size == info.world_size) {
    // Every rank on this machine: no one needs to be told where rank 0 is.
    if (const auto job = openmpi_job_id(env)) {
      addr = "127.0.0.1";
      if (!port_text) port_text = std::to_string(port_for_job(*job));
      // The job's id in the store's token, beside any the user set: two jobs on one port stay
      // apart even when both inherited the same NANODDP_STORE_TOKEN.
      const auto user_token = env("NANODDP_STORE_TOKEN");
      info.store_token = (user_token ? *user_token + "/" : std::string()) + "openmpi-job-" + *job;
    }
  }
  if (info.world_size > 1) {
    const char* world_name = launcher->world;
    if (!addr) {
      fail("{}={} but MASTER_ADDR is not set: set it to the address of rank 0's machine{}",
           world_name, info.world_size,
           launcher == &kOpenMpi && info.local_world_size < info.world_size
               ? fmt::format(" (the ranks are on several machines: "
                             "OMPI_COMM_WORLD_LOCAL_SIZE={})",
                             info.local_world_size)
               : std::string());
    }
    if (!port_text) {
      fail(
          "{}={} but MASTER_PORT is not set: set it to a free port on rank 0's machine (e.g. "
          "29500)",
          world_name, info.world_size);
    }
  }
  if (addr) {
    if (addr->empty())
      fail("MASTER_ADDR is set but empty: set it to the address of rank 0's machine");
    info.master_addr = *addr;
  }
  if (port_text) {
    const long long port = parse_int("MASTER_PORT", *port_text);
    if (port < 1 || port > 65535) fail("MASTER_PORT={} is not a port (1..65535)", port);
    info.master_port = static_cast<int>(port);
  }

  for (const char* name : {"NANODDP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    if (const auto count = int_var(env, name)) {
      if (*count < 0 || *count > 1'000'000'000) fail("{}={} must be 0 or more", name, *count);
      info.restart_count = static_cast<int>(*count);
      break;
    }
  }
  if (launcher == &kTorchrun) {
    if (const auto text = env("TORCHELASTIC_USE_AGENT_STORE")) {
      info.agent_store = parse_bool("TORCHELASTIC_USE_AGENT_STORE", *text);
    }
  }
  if (const auto pid = int_var(env, "NANODDP_LAUNCHER_PID")) {
    if (*pid < 1 || *pid > std::numeric_limits<int>::max()) {
      fail("NANODDP_LAUNCHER_PID={} is not a process id", *pid);
    }
    info.launcher_pid = static_cast<int>(*pid);
  }
  return info;
}

bool launcher_stops_other_ranks(const EnvLookup& env) {
  for (const char* name : {"NANODDP_LAUNCHER_PID", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK"}) {
    if (env(name)) return true;
  }
  return false;
}

int port_for_job(const std::string& job_id) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (const char c : job_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return 20000 + static_cast<int>(h % 12768u);
}

std::chrono::milliseconds default_timeout(const EnvLookup& env) {
  const auto text = env("NANODDP_TIMEOUT_S");
  if (!text) return std::chrono::seconds(300);
  double seconds = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, seconds);
  // The upper bound keeps the conversion to milliseconds far from overflow (~30 years).
  if (text->empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > 1e9) {
    fail("NANODDP_TIMEOUT_S={} is not a positive number of seconds (e.g. NANODDP_TIMEOUT_S=300)",
         *text);
  }
  return std::chrono::milliseconds(
      std::max<long long>(1, static_cast<long long>(std::ceil(seconds * 1000.0))));
}

}  // namespace nanoddp::comm
