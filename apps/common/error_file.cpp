#include "common/error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

namespace nanoddp::common {

namespace {

// A file larger than this is not one a worker wrote to say why it failed.
constexpr std::size_t kMaxRecordBytes = 256 * 1024;

bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::string warn_text(const std::string& path, const char* what) {
  return fmt::format(
      "nanoddp: warning: cannot write the error file '{}' the launcher asked for "
      "({}: {}); its summary may name another rank as the one that failed first\n",
      path, what, std::strerror(errno));
}

}  // namespace

void record_failure(const std::string& message, bool caused_by_peer, std::optional<int> peer_rank) {
  const char* ours = std::getenv("NANODDP_ERROR_FILE");
  const char* torchrun = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (torchrun == nullptr || *torchrun == '\0') return;
  // nanoddp-run sets both to one path. A NANODDP_ERROR_FILE that differs was inherited from
  // elsewhere (torchrun started from a shell or job that had it): torchrun's own file wins.
  const bool under_nanoddp_run = ours != nullptr && std::string(ours) == torchrun;
  if (caused_by_peer && !under_nanoddp_run) return;
  const std::string path = torchrun;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now).count();
  nlohmann::ordered_json record = {
      // torchelastic's layout: its summary shows message.message (py_callstack when present).
      {"message", {{"message", message}, {"extraInfo", {{"timestamp", std::to_string(seconds)}}}}},
      {"nanoddp",
       {{"time_ns", ns},
        {"caused_by_peer", caused_by_peer},
        {"peer_rank", peer_rank ? nlohmann::ordered_json(*peer_rank) : nlohmann::ordered_json()}}}};
  // Written whole under another name, then renamed: a launcher never reads half a record (the
  // worker may be killed while it writes).
  const std::string text = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string staged = fmt::format("{}.{}.tmp", path, ::getpid());
  const int fd =
      ::open(staged.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    std::fputs(warn_text(path, "open").c_str(), stderr);
    return;
  }
  const bool written = write_all(fd, text);
  ::close(fd);
  if (!written || ::rename(staged.c_str(), path.c_str()) != 0) {
    std::fputs(warn_text(path, written ? "rename" : "write").c_str(), stderr);
    ::unlink(staged.c_str());
  }
}

std::optional<FailureRecord> read_failure_record(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > kMaxRecordBytes) break;
  }
  ::close(fd);
  if (text.size() > kMaxRecordBytes) return std::nullopt;
  const nlohmann::json data = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!data.is_object() || !data.contains("message")) return std::nullopt;
  FailureRecord record;
  const nlohmann::json& message = data["message"];
  std::int64_t seconds = 0;
  // torchelastic's two layouts: {"message": "...", "timestamp": N} and
  // {"message": {"message": "...", "extraInfo": {"timestamp": "N"}}}.
  const auto to_seconds = [](const nlohmann::json& v) -> std::int64_t {
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_string()) return std::strtoll(v.get<std::string>().c_str(), nullptr, 10);
    return 0;
  };
  if (message.is_string()) {
    record.message = message.get<std::string>();
    if (data.contains("timestamp")) seconds = to_seconds(data["timestamp"]);
  } else if (message.is_object()) {
    if (message.contains("message") && message["message"].is_string()) {
      record.message = message["message"].get<std::string>();
    }
    if (message.contains("extraInfo") && message["extraInfo"].is_object() &&
        message["extraInfo"].contains("timestamp")) {
      seconds = to_seconds(message["extraInfo"]["timestamp"]);
    }
  } else {
    return std::nullopt;
  }
  record.time_ns = seconds * 1'000'000'000;
  if (data.contains("nanoddp") && data["nanoddp"].is_object()) {
    const nlohmann::json& ours = data["nanoddp"];
    if (ours.contains("time_ns") && ours["time_ns"].is_number_integer()) {
      record.time_ns = ours["time_ns"].get<std::int64_t>();
    }
    if (ours.contains("caused_by_peer") && ours["caused_by_peer"].is_boolean()) {
      record.caused_by_peer = ours["caused_by_peer"].get<bool>();
    }
    if (ours.contains("peer_rank") && ours["peer_rank"].is_number_integer()) {
      const auto rank = ours["peer_rank"].get<std::int64_t>();
      if (rank >= 0 && rank < (std::int64_t{1} << 30)) record.peer_rank = static_cast<int>(rank);
    }
  }
  return record;
}

}  // namespace nanoddp::common
