#include "elastic.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "free_port.h"
#include "nanoddp/comm/store.h"
#include "nanoddp/comm/unique_fd.h"
#include "nanoddp/nn/file_io.h"
#include "output.h"
#include "report.h"
#include "signals.h"

namespace nanoddp::run {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  Console::err().write("nanoddp-run: " + fmt::format(format, std::forward<Args>(args)...) + "\n",
                       false);
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

// How often a launcher beats and looks at the others: often enough that the bound is set by
// the timeout, rarely enough that a thousand nodes do not flood the store.
std::chrono::milliseconds heartbeat_interval(const RunOptions& o) {
  return std::clamp(millis(o.heartbeat_timeout_s / 5), std::chrono::milliseconds(100),
                    std::chrono::milliseconds(1000));
}

// A launcher waiting for a round beats every pass of its wait (kWaitPass plus its store calls).
// A beat that stood still for ten passes (at least kStaleWait) is not counted when a round
// closes, so a waiter that dies just before the close is not taken in (it would be found lost
// only T into the round, a restart used); it is left out once it has been silent for T.
constexpr std::chrono::milliseconds kWaitPass{100};
constexpr double kStaleWait = 1.0;  // seconds

struct Endpoint {
  std::string host;
  int port = 0;
};

Endpoint parse_endpoint(const std::string& text) {  // checked by parse_options
  const auto colon = text.rfind(':');
  return {text.substr(0, colon), std::stoi(text.substr(colon + 1))};
}

addrinfo* resolve(const std::string& host, int type) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = type;
  addrinfo* result = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "1", &hints, &result); rc != 0) {
    throw std::runtime_error(
        fmt::format("--rdzv-endpoint: cannot resolve '{}': {}", host, ::gai_strerror(rc)));
  }
  return result;
}

// The address the other nodes reach this one at: the source address the kernel picks towards
// the endpoint (connecting a UDP socket sends nothing).
std::string local_address_towards(const std::string& host) {
  addrinfo* info = resolve(host, SOCK_DGRAM);
  comm::UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in local{};
  socklen_t size = sizeof(local);
  const bool ok = fd && ::connect(fd.get(), info->ai_addr, info->ai_addrlen) == 0 &&
                  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &size) == 0;
  ::freeaddrinfo(info);
  if (!ok) throw std::runtime_error(fmt::format("--rdzv-endpoint: no route to '{}'", host));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

// Whether `host` is one of this machine's addresses (it can be bound to).
bool is_local_address(const std::string& host) {
  addrinfo* info = resolve(host, SOCK_STREAM);
  comm::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  auto* address = reinterpret_cast<sockaddr_in*>(info->ai_addr);
  address->sin_port = 0;
  const bool local = fd && ::bind(fd.get(), info->ai_addr, info->ai_addrlen) == 0;
  ::freeaddrinfo(info);
  return local;
}

// Writes `value` at `key` unless a value is there already (the first writer wins); returns the
// value there afterwards, this one or the first writer's.
std::string set_once(comm::Store& store, const std::string& key, const std::string& value) {
  const std::vector<std::uint8_t> bytes(value.begin(), value.end());
  const comm::Bytes stored = store.compare_set(key, {}, bytes);
  return std::string(stored.begin(), stored.end());
}

std::string key(int round, const std::string& name) {
  return fmt::format("r{}/{}", round, name);
}

// Reads many keys in one store request: a launcher looks at every node at times (a standby
// watching a round, a round that has ended), and one round trip per key would make the store's
// load grow as the square of the nodes. Absent keys read as empty text; none of these values is
// empty.
std::vector<std::string> read_many(comm::Store& store, const std::vector<std::string>& keys) {
  std::vector<std::string> texts;
  texts.reserve(keys.size());
  for (const std::optional<comm::Bytes>& value : store.try_get_many(keys)) {
    texts.push_back(value ? std::string(value->begin(), value->end()) : std::string());
  }
  return texts;
}

struct Member {
  std::string address;
  int nproc = 0;
};

// A closed round's members: the arrival indices of the nodes it takes, in node-rank order
// ("closed" holds them separated by spaces; the node rank is the position in this list).
std::vector<int> parse_members(const std::string& text) {
  std::vector<int> members;
  std::istringstream in(text);
  for (int index; in >> index;) members.push_back(index);
  return members;
}

struct Round {
  int number = 0;
  int node_rank = 0;
  std::vector<Member> members;
  int master_port = 0;
  int restarts_used = 0;
  std::string token;
};

// The end of a round, as written in its "end" key.
struct End {
  // 'F' failure, 'U' a worker's exit code 2 (a usage error, unless the verdict finds a crash or
  // a lost node behind it), 'M' membership change, 'S' success; 'X' the store was lost (local)
  char kind = 0;
  std::string reason;
};

End parse_end(const std::string& text) {
  return text.size() >= 2 ? End{text[0], text.substr(2)} : End{'F', text};
}

class JobEnds : public std::runtime_error {  // the job ends with this exit code and message
 public:
  JobEnds(int exit_code, const std::string& message)
      : std::runtime_error(message), code(exit_code) {}
  int code;
};

// The settings every launcher of a job must share: each launcher applies them to decisions that
// must come out the same on every node. --nnodes: when a round closes and whether a newcomer
// ends it; --max-restarts: whether a failed round is followed by another (a launcher with fewer
// would leave while the others wait for it); --heartbeat-timeout: when a silent node is lost,
// and how often each beats (a node with a longer timeout beats too rarely for one with a
// shorter); --rdzv-last-call: when a round closes; PROGRAM and ARGS: the workers of one job run
// one program (a stranger's workers would fail the set-up on every rank). What may differ is
// this node's own business: --nproc-per-node (each node's count is recorded, the world is their
// sum), --grace-period, --log-dir, --rdzv-join-timeout.
struct Setting {
  std::string flag;
  std::string value;
};

// One shell word: plain when it can be, else single-quoted (so that the text of a command
// names its words exactly, and equal texts are equal commands).
std::string shell_word(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "_./:=,+-@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (const char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  quoted += '\'';
  return quoted;
}

std::vector<Setting> job_settings(const RunOptions& o) {
  std::string command;
  for (const std::string& word : o.command) {
    if (!command.empty()) command += ' ';
    command += shell_word(word);
  }
  return {{"--nnodes", fmt::format("{}:{}", o.min_nodes, o.nnodes)},
          {"--max-restarts", std::to_string(o.max_restarts)},
          {"--heartbeat-timeout", fmt::format("{}", o.heartbeat_timeout_s)},
          {"--rdzv-last-call", fmt::format("{}", o.last_call_s)},
          {"PROGRAM and ARGS", command}};
}

// "<flag>\t<bytes>\t<value>\n" per setting: values may hold any byte.
std::string encode_settings(const std::vector<Setting>& settings) {
  std::string text;
  for (const Setting& s : settings)
    text += fmt::format("{}\t{}\t{}\n", s.flag, s.value.size(), s.value);
  return text;
}

std::vector<Setting> decode_settings(const std::string& text) {
  std::vector<Setting> settings;
  for (std::size_t at = 0; at < text.size();) {
    const auto tab = text.find('\t', at);
    const auto tab2 = tab == std::string::npos ? tab : text.find('\t', tab + 1);
    if (tab2 == std::string::npos) break;
    const std::size_t size = std::stoul(text.substr(tab + 1, tab2 - tab - 1));
    settings.push_back({text.substr(at, tab - at), text.substr(tab2 + 1, size)});
    at = tab2 + 1 + size + 1;
  }
  return settings;
}

// "--nnodes: the job has 1:2, this launcher 2:2; ..." for every setting that differs.
std::string differences(const std::vector<Setting>& job, const std::vector<Setting>& mine) {
  std::string text;
  for (const Setting& m : mine) {
    const auto it =
        std::find_if(job.begin(), job.end(), [&](const Setting& j) { return j.flag == m.flag; });
    const std::string theirs = it == job.end() ? std::string("(not recorded)") : it->value;
    if (it != job.end() && it->value == m.value) continue;
    text += fmt::format("{}{}: the job has {}, this launcher {}", text.empty() ? "" : "; ", m.flag,
                        nn::excerpt(theirs, 300), nn::excerpt(m.value, 300));
  }
  return text;
}

