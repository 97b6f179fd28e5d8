// A flood of idle connections to the store during a real job (issue #13 item 17): with the
// usual 1,024 open-file limit, 1,100 connections that never send the token used to take every
// descriptor of rank 0 (the store's host), whose next liveness check then read "too many open
// files" as "rank 1's process has exited" and failed a healthy job. Now the store holds fewer
// connections than the file limit allows, replaces idle ones still in their handshake, and
// closes them after a few seconds; the job must end with the very parameters it ends with
// undisturbed.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "faults_util.h"

using namespace nanoddp::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kJobFileLimit = 1024;  // the usual soft limit, set on the job with prlimit
constexpr int kFloodConnections = 1100;
constexpr int kMaxConnectionsOpened = 40000;  // bounds the whole flood

// A connection to 127.0.0.1:port, or -1 if refused or not established within 500 ms (a full
// listen backlog makes a blocking connect wait for SYN retries, seconds each).
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof error;
    if (errno != EINPROGRESS || ::poll(&p, 1, 500) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

// Whether the server closed this connection (it never sent us anything else).
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte = 0;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> job(const TempDir& dir, const std::string& name, int port) {
  std::vector<std::string> argv = {"/usr/bin/prlimit",
                                   fmt::format("--nofile={0}:{0}", kJobFileLimit),
                                   "--",
                                   bin_path("nanoddp-run"),
                                   "--nproc-per-node",
                                   "2",
                                   "--master-port",
                                   std::to_string(port)};
  // Checkpoints and metrics: the job keeps opening files while the flood is on. Long enough
  // (seconds, even on a fast machine) for the flood to fill and be cut back while it runs, and
  // within the limits below under the sanitizers (a minute or two each).
  for (const auto& a :
       train_argv({"--steps", "15000", "--log-every", "3000", "--save",
                   dir.file(name + ".safetensors"), "--metrics", dir.file(name + ".jsonl"),
                   "--checkpoint-dir", dir.file(name + "-ckpt"), "--checkpoint-every", "3000"})) {
    argv.push_back(a);
  }
  return argv;
}

}  // namespace

TEST_CASE("a flood of idle connections to the store leaves a running job unharmed") {
  // This process holds the flood: it needs more descriptors than the job may have.
  rlimit limit{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (limit.rlim_cur < kFloodConnections + 200) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, kFloodConnections + 200);
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  REQUIRE_MESSAGE(limit.rlim_cur >= kFloodConnections + 200,
                  "the test needs an open-file limit of at least ", kFloodConnections + 200);

  TempDir dir;
  const std::map<std::string, std::string> env = {{"NANODDP_TIMEOUT_S", "30"}};
  // 1. Undisturbed.
  ProcessOptions options;
  options.timeout = 140s;
  options.env = env;
  const ProcessResult quiet = run_process(job(dir, "quiet", free_port()), options);
  REQUIRE_MESSAGE(quiet.exit_code == 0, quiet.output);

  // 2. The same job under a flood that starts as soon as the store listens and lasts until the
  //    job ends: kFloodConnections idle connections, each one the server closes replaced.
  const int port = free_port();
  BackgroundProcess launcher(with_env(env, job(dir, "flooded", port)));
  std::vector<int> flood;
  const auto start = Clock::now();
  while (flood.empty() && Clock::now() - start < 30s) {
    const int fd = connect_loopback(port);
    if (fd >= 0) {
      flood.push_back(fd);
    } else {
      std::this_thread::sleep_for(5ms);
    }
  }
  REQUIRE_MESSAGE(!flood.empty(), "the store never listened\n", launcher.output());
  int opened = 1;
  int closed_by_server = 0;
  std::optional<int> status;
  while (!status && Clock::now() - start < 140s) {
    for (int& fd : flood) {
      if (fd >= 0 && closed_by_peer(fd)) {
        ::close(fd);
        fd = -1;
        ++closed_by_server;
      }
    }
    std::erase(flood, -1);
    while (static_cast<int>(flood.size()) < kFloodConnections && opened < kMaxConnectionsOpened) {
      const int fd = connect_loopback(port);
      if (fd < 0) break;  // the backlog is full, or the job is gone
      flood.push_back(fd);
      ++opened;
    }
    status = launcher.poll_exit(200ms);
  }
  for (const int fd : flood) ::close(fd);
  INFO("flood: ", opened, " connections opened, ", closed_by_server, " closed by the store\n",
       launcher.output());
  REQUIRE(status.has_value());
  CHECK(exited_with(status, 0));
  // The flood really met the store: more connections than the job may open files, and the
  // store closed some (replaced, or past their handshake deadline).
  CHECK(opened >= kFloodConnections);
  CHECK(closed_by_server > 0);
  // Same parameters, byte for byte.
  CHECK(file_bytes(dir.file("flooded.safetensors")) == file_bytes(dir.file("quiet.safetensors")));
  CHECK(!file_bytes(dir.file("quiet.safetensors")).empty());
}
