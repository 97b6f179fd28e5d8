#include "nanoddp/comm/init.h"

#include <fmt/format.h>
#include <signal.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "nanoddp/comm/torch_store.h"
#include "nanoddp/engine/debug_log.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp::comm {

namespace {

// The parent of process `pid` (field 4 of /proc/<pid>/stat), or 0 if it cannot be read.
pid_t parent_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const auto paren = line.rfind(')');  // the command name may contain spaces and parentheses
  if (paren == std::string::npos) return 0;
  std::istringstream fields(line.substr(paren + 1));
  std::string state;
  pid_t parent = 0;
  fields >> state >> parent;
  return fields ? parent : 0;
}

// Whether `pid` is this process's parent, grandparent, ...
bool is_ancestor(pid_t pid) {
  pid_t p = ::getppid();
  for (int hops = 0; hops < 64 && p > 0; ++hops) {
    if (p == pid) return true;
    if (p == 1) return false;
    p = parent_of(p);
  }
  return false;
}

// nanoddp-run starts every worker in a process group of its own (so that stopping a worker
// stops its children too), so when the launcher itself is SIGKILLed (the OOM killer,
// `timeout -s KILL`, a batch system) no signal reaches the workers: they would train on,
// orphaned, forever. A worker the launcher started directly has the kernel send it SIGTERM
// when the launcher dies; one whose launcher is already gone stops here.
void tie_to_launcher(pid_t launcher) {
#ifdef __linux__
  if (::getppid() == launcher) {
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
      fail("prctl(PR_SET_PDEATHSIG) failed: {}", std::strerror(errno));
    }
    // The launcher may have died before the prctl: then this process has a new parent already.
    if (::getppid() == launcher) return;
  } else if (is_ancestor(launcher)) {
    // PROGRAM is a wrapper (a shell script) that started this process: a death signal would
    // follow the wrapper, not the launcher (which the wrapper survives), and could end this
    // process while the job goes on. Such a worker is stopped with its group, as any worker,
    // but outlives a SIGKILLed launcher (docs/reliability.md).
    debug_log(DebugLevel::kInfo, "nanoddp-run (pid {}) is not the parent: no parent-death signal",
              launcher);
    return;
  }
  fail(
      "NANODDP_LAUNCHER_PID={}: the nanoddp-run that started this process is no longer running "
      "(it died before this worker got going); stopping instead of training unsupervised",
      launcher);
#else
  (void)launcher;  // no parent-death signal to ask for
#endif
}

// This machine's name, as the set-up's messages give it ("?" if it cannot be read).
std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

std::string world_size_mismatch(int world_size, int rank, const std::string& theirs,
                                const std::string& other) {
  return fmt::format(
      "the ranks disagree on the world size: WORLD_SIZE is {} on rank {} but {} on rank {}. "
      "Start every rank with the same WORLD_SIZE.",
      world_size, rank, theirs, other);
}

// The first other rank whose published world size differs from this rank's (only those
// already there: no wait), as (rank, its size).
std::optional<std::pair<int, std::string>> other_world_size(Store& store, const WorldInfo& world) {
  for (int other = 0; other < world.world_size; ++other) {
    const std::string key = fmt::format("world_size/{}", other);
    if (other == world.rank || !store.check({key})) continue;
    const std::string theirs = store.get_string(key);
    if (theirs != std::to_string(world.world_size)) return std::pair{other, theirs};
  }
  return std::nullopt;
}

// Ends this rank's set-up on a world size mismatch with `other` (its rank and size). The
// check-out is brief: a rank 0 with the larger WORLD_SIZE waits for ranks that never come.
[[noreturn]] void fail_world_sizes(Distributed& dist, const std::string& other_rank,
                                   const std::string& other_size) {
  dist.abandon_setup();
  fail("{}", world_size_mismatch(dist.world.world_size, dist.world.rank, other_size, other_rank));
}

// What another rank found wrong with the set-up, from this rank's own view where it can see the
// difference (another world size), else as that rank said it.
[[noreturn]] void fail_setup_found_elsewhere(Distributed& dist) {
  if (const auto other = other_world_size(*dist.store, dist.world)) {
    fail_world_sizes(dist, std::to_string(other->first), other->second);
  }
  dist.abandon_setup();
  fail("{}", dist.store->get_string("setup_failed"));
}