// Arrives at round `number`: returns the arrival index (the node rank, if the round takes it).
int arrive(comm::Store& store, int number, const std::string& address, int nproc) {
  const int index = static_cast<int>(store.add(key(number, "arrivals"), 1)) - 1;
  store.set(key(number, fmt::format("node/{}", index)), fmt::format("{} {}", address, nproc));
  return index;
}

// The restarts used before round `number` (from its record, written by its node 0).
int restarts_before(comm::Store& store, int number) {
  const std::string record = store.get_string(key(number, "record"));
  return std::stoi(record.substr(record.find(' ') + 1));
}

// The restarts round `number` starts with: those before the last round, plus one if that round
// failed. A 'U' round reaches a next one only when its verdict found a crash or a lost node.
int restarts_at(comm::Store& store, int number) {
  if (number == 0) return 0;
  const char kind = parse_end(store.get_string(key(number - 1, "end"))).kind;
  return restarts_before(store, number - 1) + (kind == 'F' || kind == 'U' ? 1 : 0);
}

// A round's record: "<workers' store port> <restarts used> <workers' store secret>", written
// once by its node 0 right after the round closes. One whose node 0 died (or froze) before
// writing it is written by whoever finds it missing, with port 0: that round never started,
// and it ends as failed (a restart used, as for a node lost in a running round).
constexpr int kNeverStarted = 0;

// Whether round `number`, which has ended, was the job's last: the job finished (S), failed
// with no restarts left (F), or failed on a usage error (U whose verdict is "usage"). Then
// returns why, and whether the job succeeded.
struct Over {
  bool succeeded = false;
  std::string why;
};
std::optional<Over> job_over(comm::Store& store, int number, const RunOptions& o) {
  const End end = parse_end(store.get_string(key(number, "end")));
  if (end.kind == 'S') return Over{true, fmt::format("round {}: {}", number, end.reason)};
  if (end.kind != 'F' && end.kind != 'U') return std::nullopt;
  if (end.kind == 'U') {
    if (!store.check({key(number, "verdict")})) return std::nullopt;  // not decided yet
    if (store.get_string(key(number, "verdict")) == "usage") {
      return Over{false, fmt::format("round {} ended on a usage error: {}", number, end.reason)};
    }
  }
  if (store.check({key(number, "record")}) && restarts_before(store, number) >= o.max_restarts) {
    return Over{false,
                fmt::format("round {} failed with no restarts left: {}", number, end.reason)};
  }
  return std::nullopt;
}

// Where a launcher that has not been a member of the job yet arrives: the round forming now.
// It is refused (JobEnds, exit 1), touching nothing, when the job is over. Its arrival ends a
// running round smaller than MAX ("M|", the scale-up); while a round of MAX nodes runs it waits
// as a standby (as torchrun's agent does), taken in at the next round a failure or a lost node
// starts, for at most --rdzv-join-timeout.
int first_round(comm::Store& store, const RunOptions& o) {
  int last = -1;  // the last round that closed
  while (store.check({key(last + 1, "closed")})) ++last;
  if (last < 0) return 0;
  if (store.check({key(last, "end")})) {
    if (const std::optional<Over> over = job_over(store, last, o)) {
      throw JobEnds(1, fmt::format("job '{}' is over ({}); this launcher did not take part. A "
                                   "new job can use this --rdzv-endpoint once the launcher "
                                   "serving its store has exited",
                                   o.rdzv_id, over->why));
    }
    return last + 1;  // the next round forms: a replacement or an extra node is welcome
  }
  const int size = static_cast<int>(parse_members(store.get_string(key(last, "closed"))).size());
  if (size >= o.nnodes) {
    say("job '{}' is full: its round {} runs {} node(s), the most --nnodes {}:{} allows; this "
        "launcher waits as a standby for the next round (one starts when a node fails or is "
        "lost), for at most --rdzv-join-timeout {} s",
        o.rdzv_id, last, size, o.min_nodes, o.nnodes, o.join_timeout_s);
  }
  return last + 1;
}

// The address of node `node_rank` of a closed round (its "node/K" entry is "<address> <nproc>").
std::string node_address(comm::Store& store, int number, const std::vector<int>& members,
                         int node_rank) {
  const std::string text = store.get_string(
      key(number, fmt::format("node/{}", members[static_cast<std::size_t>(node_rank)])));
  return text.substr(0, text.rfind(' '));
}

// Ends round `number` before it started, if it has no record yet (its node 0 died between the
// close and the record), and returns the record, which says whether it started.
std::string record_or_end(comm::Store& store, int number, const std::vector<int>& members,
                          const std::string& why) {
  const std::string record =
      set_once(store, key(number, "record"),
               fmt::format("{} {} -", kNeverStarted, restarts_at(store, number)));
  if (std::stoi(record) == kNeverStarted) {
    set_once(store, key(number, "end"),
             fmt::format("F|node 0 ({}) did not start round {}: {}",
                         node_address(store, number, members, 0), number, why));
  }
  return record;
}

// Round `number`'s record, once it closed with this node as node `node_rank`. Node 0 writes it
// (the first writer wins: another launcher may have found it missing and ended the round); the
// others wait for it at most the heartbeat timeout (their store client's): node 0 writes it a
// store call after the close, so one that has not by then left, died or froze in between.
std::string take_record(comm::Store& store, int number, int node_rank,
                        const std::vector<int>& members, const std::string& address) {
  const std::string record_key = key(number, "record");
  if (node_rank == 0) {
    // The workers' store secret: a fresh one per round (after the user's, if set).
    const char* user_token = std::getenv("NANODDP_STORE_TOKEN");
    std::random_device random;
    const std::string token =
        fmt::format("{}{:08x}{:08x}{:08x}", user_token ? std::string(user_token) + "/" : "",
                    random(), random(), random());
    const std::string record = set_once(
        store, record_key,
        fmt::format("{} {} {}", find_free_port(address), restarts_at(store, number), token));
    if (std::stoi(record) == kNeverStarted) {  // another launcher found it missing: too late
      return record_or_end(store, number, members, "it was found lost before it published it");
    }
    return record;
  }
  const std::string why =
      "it left or died after the round closed, before it published the round's record";
  std::string record;
  try {
    record = store.get_string(record_key);
  } catch (const comm::StoreError&) {
    // Not the store's own text, which points at NANODDP_TIMEOUT_S: this wait is the heartbeat's.
    return record_or_end(store, number, members,
                         fmt::format("{} (waited --heartbeat-timeout {} s for it)", why,
                                     std::chrono::duration<double>(store.timeout()).count()));
  }
  // Found "never started": its writer ends the round next, but may itself die in between.
  if (std::stoi(record) == kNeverStarted) return record_or_end(store, number, members, why);
  return record;
}

// A round watched from outside, by a standby waiting for the next: whether every one of its
// nodes has beaten nothing new for the heartbeat timeout, as seen by this launcher's clock. A
// round's own nodes end it when one of them is lost; when all are (killed together, or node 0
// died before its record and took the others' wait with it), nobody would, and the standby
// would wait out its --rdzv-join-timeout while the job is already dead.
class SilentRound {
 public:
  bool all_silent(comm::Store& store, int number, std::size_t nodes, double timeout_s) {
    std::vector<std::string> keys;
    for (std::size_t k = 0; k < nodes; ++k) keys.push_back(key(number, fmt::format("hb/{}", k)));
    const std::vector<std::string> beats = read_many(store, keys);
    const auto now = Clock::now();
    beats_.resize(nodes);
    bool silent = true;
    for (std::size_t k = 0; k < nodes; ++k) {
      const std::string& value = beats[k];
      if (!beats_[k].since || value != beats_[k].value) beats_[k] = {value, now};
      if (std::chrono::duration<double>(now - *beats_[k].since).count() <= timeout_s) {
        silent = false;
      }
    }
    return silent;
  }

