#include "worker_env.h"

#include <map>

namespace nanoddp::run {

std::vector<std::string> worker_environment(const WorkerIdentity& w, char** base) {
  std::map<std::string, std::string> env;
  for (char** entry = base; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const auto eq = text.find('=');
    if (eq != std::string::npos) env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  env["RANK"] = std::to_string(w.rank);
  env["WORLD_SIZE"] = std::to_string(w.world_size);
  env["LOCAL_RANK"] = std::to_string(w.local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(w.local_world_size);
  env["GROUP_RANK"] = std::to_string(w.group_rank);
  env["MASTER_ADDR"] = w.master_addr;
  env["MASTER_PORT"] = std::to_string(w.master_port);
  env["NANODDP_RESTART_COUNT"] = std::to_string(w.restart_count);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(w.restart_count);
  env["NANODDP_LAUNCHER_PID"] = std::to_string(w.launcher_pid);
  env.emplace("OMP_NUM_THREADS", "1");  // only when unset
  if (!w.store_token.empty()) env["NANODDP_STORE_TOKEN"] = w.store_token;
  for (const char* name : {"NANODDP_ERROR_FILE", "TORCHELASTIC_ERROR_FILE"}) {
    if (w.error_file.empty()) {
      env.erase(name);
    } else {
      env[name] = w.error_file;
    }
  }

  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

}  // namespace nanoddp::run