// The check-in, before any rank starts the group. Each process publishes its world size (the
// first one sets the job's), claims its RANK, and waits until the whole world is ready. A rank
// that finds the set-up wrong (another WORLD_SIZE, its RANK taken) raises "setup_failed" and
// releases the waiters, who fail with it: nobody is inside Gloo's connection set-up, which
// nothing can interrupt and which otherwise waited its whole timeout for ranks that never came
// (a rank 0 with the larger WORLD_SIZE, a third rank with the larger one, a RANK given twice).
void check_in(Distributed& dist, std::chrono::milliseconds timeout) {
  Store& store = *dist.store;
  const WorldInfo& world = dist.world;
  const auto bytes = [](const std::string& text) {
    return std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  };
  auto raise = [&](const std::string& why) {
    store.set("setup_failed", fmt::format("rank {} found that {}", world.rank, why));
    store.set("ready/all", std::string("1"));  // wakes the waiters
  };
  store.set(fmt::format("world_size/{}", world.rank), std::to_string(world.world_size));

  const std::string own_size = fmt::format("{} {}", world.world_size, world.rank);
  const Bytes first = store.compare_set("world_size", {}, bytes(own_size));
  const std::string first_text(first.begin(), first.end());
  const auto space = first_text.find(' ');
  if (first_text.substr(0, space) != std::to_string(world.world_size)) {
    const std::string first_rank = first_text.substr(space + 1);
    raise(
        world_size_mismatch(world.world_size, world.rank, first_text.substr(0, space), first_rank));
    fail_world_sizes(dist, first_rank, first_text.substr(0, space));
  }

  const std::string me = fmt::format("{} pid {}", host_name(), getpid());
  const Bytes holder = store.compare_set(fmt::format("rank/{}", world.rank), {}, bytes(me));
  if (std::string(holder.begin(), holder.end()) != me) {
    // Said so that it reads true on every rank that prints it, the holder's too (an outside
    // operator read "another process (pid P)" printed by pid P itself).
    const std::string why = fmt::format(
        "RANK={} was given to two processes: {} claimed it first, then {}. Give every process "
        "its own RANK (0..{}); with a launcher on each node, each node its own node rank.",
        world.rank, std::string(holder.begin(), holder.end()), me, world.world_size - 1);
    raise(why);
    dist.abandon_setup();
    fail("{}", why);
  }

  if (store.add("ready", 1) >= world.world_size) store.set("ready/all", std::string("1"));
  try {
    store.wait({"ready/all"}, timeout);
  } catch (const StoreError&) {
    // The store still answers (else this throws its own error): who never claimed a RANK.
    std::string missing;
    for (int r = 0; r < world.world_size; ++r) {
      if (!store.check({fmt::format("rank/{}", r)})) {
        missing += missing.empty() ? std::to_string(r) : ", " + std::to_string(r);
      }
    }
    dist.abandon_setup();
    throw CommError(fmt::format(
        "the set-up of rank {} of {} waited {:.1f} s for the other ranks: rank(s) {} never "
        "joined (is every rank running, with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT?)",
        world.rank, world.world_size, std::chrono::duration<double>(timeout).count(),
        missing.empty() ? std::string("?") : missing));
  }
  if (store.check({"setup_failed"})) fail_setup_found_elsewhere(dist);
}

// Where a process that failed before it joined finds the job's store, and who it is: from
// world_from_env() when its environment is valid, else read loosely (an invalid RANK is often
// the very failure to report). nullopt when there is no store to tell.
struct FailedProcess {
  std::string rank_text;  // "2", or "?" when no rank variable is set
  std::optional<int> rank;
  int world_size = 0;  // 0 when unknown
  TcpStoreOptions store;
  int restart_count = 0;
};

std::optional<FailedProcess> failed_process(const EnvLookup& env) {
  FailedProcess p;
  try {
    const WorldInfo world = world_from_env(env);
    if (world.world_size <= 1 || world.agent_store) return std::nullopt;
    p.rank = world.rank;
    p.rank_text = std::to_string(world.rank);
    p.world_size = world.world_size;
    p.store.host = world.master_addr;
    p.store.port = static_cast<std::uint16_t>(world.master_port);
    p.store.token = world.store_token;
    p.restart_count = world.restart_count;
    return p;
  } catch (const std::exception&) {
  }
  const auto number = [&](const char* name) -> std::optional<long long> {
    const auto text = env(name);
    if (!text || text->empty()) return std::nullopt;
    char* end = nullptr;
    const long long v = std::strtoll(text->c_str(), &end, 10);
    return *end == '\0' ? std::optional(v) : std::nullopt;
  };
  const auto addr = env("MASTER_ADDR");
  const auto port = number("MASTER_PORT");
  if (!addr || addr->empty() || !port || *port < 1 || *port > 65535) return std::nullopt;
  if (const auto agent = env("TORCHELASTIC_USE_AGENT_STORE"); agent && *agent != "False") {
    return std::nullopt;
  }
  p.rank_text = "?";
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (const auto text = env(name)) {
      p.rank_text = *text;
      break;
    }
  }
  // Rank 0 serves the store: one whose environment is invalid cannot know it is rank 0 of the
  // world the others are in, so it serves nothing (the others then time out reaching it).
  if (p.rank_text == "0") return std::nullopt;
  p.store.host = *addr;
  p.store.port = static_cast<std::uint16_t>(*port);
  p.restart_count = static_cast<int>(
      std::clamp<long long>(number("NANODDP_RESTART_COUNT").value_or(0), 0, 1'000'000'000));
  return p;
}

}  // namespace