 private:
  struct Beat {
    std::string value;
    std::optional<Clock::time_point> since;  // when first read, or last moved
  };
  std::vector<Beat> beats_;
};

// "; of round R's nodes, node 1 (ADDR) left, node 2 (ADDR) was lost" for the nodes of ended
// round `number` that will not come back by themselves; empty when none did.
std::string departed(comm::Store& store, int number) {
  if (!store.check({key(number, "closed")})) return {};
  const std::vector<int> members = parse_members(store.get_string(key(number, "closed")));
  std::vector<std::string> keys;
  for (std::size_t k = 0; k < members.size(); ++k) {
    keys.push_back(key(number, fmt::format("left/{}", k)));
    keys.push_back(key(number, fmt::format("lost/{}", k)));
  }
  const std::vector<std::string> texts = read_many(store, keys);
  std::string text;
  for (std::size_t k = 0; k < members.size(); ++k) {
    const bool left = !texts[2 * k].empty(), lost = !texts[2 * k + 1].empty();
    if (!left && !lost) continue;
    text += fmt::format("{}node {} ({}) {}", text.empty() ? "" : ", ", k,
                        node_address(store, number, members, static_cast<int>(k)),
                        lost ? "was lost" : "left");
  }
  return text.empty() ? text : fmt::format("; of round {}'s nodes, {}", number, text);
}

// Joins round `number` (or, arriving after it closed, the next ones) and returns it once node 0
// has published its record. `arrived`: the index this node already has in round `number`.
// `member`: whether this launcher took part in a round already (a newcomer that finds the job
// over is refused, exit 1; one that finds it full waits as a standby, see first_round()).
Round join(comm::Store& store, int number, const std::string& address, const RunOptions& o,
           std::optional<int> arrived, SignalInbox& signals, bool member) {
  const auto started = Clock::now();
  // At least two intervals: the survivors of the last round arrive within one of each other.
  const auto last_call =
      std::max<std::chrono::milliseconds>(millis(o.last_call_s), 2 * heartbeat_interval(o));
  if (!member && !arrived) number = first_round(store, o);
  for (;; ++number) {
    const int index = arrived ? *arrived : arrive(store, number, address, o.nproc_per_node);
    arrived.reset();
    int seen = 0;
    auto last_arrival = Clock::now();
    // Who is still waiting: each waiting launcher beats "wait/<index>" every pass of this loop,
    // and one stopped by a signal says "gone/<index>". A withdrawn arrival is not taken in, nor
    // one whose beat this launcher has watched stand still for --heartbeat-timeout: a node that
    // joined and left (Ctrl-C, a crash, a freeze) must not be waited for, or counted towards
    // MAX. Liveness is judged from what this launcher has watched, never from one reading: a
    // launcher that has just arrived has seen each beat once, and cannot tell a live waiter
    // from one that died a minute ago until the beat moves or T passes, so until then it does
    // not close the round. Nor while a beat it counts has stood still for more than `stale`
    // (ten passes of a wait): that waiter may have died just now. One that has not beaten yet
    // is a survivor of the last round still stopping its workers: it counts.
    std::int64_t beat = 0;
    struct Watch {
      std::string value;          // the beat last read
      Clock::time_point since{};  // when it was first read, or last moved
      bool moved = false;         // it has moved since this launcher first read it
    };
    std::vector<Watch> watches;
    bool undecided = false;     // some arrival's liveness is not known yet
    double stale = kStaleWait;  // ten of this launcher's longest passes, at least kStaleWait
    const auto live_arrivals = [&](int count) {
      std::vector<int> live;
      undecided = false;
      watches.resize(static_cast<std::size_t>(count));
      std::vector<std::string> keys;
      for (int k = 0; k < count; ++k) {
        keys.push_back(key(number, fmt::format("gone/{}", k)));
        keys.push_back(key(number, fmt::format("wait/{}", k)));
      }
      const std::vector<std::string> texts = read_many(store, keys);
      const auto now = Clock::now();
      for (int k = 0; k < count; ++k) {
        Watch& w = watches[static_cast<std::size_t>(k)];
        if (k != index) {
          if (!texts[2 * static_cast<std::size_t>(k)].empty()) continue;  // gone
          const std::string& value = texts[2 * static_cast<std::size_t>(k) + 1];
          if (value != w.value) {
            w.moved = !w.value.empty();
            w.value = value;
            w.since = now;
          }
          const double silent = std::chrono::duration<double>(now - w.since).count();
          if (!w.value.empty() && silent > o.heartbeat_timeout_s) continue;  // left or frozen
          // Seen once only, or silent for more than a few beats (it may have died just now):
          // not counted yet, nor left out; the round waits until the beat moves or T passes.
          if (!w.value.empty() && (!w.moved || silent > stale)) undecided = true;
        }
        live.push_back(k);
      }
      return live;
    };
    std::optional<Clock::time_point> last_pass;
    SilentRound silent_previous;  // the round before, while it runs (this launcher a standby)
    // A wait for too few nodes is said (what for, until when) once nobody could merely be
    // slow, then every minute: it may last --rdzv-join-timeout (600 s by default), and an
    // outside operator found a launcher waiting silently for a node that had exited for good.
    auto next_report = Clock::now() + millis(o.heartbeat_timeout_s) + last_call;
    while (!store.check({key(number, "closed")})) {
      const auto pass = Clock::now();
      if (last_pass) {
        stale = std::max(stale, 10 * std::chrono::duration<double>(pass - *last_pass).count());
      }
      last_pass = pass;
      for (const int signo : signals.drain()) {  // no workers run now: a signal ends the wait
        if (signo != SIGCHLD) {
          store.set(key(number, fmt::format("gone/{}", index)), "1");
          throw JobEnds(128 + signo, fmt::format("got {} while waiting for round {} to form",
                                                 signal_name(signo), number));
        }
      }
      store.set(key(number, fmt::format("wait/{}", index)), std::to_string(++beat));
      // Whether the round before has ended, read once: the job's end is judged on that same
      // reading. (Two readings let an end written between them close a new round after a job
      // that had just finished, and its workers ran again.) A 'U' end is settled only with
      // its verdict: until then the job may be over, and no round closes.
      const bool ended = number == 0 || store.check({key(number - 1, "end")});
      bool settled = ended;
      if (number > 0 && ended) {
        if (const std::optional<Over> over = job_over(store, number - 1, o)) {
          // A newcomer did not take part: it did not succeed (exit 1) whatever the job did.
          throw JobEnds(over->succeeded && member ? 0 : 1,
                        fmt::format("job '{}' is over ({}){}", o.rdzv_id, over->why,
                                    member ? "" : "; this launcher did not take part"));
        }
        settled = parse_end(store.get_string(key(number - 1, "end"))).kind != 'U' ||
                  store.check({key(number - 1, "verdict")});
      }
      if (!ended && store.check({key(number - 1, "closed")})) {
        const std::vector<int> previous =
            parse_members(store.get_string(key(number - 1, "closed")));
        if (silent_previous.all_silent(store, number - 1, previous.size(), o.heartbeat_timeout_s)) {
          std::string nodes;
          for (int k = 0; k < static_cast<int>(previous.size()); ++k) {
            nodes += fmt::format("{}{}", k == 0 ? "" : ", ",
                                 node_address(store, number - 1, previous, k));
          }
          const std::string why = fmt::format(
              "every node of round {} ({}) is lost: no heartbeat for {} s, seen by a waiting "
              "launcher",
              number - 1, nodes, o.heartbeat_timeout_s);
          if (std::stoi(record_or_end(store, number - 1, previous, why)) != kNeverStarted) {
            set_once(store, key(number - 1, "end"), "F|" + why);
          }
          say("{}: round {} ends, as failed", why, number - 1);
        }
      }
      const int count = static_cast<int>(store.add(key(number, "arrivals"), 0));
      if (count != seen) {
        seen = count;
        last_arrival = Clock::now();
      }
      std::vector<int> live = live_arrivals(count);
      const int size = std::min(static_cast<int>(live.size()), o.nnodes);
      if (settled && size < o.min_nodes && Clock::now() >= next_report) {
        next_report = Clock::now() + 60s;
        say("round {}: waiting for {} more node(s) (--nnodes {}:{}; {} here){}: {}, until "
            "--rdzv-join-timeout {} s ({:.0f} s left)",
            number, o.min_nodes - size, o.min_nodes, o.nnodes, size,
            number > 0 ? departed(store, number - 1) : std::string(),
            number > 0 ? "a replacement, or a node restarted with the same --rdzv-endpoint and "
                         "--rdzv-id"
                       : "the job's other launchers (the same --rdzv-endpoint and --rdzv-id)",
            o.join_timeout_s,
            o.join_timeout_s - std::chrono::duration<double>(Clock::now() - started).count());
      }
      if (settled && !undecided &&
          (size >= o.nnodes || (size >= o.min_nodes && Clock::now() - last_arrival >= last_call))) {
        live.resize(static_cast<std::size_t>(size));
        std::string members;
        for (const int k : live) members += fmt::format("{}{}", members.empty() ? "" : " ", k);
        set_once(store, key(number, "closed"), members);
        break;
      }
      if (Clock::now() - started > millis(o.join_timeout_s)) {
        // Withdrawn, so that the round this launcher waited for does not wait for it in turn.
        store.set(key(number, fmt::format("gone/{}", index)), "1");
        if (!ended) {  // a standby: the round before runs on, full
          throw JobEnds(
              1, fmt::format("job '{}': waited --rdzv-join-timeout {} s as a standby; "
                             "its round {} runs on with the most nodes --nnodes {}:{} "
                             "allows. This launcher leaves, and the job goes on",
                             o.rdzv_id, o.join_timeout_s, number - 1, o.min_nodes, o.nnodes));
        }
        if (size >= o.min_nodes) {  // enough nodes, but the round had not closed yet
          throw JobEnds(
              1, fmt::format("job '{}': --rdzv-join-timeout {} s passed just as round {} was "
                             "forming ({} node(s) had arrived, enough for --nnodes {}:{}). "
                             "This launcher leaves; the round forms without it",
                             o.rdzv_id, o.join_timeout_s, number, size, o.min_nodes, o.nnodes));
        }
        throw JobEnds(1, fmt::format("round {}: {} of at least {} node(s) joined within "
                                     "--rdzv-join-timeout {} s",
                                     number, size, o.min_nodes, o.join_timeout_s));
      }
      std::this_thread::sleep_for(kWaitPass);
    }
    const std::vector<int> members = parse_members(store.get_string(key(number, "closed")));
    const int size = static_cast<int>(members.size());
    const auto position = std::find(members.begin(), members.end(), index);
    if (position == members.end()) {
      // Full (MAX nodes) before this launcher was taken in: it stays a standby for the next.
      say("round {} closed with {} node(s) without this one: joining round {}", number, size,
          number + 1);
      continue;
    }
    const int node_rank = static_cast<int>(position - members.begin());
    member = true;
    Round round{.number = number, .node_rank = node_rank};
    const std::string record = take_record(store, number, node_rank, members, address);
    if (std::stoi(record) == kNeverStarted) {
      // Node 0 died between the close and its record: the round ended before it started. The
      // survivors go on to the next round (or end, with no restarts left) as after any failure.
      say("round {} ended before it started: {}", number,
          parse_end(store.get_string(key(number, "end"))).reason);
      continue;
    }
    char token[512] = {};
    std::sscanf(record.c_str(), "%d %d %511s", &round.master_port, &round.restarts_used, token);
    round.token = token;
    for (const int k : members) {
      const std::string text = store.get_string(key(number, fmt::format("node/{}", k)));
      const auto space = text.rfind(' ');
      round.members.push_back({text.substr(0, space), std::stoi(text.substr(space + 1))});
    }
    return round;
  }
}

