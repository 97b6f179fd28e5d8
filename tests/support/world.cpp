#include "support/world.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <stdexcept>

namespace nanoddp::testing {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("bind/getsockname failed");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::vector<ProcessResult> run_world(const std::vector<std::string>& argv, int world_size,
                                     const ProcessOptions& options) {
  const std::string port = std::to_string(free_port());
  std::vector<std::future<ProcessResult>> futures;
  for (int rank = 0; rank < world_size; ++rank) {
    ProcessOptions rank_options = options;
    rank_options.env["RANK"] = std::to_string(rank);
    rank_options.env["WORLD_SIZE"] = std::to_string(world_size);
    rank_options.env["LOCAL_RANK"] = std::to_string(rank);
    rank_options.env["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    rank_options.env["MASTER_ADDR"] = "127.0.0.1";
    rank_options.env["MASTER_PORT"] = port;
    futures.push_back(std::async(std::launch::async,
                                 [argv, rank_options] { return run_process(argv, rank_options); }));
  }
  std::vector<ProcessResult> results;
  for (auto& f : futures) results.push_back(f.get());
  return results;
}

std::string describe(const std::vector<ProcessResult>& results) {
  std::string out;
  for (std::size_t r = 0; r < results.size(); ++r) {
    const ProcessResult& p = results[r];
    out += "---- rank " + std::to_string(r) + ": " +
           (p.timed_out  ? std::string("TIMED OUT")
            : p.signaled ? "signal " + std::to_string(p.signal)
                         : "exit " + std::to_string(p.exit_code)) +
           "\n" + p.output + "\n";
  }
  return out;
}

}  // namespace nanoddp::testing