void tell_peers_setup_failed(const std::string& why, std::chrono::milliseconds bound,
                             const EnvLookup& env) {
  // Its launcher stops the others itself, and names this rank as the one that failed first:
  // others that stopped on this rank's word as fast would share the blame in its summary.
  if (launcher_stops_other_ranks(env)) return;
  const std::optional<FailedProcess> p = failed_process(env);
  if (!p) return;
  try {
    bound = std::min(bound, default_timeout(env));  // never longer than the job's own timeout
  } catch (const std::exception&) {
  }
  const std::string message = fmt::format(
      "rank {} (host {}, pid {}) stopped before it joined the job: {}. Fix that rank's command "
      "or environment, then start the job again",
      p->rank_text, host_name(), ::getpid(), why);
  try {
    // The same keys as check_in(): the failure, then the waiters' release. A rank that reads
    // them checks out ("finished"), as one that failed itself in the check-in does.
    TcpStoreOptions options = p->store;
    options.timeout = bound;
    std::unique_ptr<TcpStoreServer> server;
    if (p->rank == 0) {
      server = std::make_unique<TcpStoreServer>(options);
      options.port = server->port();
    }
    PrefixStore store(fmt::format("restart{}", p->restart_count),
                      std::make_shared<TcpStore>(options));
    store.compare_set("setup_failed", {},
                      std::span(reinterpret_cast<const std::uint8_t*>(message.data()),
                                message.size()));  // the first failure reported stands
    store.set("ready/all", std::string("1"));
    store.add("finished", 1);
    if (server) {
      // Until every other rank has read it (each checks out), or `bound`. How many others: the
      // largest world any of them claims (the first to check in sets "world_size"), as a rank
      // of another WORLD_SIZE must be told too; then a second more, for a rank given twice.
      const auto deadline = std::chrono::steady_clock::now() + bound;
      const auto expected = [&] {
        int most = p->world_size;
        if (store.check({"world_size"})) {
          most = std::max(most, std::atoi(store.get_string("world_size").c_str()));
        }
        return most;
      };
      while (store.add("finished", 0) < expected() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          std::chrono::seconds(1),
          std::max<std::chrono::steady_clock::duration>(deadline - std::chrono::steady_clock::now(),
                                                        std::chrono::seconds(0))));
    }
  } catch (const std::exception& e) {
    // Nobody to tell (rank 0's store is not up, the port is taken): the others time out as
    // before, naming this rank as one that never joined.
    debug_log(DebugLevel::kInfo, "could not tell the other ranks of this failure: {}", e.what());
  }
}

std::string resolve_backend(const std::string& backend, Device device) {
  if (backend == "auto") return device.is_cuda() ? "nccl" : "gloo";
  if (backend == "gloo") return backend;
  if (backend == "nccl") {
    if (!device.is_cuda()) {
      fail("the NCCL backend needs a cuda device (got {}); use the gloo backend on the CPU",
           device.str());
    }
    return backend;
  }
  fail("unknown backend '{}' (expected gloo, nccl or auto)", backend);
}