// Whether a round's end names a failure that another rank's caused (a local worker's "after a
// communication failure" or "because rank R failed", launcher.cpp's cause_text): the rank that
// failed on its own is elsewhere, perhaps on a node that died whole and will never say so.
bool is_consequence(const std::string& reason) {
  static const std::regex pattern(
      ", (after a communication failure|because another rank failed|because rank [0-9]+ failed)$");
  return std::regex_search(reason, pattern);
}

// Beats for this node and watches the others during one round, on a thread of its own with its
// own store client (a blocking call on the main thread's client must not delay a beat). After a
// round that ended on a consequence, it lingers into the next round (linger()) until every other
// node has been seen alive or lost, and names a lost node as the cause.
class Monitor {
 public:
  Monitor(const comm::TcpStoreOptions& store_options, const std::string& prefix, const Round& round,
          const RunOptions& o, const std::string& address)
      : address_(address),
        round_(round),
        o_(o),
        store_(prefix, std::make_shared<comm::TcpStore>(store_options)),
        thread_([this] { loop(); }) {}
  ~Monitor() {
    {
      const std::lock_guard lock(mutex_);
      quit_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Ends this round's workers (run_round's RoundSpec::stop).
  StopRequest& stop() { return stop_; }
  // A local worker failed; `usage`: with exit code 2 (a 'U' end, see usage_verdict()).
  void local_failure(const std::string& what, bool usage) { publish(usage ? 'U' : 'F', what); }
  // A local worker failed because of another rank: another node's verdict may follow at once,
  // so the round's end is read every kWaitPass instead of every interval until the round ends.
  void hurry() {
    {
      const std::lock_guard lock(mutex_);
      hurry_ = poke_ = true;
    }
    changed_.notify_all();
  }
  // The main thread has moved on to the next round: from now on this monitor only watches for
  // a node of its round lost (to name it as the cause of a consequence end), and its loop ends
  // once every other node is settled, or T + 2 intervals after the end (see lost_nodes()).
  void linger() {
    {
      const std::lock_guard lock(mutex_);
      lingering_ = poke_ = true;
    }
    changed_.notify_all();
  }
  void local_done() {
    const std::lock_guard lock(mutex_);
    done_ = true;
  }
  // This launcher will not take part in another round (it was stopped by a signal).
  void leave() {
    const std::lock_guard lock(mutex_);
    leaving_ = true;
  }
  // The arrival index at the next round, taken as soon as this round's end was seen, so that
  // every survivor arrives within an interval of the others, however long its workers take to
  // stop (otherwise a slow one may arrive after the next round closed without it).
  std::optional<int> next_index() {
    const std::lock_guard lock(mutex_);
    return next_index_;
  }
  // Ends the round (unless it has ended already), at once: the loop wakes to write it.
  void publish(char kind, const std::string& reason) {
    {
      const std::lock_guard lock(mutex_);
      if (pending_) return;
      pending_ = fmt::format("{}|{}", kind, reason);
    }
    changed_.notify_all();
  }

  // This node's workers have all ended (run_round returned): written as "over/K", after
  // "fail/K" when a local worker failed.
  void local_over() {
    {
      const std::lock_guard lock(mutex_);
      over_ = true;
    }
    changed_.notify_all();
  }

  // After a 'U' end (a worker exited 2): whether it was a usage error, the same on every node
  // (the first verdict written wins). nanoddp-train also exits 2 when its set-up fails because
  // a peer died, so an exit code 2 is a usage error only if no node of the round reported
  // another failure of its own ("fail/K") and none was lost. That is known once every other
  // node's workers have ended ("over/K", written after "fail/K"), or it left, finished or was
  // lost: waited for at most max(T, --grace-period) + 3 intervals; a node still unsettled then
  // counts as a failure (a restart, as before exit code 2 was told apart).
  bool usage_verdict(comm::Store& store) {
    bool usage = true;
    {
      std::unique_lock lock(mutex_);
      const auto until = Clock::now() +
                         millis(std::max(o_.heartbeat_timeout_s, o_.grace_period_s)) +
                         3 * heartbeat_interval(o_);
      changed_.wait_until(lock, until, [this] {
        for (std::size_t k = 0; k < round_.members.size(); ++k) {
          if (static_cast<int>(k) != round_.node_rank && !ended_[k]) return false;
        }
        return true;
      });
      for (std::size_t k = 0; k < round_.members.size(); ++k) {
        if (static_cast<int>(k) != round_.node_rank && (!ended_[k] || lost_[k])) usage = false;
      }
    }
    for (std::size_t k = 0; k < round_.members.size() && usage; ++k) {
      const std::string fail = key(round_.number, fmt::format("fail/{}", k));
      if (store.check({fail}) && store.get_string(fail) == "F") usage = false;
    }
    return set_once(store, key(round_.number, "verdict"), usage ? "usage" : "transient") == "usage";
  }

  // Blocks until the round has ended (read from the store) or the store failed.
  End wait_end() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return end_.has_value(); });
    return *end_;
  }

  // After a failed round: the nodes lost, once each other node has either beaten since the end
  // (alive), left, or been silent for the timeout (lost); waits at most T + 2 intervals.
  std::vector<int> lost_nodes() {
    std::unique_lock lock(mutex_);
    const auto until = Clock::now() + millis(o_.heartbeat_timeout_s) + 2 * heartbeat_interval(o_);
    changed_.wait_until(lock, until, [this] {
      for (std::size_t k = 0; k < round_.members.size(); ++k) {
        if (static_cast<int>(k) != round_.node_rank && !settled_[k]) return false;
      }
      return true;
    });
    std::vector<int> lost;
    for (std::size_t k = 0; k < lost_.size(); ++k) {
      if (lost_[k]) lost.push_back(static_cast<int>(k));
    }
    return lost;
  }

 private:
  void loop();

  const std::string address_;
  const Round round_;  // a copy: the monitor may outlive the main thread's round (linger())
  const RunOptions& o_;
  StopRequest stop_;
  comm::PrefixStore store_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool quit_ = false;
  bool done_ = false;
  bool leaving_ = false;
  bool hurry_ = false;
  bool lingering_ = false;
  bool poke_ = false;  // hurry() or linger() came: the loop's wait ends
  std::optional<int> next_index_;
  std::optional<std::string> pending_;
  bool published_ = false;  // pending_ is in the store
  bool over_ = false;       // local_over() was called
  bool over_written_ = false;
  std::optional<End> end_;
  // Per node: lost; settled for lost_nodes(); its round over for usage_verdict().
  std::vector<bool> lost_, settled_, ended_;
  std::thread thread_;
};

void Monitor::loop() {
  const int n = static_cast<int>(round_.members.size());
  const int me = round_.node_rank;
  const int r = round_.number;
  std::vector<std::string> last(n);
  std::vector<Clock::time_point> changed_at(n, Clock::now()), seen_at(n, Clock::now());
  std::vector<bool> done(n, false), gone(n, false), beat_after_end(n, false), over(n, false);
  {
    const std::lock_guard lock(mutex_);
    lost_.assign(n, false);
    settled_.assign(n, false);
    ended_.assign(n, false);
  }
  bool done_published = false, over_published = false;
  std::optional<End> end;
  std::optional<Clock::time_point> end_seen_at;  // when this launcher read the round's end
  std::optional<int> arrived_next;               // this node's arrival index at the next round
  constexpr int kNotTaken = -2;                  // the next round closed without this node
  int next_rank = -1;                            // its node rank there, once known
  std::string seen_changes = "?";  // "changes" at the last full look (never this text)
  int watched = -1;                // the node whose beat this one watches, if any
  bool cause_named = false;        // a lost node was named as the cause of a consequence end
  // Per node: its workers exited 0, it left, its workers have all ended, its beat, and the
  // verdict of the launcher that found it lost ("SECONDS NODE"), which the others take as theirs.
  static constexpr const char* kFields[] = {"done", "left", "over", "hb", "lost"};
  constexpr std::size_t kPerNode = std::size(kFields);
  const auto node_keys = [&](int k, std::vector<std::string>& keys) {
    for (const char* name : kFields) keys.push_back(key(r, fmt::format("{}/{}", name, k)));
  };
  // Takes in what node k's keys say (kFields' order). A beat is timed from when this launcher
  // first saw it (its real time is earlier), so a silence is never overstated.
  const auto look_at = [&](int k, const std::string* text) {
    const auto now = Clock::now();
    if (!text[0].empty()) done[k] = true;
    if (!text[1].empty()) gone[k] = true;
    if (end && !text[2].empty()) over[k] = true;
    if (text[3] != last[k]) {
      last[k] = text[3];
      changed_at[k] = now;
      // A beat after the end, if this launcher had looked at k shortly before the end: one it
      // has not looked at for long (not watched) may have beaten before the end, so its first
      // new beat after the end is only where its silence starts.
      if (end && seen_at[k] + heartbeat_interval(o_) >= *end_seen_at) beat_after_end[k] = true;
    }
    seen_at[k] = now;
    const double silent = std::chrono::duration<double>(now - changed_at[k]).count();
    // After the end, one whose workers have all ended ("over"), or that beat since, was
    // alive then: it went on to the next round (it beats there, not here), not lost.
    const bool moved_on = end && (beat_after_end[k] || over[k]);
    const bool lost = !done[k] && !gone[k] && !moved_on && silent > o_.heartbeat_timeout_s;
    // Another launcher's verdict: without it, a launcher that did not watch k would time k's
    // silence from the round's end and wait another T before it could name k (an outside
    // operator saw every survivor but the watcher exit at 2 T).
    double verdict_s = 0;
    int verdict_by = -1;
    const bool found_elsewhere =
        std::sscanf(text[4].c_str(), "%lf %d", &verdict_s, &verdict_by) == 2;
    bool newly_lost = false, newly_found_elsewhere = false;
    {
      const std::lock_guard lock(mutex_);
      if (lost && !lost_[k]) {
        lost_[k] = newly_lost = true;
        say("node {} ({}) is lost: no heartbeat for {:.1f} s", k, round_.members[k].address,
            silent);
      } else if (found_elsewhere && !lost_[k]) {
        lost_[k] = newly_found_elsewhere = true;
        say("node {} ({}) is lost: no heartbeat for {:.1f} s, seen by node {}", k,
            round_.members[k].address, verdict_s, verdict_by);
      }
      settled_[k] = lost_[k] || gone[k] || done[k] || beat_after_end[k];
      ended_[k] = lost_[k] || gone[k] || done[k] || over[k];
    }
    if (newly_lost && !found_elsewhere) {
      store_.set(key(r, fmt::format("lost/{}", k)), fmt::format("{:.1f} {}", silent, me));
    }
    // The round ended on a failure another rank caused (its workers lost their peers), before
    // a silent node could be found lost: that node is the cause. Said once per round, by every
    // node (the first to say it records it in "cause"), while the next round already runs.
    if ((newly_lost || newly_found_elsewhere) && end && end->kind == 'F' &&
        is_consequence(end->reason) && !cause_named) {
      cause_named = true;
      const std::string cause =
          set_once(store_, key(r, "cause"),
                   fmt::format("node {} ({}) is lost: no heartbeat for {:.1f} s", k,
                               round_.members[k].address, found_elsewhere ? verdict_s : silent));
      say("round {} failed because {} (the failure that ended it, {}, is a consequence: its "
          "workers lost their peers there)",
          r, cause, end->reason);
    }
    if (lost && !end) {
      set_once(store_, key(r, "end"),
               fmt::format("F|node {} ({}) lost: no heartbeat for {:.1f} s", k,
                           round_.members[k].address, silent));
    }
    // A launcher leaves a round that has not ended only when it failed (it lost the store,
    // say, while this one was stalled): its workers are gone, so the round has failed.
    if (gone[k] && !done[k] && !end) {
      set_once(store_, key(r, "end"),
               fmt::format("F|node {} ({}) left the round before its workers finished", k,
                           round_.members[k].address));
    }
  };
  // Every other node's keys, in one request. Each launcher does this only when the round's
  // "changes" count moved (a node finished, left or ended its workers), and at every beat once
  // the round has ended; otherwise it reads its watched node's keys alone (see loop's comment).
  const auto look_at_all = [&] {
    std::vector<std::string> keys = {key(r, "changes")};
    for (int k = 0; k < n; ++k) node_keys(k, keys);
    const std::vector<std::string> texts = read_many(store_, keys);
    seen_changes = texts[0];
    for (int k = 0; k < n; ++k) {
      if (k != me) look_at(k, &texts[1 + kPerNode * static_cast<std::size_t>(k)]);
    }
  };
  // Says that a node's keys changed, so that every launcher looks at every node once more.
  const auto announce_change = [&] { store_.add(key(r, "changes"), 1); };
  for (std::int64_t beat = 1;; ++beat) {
    try {
      std::optional<std::string> pending;
      bool local_done = false, published = false, local_over = false;
      {
        const std::lock_guard lock(mutex_);
        poke_ = false;
        pending = pending_;
        local_done = done_;
        published = published_;
        local_over = over_;
      }
      if (pending && !published) {
        store_.set(key(r, fmt::format("fail/{}", me)), pending->substr(0, 1));
        set_once(store_, key(r, "end"), *pending);
        const std::lock_guard lock(mutex_);
        published_ = true;
      }
      // After "fail/K" (local_failure() comes before local_over()): a node whose round is over
      // has said how it failed, if it did.
      if (local_over && !over_published) {
        store_.set(key(r, fmt::format("over/{}", me)), "1");
        announce_change();
        over_published = true;
        const std::lock_guard lock(mutex_);
        over_written_ = true;
      }
      store_.set(key(r, fmt::format("hb/{}", me)), std::to_string(beat));
      if (local_done && !done_published) {
        store_.set(key(r, fmt::format("done/{}", me)), "1");
        announce_change();
        done_published = true;
      }
      // Each beat, a launcher reads the round's "changes" count, whether a node waits for the
      // next round, and the keys of one node: the nearest before it (cyclically) whose workers
      // still run. So each node is watched by at least the one after it, and a look costs the
      // store the same at any N (reading every node's keys at every beat, each of N launchers,
      // grows as N²). Finishing, leaving and ending the workers are announced through
      // "changes", and then every launcher looks at every node; a writer that died before its
      // announcement is caught by its watcher, which announces for it.
      std::vector<std::string> keys = {key(r, "changes"), key(r + 1, "arrivals")};
      if (watched >= 0) node_keys(watched, keys);
      const std::vector<std::string> texts = read_many(store_, keys);
      const bool someone_waits = !texts[1].empty();
      bool full = end.has_value() || texts[0] != seen_changes;
      if (watched >= 0 && !full) {
        const std::string* text = &texts[2];
        const bool news =
            (!text[0].empty() && !done[watched]) || (!text[1].empty() && !gone[watched]);
        look_at(watched, text);
        if (news) {
          announce_change();
          full = true;
        }
      }
      if (full) look_at_all();
      int finished = local_done ? 1 : 0;
      for (int k = 0; k < n; ++k) finished += k != me && done[k] ? 1 : 0;
      if (finished == n && !end) {
        set_once(store_, key(r, "end"), "S|every node's workers exited 0");
      }
      // A node waiting for the next round, while this one could be larger: end it.
      if (!end && n < o_.nnodes && someone_waits) {
        set_once(store_, key(r, "end"),
                 fmt::format("M|a node is waiting to join ({} of at most {} in round {})", n,
                             o_.nnodes, r));
      }
      if (!end && store_.check({key(r, "end")})) {
        end = parse_end(store_.get_string(key(r, "end")));
        end_seen_at = Clock::now();
        if (end->kind != 'S') stop_.request(end->reason);
        // Every node from now on, before the main thread asks who was lost: a node not watched
        // is timed from here (see look_at).
        look_at_all();
        // The main thread makes the same decision: another round unless the job is over. After
        // a 'U' end it waits for the verdict first (usage_verdict()), and arrives then.
        const bool next =
            end->kind == 'M' || (end->kind == 'F' && round_.restarts_used < o_.max_restarts);
        bool leaving = false;
        {
          const std::lock_guard lock(mutex_);
          leaving = leaving_;
        }
        std::optional<int> index;
        if (next && !leaving) index = arrive(store_, r + 1, address_, o_.nproc_per_node);
        arrived_next = index;
        const std::lock_guard lock(mutex_);
        end_ = end;
        next_index_ = index;
      }
      // Between rounds this node may take up to its --grace-period to stop its workers, and the
      // next round may close (counting it) and start meanwhile: its nodes would find this one
      // lost after T. So once the next round has closed with this node, its beat goes on there
      // too, until the next round's own Monitor takes over.
      if (arrived_next && next_rank < 0) {
        if (store_.check({key(r + 1, "closed")})) {
          const std::vector<int> next_members =
              parse_members(store_.get_string(key(r + 1, "closed")));
          const auto at = std::find(next_members.begin(), next_members.end(), *arrived_next);
          next_rank =
              at == next_members.end() ? kNotTaken : static_cast<int>(at - next_members.begin());
        }
      }
      if (next_rank >= 0) {
        store_.set(key(r + 1, fmt::format("hb/{}", next_rank)), fmt::format("p{}", beat));
      }
      watched = -1;
      for (int step = 1; step < n && watched < 0; ++step) {
        const int k = (me - step + n) % n;
        if (!done[k] && !gone[k]) watched = k;
      }
    } catch (const std::exception& e) {
      const std::string reason = fmt::format("lost the rendezvous store: {}", e.what());
      stop_.request(reason);
      const std::lock_guard lock(mutex_);
      if (!end_) end_ = End{'X', reason};
      changed_.notify_all();
      return;
    }
    std::unique_lock lock(mutex_);
    changed_.notify_all();
    if (lingering_ && end) {
      bool settled = true;
      for (int k = 0; k < n; ++k) settled = settled && (k == me || settled_[k]);
      const auto until = *end_seen_at + millis(o_.heartbeat_timeout_s) + 2 * heartbeat_interval(o_);
      if (settled || Clock::now() >= until) return;  // the next round's monitor beats now
    }
    const auto pass = hurry_ && !end ? kWaitPass : heartbeat_interval(o_);
    if (changed_.wait_for(lock, pass,
                          [this] {
                            return quit_ || poke_ || (pending_ && !published_) ||
                                   (over_ && !over_written_);
                          }) &&
        quit_) {
      // The main thread moved on as soon as it saw the end, which this beat may have read
      // before local_over() came: "over" is written now, or a node still waiting out its grace
      // period finds this one silent and lost after T (seen once on a clean clone's run).
      const bool write_over = over_ && !over_written_ && !over_published;
      lock.unlock();
      if (write_over) {
        try {
          store_.set(key(r, fmt::format("over/{}", me)), "1");
          announce_change();
        } catch (const std::exception&) {
          // The store is gone: nobody is left to read it.
        }
      }
      return;
    }
  }
}