Distributed init_distributed(const WorldInfo& world, const DistributedOptions& options) {
  const std::string backend = resolve_backend(options.backend, options.device);
  Distributed dist;
  dist.world = world;
  set_debug_rank(world.rank);
  if (world.launcher_pid > 0) tie_to_launcher(static_cast<pid_t>(world.launcher_pid));
  debug_log(DebugLevel::kInfo,
            "rendezvous: rank {} of {} (local rank {} of {}), store at {}:{}{}, restart {}",
            world.rank, world.world_size, world.local_rank, world.local_world_size,
            world.master_addr, world.master_port,
            world.agent_store ? " (torchrun's)"
            : world.rank == 0 ? " (served here)"
                              : "",
            world.restart_count);

  // 1. The store. Rank 0 serves it on MASTER_ADDR:MASTER_PORT. A world of one needs nobody to
  // find it, so it takes any free port: two single-process jobs on one machine never collide.
  // Under torchrun's static rendezvous its agent serves the store there already: every rank is
  // a client, and our keys go under "nanoddp/" beside torchrun's own.
  std::shared_ptr<Store> client;
  if (world.agent_store) {
    client = std::make_shared<PrefixStore>(
        "nanoddp", std::make_shared<TorchStore>(
                       TorchStoreOptions{.host = world.master_addr,
                                         .port = static_cast<std::uint16_t>(world.master_port),
                                         .timeout = options.timeout}));
  } else {
    TcpStoreOptions store_options;
    store_options.host = world.master_addr;
    store_options.port = static_cast<std::uint16_t>(world.world_size == 1 ? 0 : world.master_port);
    store_options.timeout = options.timeout;
    store_options.token = world.store_token;
    if (world.rank == 0) {
      try {
        dist.server = std::make_unique<TcpStoreServer>(store_options);
      } catch (const StoreError& e) {
        // A port in use or an address of another machine: what MASTER_ADDR/MASTER_PORT say is
        // wrong (a usage error), not a store that failed to answer.
        fail("{}", e.what());
      }
      store_options.port = dist.server->port();
    }
    client = std::make_shared<TcpStore>(store_options);
  }
  // 2. One key namespace per restart: a restarted group never reads the keys (Gloo addresses,
  // the NCCL unique id) of the attempt that failed.
  dist.store = std::make_shared<PrefixStore>(fmt::format("restart{}", world.restart_count),
                                             std::move(client));

  // 3. The check-in (check_in above): no rank starts the group until the whole world has
  // arrived and agrees.
  if (world.world_size > 1) check_in(dist, options.timeout);

  // 4. The group.
  if (options.make_group) create_group(dist, options);
  return dist;
}

void create_group(Distributed& dist, const DistributedOptions& options) {
  const std::string backend = resolve_backend(options.backend, options.device);
  const WorldInfo& world = dist.world;
  ProcessGroupOptions group_options;
  group_options.timeout = options.timeout;
  group_options.interface = options.interface;
  group_options.master_addr = world.master_addr;
  group_options.device_index = options.device.is_cuda() ? options.device.index : 0;
  try {
    dist.group =
        backend == "nccl"
            ? make_nccl_process_group(dist.store, world.rank, world.world_size, group_options)
            : make_gloo_process_group(dist.store, world.rank, world.world_size, group_options);
    debug_log(DebugLevel::kInfo, "process group ready: backend {}, {} ranks",
              dist.group->backend_name(), world.world_size);
  } catch (const std::exception&) {
    // The check-in found the world sizes and ranks right: a peer died or stopped answering since.
    dist.abandon_setup();
    throw;
  }
}

bool is_communication_failure(const std::exception& e) {
  return dynamic_cast<const CommError*>(&e) != nullptr ||
         dynamic_cast<const StoreError*>(&e) != nullptr;
}

Distributed::~Distributed() {
  // The group goes first: its threads joined, its connections closed.
  group.reset();
  if (store != nullptr) {
    try {
      // Every rank checks out; rank 0 keeps the server up until all have (bounded), so a
      // fast rank 0 cannot pull the store from under a rank still finishing its set-up. After a
      // failure the store's host may be the rank that is stuck (SIGSTOPped, swapping): a rank
      // that has said why it fails spends a short while on it, not a whole timeout more (an
      // outside tester's survivor exited one full NANODDP_TIMEOUT_S after its error).
      if (check_out_ == CheckOut::kSkip) {
        store->set_timeout(
            std::min<std::chrono::milliseconds>(store->timeout(), std::chrono::seconds(2)));
      }
      store->add("finished", 1);
      if (server != nullptr && check_out_ != CheckOut::kSkip) {
        const auto timeout = store->timeout();
        const auto limit =
            check_out_ == CheckOut::kWait
                ? std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30))
                : std::min<std::chrono::milliseconds>(timeout / 2, std::chrono::seconds(3));
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (store->add("finished", 0) < world.world_size &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    } catch (const std::exception&) {
      // The server is gone (rank 0 ended first) or unreachable: nothing left to wait for.
    }
  }
  store.reset();
  server.reset();
}

}  // namespace nanoddp::comm