// A store refusal without its advice to set NANODDP_STORE_TOKEN, wrong for a port held by
// another job's store.
std::string without_advice(std::string refusal) {
  if (const auto at = refusal.find(" (set NANODDP_STORE_TOKEN"); at != std::string::npos) {
    refusal.resize(at);
  }
  return refusal;
}

// After this node lost the store mid-round ('X': its calls timed out, the store's launcher
// stalled or the link broke) with restarts left: tries to reach it again until
// --rdzv-join-timeout, a request at a time (each waits up to the client's timeout), as
// torchrun's agent retries its store. The round is ended there with the reason (the others
// would otherwise find this node lost only after T); the caller then joins the next round.
void reach_store_again(comm::Store& store, const Round& round, const std::string& address,
                       const std::string& why, const RunOptions& o, SignalInbox& signals) {
  say("round {}: {}; this node's workers are stopped. Trying to reach the store again for up to "
      "--rdzv-join-timeout {} s, to join the next round (restarts used {} of {})",
      round.number, why, o.join_timeout_s, round.restarts_used, o.max_restarts);
  const auto until = Clock::now() + millis(o.join_timeout_s);
  for (;;) {
    for (const int signo : signals.drain()) {
      if (signo == SIGCHLD) continue;
      throw JobEnds(128 + signo, fmt::format("got {} while trying to reach the rendezvous "
                                             "store again",
                                             signal_name(signo)));
    }
    try {
      set_once(store, key(round.number, "end"),
               fmt::format("F|node {} ({}) {}", round.node_rank, address, why));
      say("reached the rendezvous store again: joining round {}", round.number + 1);
      return;
    } catch (const comm::StoreError& e) {
      // A refused connection: the store's host answers, and nothing listens on the port; its
      // launcher has exited (killed, or ended) and no other can serve the job's store. Only a
      // store that does not answer (stopped, swapping, a link down) may come back.
      if (std::string_view(e.what()).find("connection refused") != std::string_view::npos) {
        throw JobEnds(1, fmt::format("{}; the launcher serving it has exited (connection "
                                     "refused at {}): start the job again",
                                     why, o.rdzv_endpoint));
      }
      if (Clock::now() >= until) {
        throw JobEnds(1, fmt::format("{}; and could not reach it again within "
                                     "--rdzv-join-timeout {} s: {}",
                                     why, o.join_timeout_s, e.what()));
      }
      std::this_thread::sleep_for(5 * kWaitPass);
    }
  }
}

}  // namespace

int run_elastic(const LaunchPlan& plan) {
  const RunOptions& o = plan.options;
  SignalInbox signals;  // first: blocks the signals before any thread starts (signals.h)
  adopt_orphans();
  const Endpoint endpoint = parse_endpoint(o.rdzv_endpoint);
  const std::string address = local_address_towards(endpoint.host);
  std::unique_ptr<comm::TcpStoreServer> server;
  std::optional<std::string> bind_error;  // the port is held on this machine: by whom?
  if (is_local_address(endpoint.host)) {
    try {
      server = std::make_unique<comm::TcpStoreServer>(comm::TcpStoreOptions{
          .host = endpoint.host, .port = static_cast<std::uint16_t>(endpoint.port)});
    } catch (const comm::StoreError&) {
      // Another launcher on this machine serves it, or a stranger holds the port. (The
      // store's own hint names MASTER_PORT, the workers' setting: not repeated.)
      bind_error = "address already in use";
    }
  }
  // Which store and job this launcher is part of, before anything can keep it waiting.
  if (server) {
    say("job '{}': serving the rendezvous store on {} (this launcher is its server; the job's "
        "other launchers connect to it)",
        o.rdzv_id, o.rdzv_endpoint);
  } else {
    say("job '{}': a client of the rendezvous store on {} ({}; waiting up to "
        "--rdzv-join-timeout {} s to reach it)",
        o.rdzv_id, o.rdzv_endpoint,
        bind_error ? "its port is held on this machine: by another launcher, if it answers as one"
                   : "another launcher serves it",
        o.join_timeout_s);
  }
  const comm::TcpStoreOptions client_options{
      .host = endpoint.host,
      .port = static_cast<std::uint16_t>(endpoint.port),
      .timeout = std::max(millis(o.heartbeat_timeout_s), std::chrono::milliseconds(1000)),
      .server_role = fmt::format("the nanoddp-run on {} serving it", endpoint.host),
      .address_setting = "--rdzv-endpoint",
      .port_setting = "--rdzv-endpoint's port"};
  const std::string prefix = "nanoddp-run/" + o.rdzv_id;
  // The first connection waits as long as a round may take to form (--rdzv-join-timeout): a node
  // started before the endpoint's launcher is early, not wrong. It is tried a second at a time,
  // so a signal meanwhile ends the wait at once. Later requests wait a heartbeat.
  std::shared_ptr<comm::TcpStore> client;
  const auto connect_until = Clock::now() + millis(o.join_timeout_s);
  // On the endpoint's own host the port is held by a process that is already listening: a
  // launcher's store answers its handshake at once. One that does not for kForeignPort is not
  // a nanoddp-run rendezvous store (a silent listener, another protocol), and waiting
  // --rdzv-join-timeout for it would only delay the same error (an outside operator's).
  constexpr auto kForeignPort = 3s;
  const auto foreign_after = Clock::now() + kForeignPort;
  const auto foreign = [&](const std::string& answer) {
    say("error: port {} on {} (--rdzv-endpoint {}) is in use by a process that is not a "
        "nanoddp-run rendezvous store ({}; {}). Stop that process (`ss -ltnp 'sport = :{}'` "
        "names it), or give every launcher of this job another --rdzv-endpoint port",
        endpoint.port, endpoint.host, o.rdzv_endpoint, *bind_error, answer, endpoint.port);
    return 1;
  };
  for (;;) {
    for (const int signo : signals.drain()) {
      if (signo == SIGCHLD) continue;
      say("error: got {} while connecting to the rendezvous store on {}", signal_name(signo),
          o.rdzv_endpoint);
      return 128 + signo;
    }
    try {
      comm::TcpStoreOptions attempt = client_options;
      attempt.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::clamp(
          connect_until - Clock::now(), Clock::duration(100ms), Clock::duration(1000ms)));
      client = std::make_shared<comm::TcpStore>(attempt);
      client->set_timeout(client_options.timeout);
      break;
    } catch (const comm::StoreRefused& e) {
      // A nanoddp store with a token this launcher lacks: on this machine, with the port taken,
      // most likely another job's workers' store (its token is random), not this job's.
      if (bind_error) {
        return foreign(
            fmt::format("it answered and refused this launcher: another job's workers' store, "
                        "or another protocol: {}",
                        without_advice(e.what())));
      }
      say("error: the rendezvous store at {} (--rdzv-endpoint): {} (if it is this job's "
          "rendezvous store, give every launcher the same NANODDP_STORE_TOKEN, or none; if it "
          "is another job's store, give this job another --rdzv-endpoint port)",
          o.rdzv_endpoint, e.what());
      return 1;
    } catch (const comm::StoreError& e) {
      if (bind_error && Clock::now() >= foreign_after) {
        return foreign(fmt::format("it did not complete a store handshake within {} s: {}",
                                   kForeignPort.count(), e.what()));
      }
      if (Clock::now() < connect_until) continue;
      say("error: cannot reach the rendezvous store at {} (--rdzv-endpoint) within "
          "--rdzv-join-timeout {} s: is nanoddp-run running on {} with the same "
          "--rdzv-endpoint? ({})",
          o.rdzv_endpoint, o.join_timeout_s, endpoint.host, e.what());
      return 1;
    }
  }
  comm::PrefixStore store(prefix, client);
  // A launcher refused here changes nothing in the store that the job reads.
  const std::string serving_note =
      server ? fmt::format(
                   " This launcher served the store on {}: the job's other launchers "
                   "lose it and end too.",
                   o.rdzv_endpoint)
             : std::string();
  try {
    // A store serves one job: it lives in the launcher on HOST of the job that started it and
    // goes when that job ends, so a second job sharing it would lose its store mid-run (their
    // keys, under nanoddp-run/<id>/, would be disjoint: the lifetime is what they cannot share).
    const std::vector<std::uint8_t> id(o.rdzv_id.begin(), o.rdzv_id.end());
    const comm::Bytes owner = client->compare_set("nanoddp-run/job", {}, id);
    if (owner != id) {
      say("error: the rendezvous store on {} serves job '{}', and this launcher's --rdzv-id is "
          "'{}': a store serves one job (it lives in that job's launcher and goes when the job "
          "ends). Give job '{}' another --rdzv-endpoint port.{}",
          o.rdzv_endpoint, std::string(owner.begin(), owner.end()), o.rdzv_id, o.rdzv_id,
          serving_note);
      return kUsageExitCode;
    }
    // The first launcher of the job records its settings; every later one must have the same.
    const std::string mine = encode_settings(job_settings(o));
    const comm::Bytes recorded =
        store.compare_set("settings", {}, std::vector<std::uint8_t>(mine.begin(), mine.end()));
    const std::string job(recorded.begin(), recorded.end());
    if (job != mine) {
      say("error: job '{}' on {} runs with other settings than this launcher's, which it "
          "refuses (the job goes on): {}. Every launcher of a job gives the same --nnodes, "
          "--max-restarts, --heartbeat-timeout, --rdzv-last-call and PROGRAM ARGS; a new job "
          "needs another --rdzv-endpoint port.{}",
          o.rdzv_id, o.rdzv_endpoint, differences(decode_settings(job), job_settings(o)),
          serving_note);
      return kUsageExitCode;
    }
  } catch (const std::exception& e) {
    say("error: the rendezvous store on {}: {}", o.rdzv_endpoint, e.what());
    return 1;
  }

  int exit_code = 0;
  int last_round = -1, last_node = 0;
  std::optional<int> next_index;  // this node's arrival at round `number`, if made already
  // The last round's monitor, lingering after a consequence end to name a lost node (linger()).
  std::unique_ptr<Monitor> previous;
  try {
    for (int number = 0;;) {
      const Round round = join(store, number, address, o, next_index, signals, last_round >= 0);
      last_round = round.number;
      last_node = round.node_rank;
      if (round.restarts_used > o.max_restarts) {
        throw JobEnds(
            1, fmt::format("the job has no restarts left (--max-restarts {})", o.max_restarts));
      }
      int offset = 0, world = 0;
      for (std::size_t k = 0; k < round.members.size(); ++k) {
        if (static_cast<int>(k) < round.node_rank) offset += round.members[k].nproc;
        world += round.members[k].nproc;
      }
      say("round {}: node {} of {} (ranks {}..{} of {}), restarts used {} of {}", round.number,
          round.node_rank, round.members.size(), offset, offset + o.nproc_per_node - 1, world,
          round.restarts_used, o.max_restarts);
      auto watch = std::make_unique<Monitor>(client_options, prefix, round, o, address);
      Monitor& monitor = *watch;
      const RoundSpec spec{.node_rank = round.node_rank,
                           .rank_offset = offset,
                           .world_size = world,
                           .master_addr = round.members[0].address,
                           .master_port = round.master_port,
                           .store_token = round.token,
                           .restart_count = round.number,
                           .label = fmt::format("round {}", round.number),
                           .stop = &monitor.stop(),
                           .on_failure =
                               [&](const std::string& what, int code) {
                                 monitor.local_failure(fmt::format("node {} ({}): {}",
                                                                   round.node_rank, address, what),
                                                       code == kUsageExitCode);
                               },
                           .on_settle = [&] { monitor.hurry(); }};
      const AttemptOutcome outcome = run_round(plan, spec, signals);
      if (outcome.outcome == Outcome::kInterrupted) {
        monitor.leave();
        monitor.publish('F',
                        fmt::format("node {}'s launcher was stopped by a signal", round.node_rank));
        monitor.wait_end();
        exit_code = outcome.exit_code;
        break;
      }
      if (outcome.outcome == Outcome::kSucceeded) monitor.local_done();
      monitor.local_over();
      End end = monitor.wait_end();
      if (end.kind == 'U') {
        if (monitor.usage_verdict(store)) {
          throw JobEnds(kUsageExitCode,
                        fmt::format("round {} ended: {}: exit code 2 is a usage error (bad flags, "
                                    "values or inputs) and no node crashed or was lost, so no "
                                    "restart: it would fail the same way. Fix the command",
                                    round.number, end.reason));
        }
        say("round {}: exit code 2 came with a crash or a lost node elsewhere (a peer's loss can "
            "fail a worker's set-up with exit code 2): taken as a failure, not a usage error",
            round.number);
        end.kind = 'F';
      }
      if (end.kind == 'S') {
        say("round {}: every node's workers exited 0", round.number);
        break;
      }
      if (end.kind == 'X') {
        if (round.restarts_used >= o.max_restarts) throw JobEnds(1, end.reason);
        // The store's launcher may only have stalled (SIGSTOP, swapping): while restarts remain,
        // this node tries to reach it again and joins the next round, as a lost node that came
        // back would (the others find it lost after T, or read the end it writes on return).
        number = round.number + 1;
        next_index.reset();
        previous.reset();
        reach_store_again(store, round, address, end.reason, o, signals);
        continue;
      }
      if (end.kind == 'F' && round.restarts_used >= o.max_restarts) {
        // A round that ended on a consequence (this node's workers lost their peers) was caused
        // by the node lost, if one is: named first.
        std::string lost;
        for (const int k : monitor.lost_nodes()) {
          lost += fmt::format("{}node {} ({}) is lost", lost.empty() ? "" : "; ", k,
                              round.members[k].address);
        }
        const std::string why =
            lost.empty() ? end.reason
            : is_consequence(end.reason)
                ? fmt::format("{} (and, as a consequence, {})", lost, end.reason)
                : fmt::format("{}; {}", end.reason, lost);
        exit_code = outcome.outcome == Outcome::kFailed ? outcome.exit_code : 1;
        throw JobEnds(exit_code, fmt::format("round {} ended: {}; no restarts left "
                                             "(--max-restarts {})",
                                             round.number, why, o.max_restarts));
      }
      say("round {} ended: {}; {}", round.number, end.reason,
          end.kind == 'F' ? fmt::format("restart {} of {}", round.restarts_used + 1, o.max_restarts)
                          : std::string("the next round takes it in"));
      number = round.number + 1;
      next_index = monitor.next_index();
      // Recovery does not wait for the cause: when the end was a consequence (this node's
      // workers lost their peers) and a node of the round is silent, the monitor names it lost
      // while the next round forms and runs (at most T + 2 intervals after the end).
      // Only then: a node that ended the round itself (it lost the store, it left) goes on to
      // the next round, and a lingering monitor took its silence in this one for a loss (an
      // outside tester's "node 1 is lost" about a node running round 1).
      if (end.kind == 'F' && is_consequence(end.reason)) {
        monitor.linger();
        previous = std::move(watch);
      } else {
        previous.reset();
      }
    }
  } catch (const JobEnds& e) {
    if (e.code == 0) {
      say("{}", e.what());
    } else {
      say("error: {}", e.what());
    }
    exit_code = e.code;
  } catch (const std::exception& e) {
    say("error: {}", e.what());
    exit_code = 1;
  }
  previous.reset();  // its connection would hold the server's wait below
  // Leaving: not lost. The launcher serving the store stays until every other connection to it
  // has closed, so no launcher loses the store while it finishes: the last round's nodes
  // (which need not include this one) write their last beats and "left", and the launchers
  // waiting for the next round read the job's end. At most one heartbeat timeout: a frozen
  // node, one cut off, or any stray client keeps its connection open. (Waiting for this launcher's
  // last round's "left" keys only, an outside operator saw the final round's nodes lose the store
  // after a job that succeeded, exit 1.)
  try {
    if (last_round >= 0) {
      store.set(key(last_round, fmt::format("left/{}", last_node)), "1");
      store.add(key(last_round, "changes"), 1);  // the others look at every node again
    }
  } catch (const std::exception&) {
    // The store is gone: there is nobody left to tell.
  }
  if (server) {
    const auto until = Clock::now() + millis(o.heartbeat_timeout_s);
    // This launcher's own client is the one connection left.
    while (server->stats().connections > 1 && Clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
  }
  return exit_code;
}

}  // namespace nanoddp::run
