#pragma once
// Collectives. A ProcessGroup is the set of ranks of a job and the ops they do together;
// Gloo runs them on CPU tensors, NCCL on CUDA tensors.
//
// Every op is asynchronous: it returns a Work at once and runs in issue order (Gloo: on the
// group's worker thread; NCCL: on the group's communication stream). Work::wait() is where the
// caller joins it: on the CPU the thread blocks until the op is done; on CUDA the caller's
// compute stream is made to wait for the op's event, and the host goes on.
//
// Every op gets a sequence number (1, 2, ...) in issue order. All ranks must issue the same
// ops in the same order; when one does not, the mismatch shows up as a timeout, and the error
// names the op, its sequence number, its element count and the peer that did not answer.
// Each group also keeps a running fingerprint of the ops issued (sequence number, op, element
// count, dtype) and the last few of them, which DDP compares across ranks once per step
// (step_check.h): a rank that skipped a step, or issued other ops, fails every rank at once.

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nanoddp/comm/store.h"
#include "nanoddp/engine/tensor.h"

namespace nanoddp::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// A collective failed or timed out. The message names the op, sequence number, count and peer.
class CommError : public Error {
 public:
  using Error::Error;
};

// This rank stops because another rank failed and said so through the store (a checkpoint rank
// 0 could not write, a set-up step that rank could not finish). Not a CommError: the peer is
// alive and answered. Launchers are told which rank it was (apps/common/error_file.h), so that
// they name that rank as the one that failed first, not this one, which may exit sooner.
class PeerFailedError : public Error {
 public:
  PeerFailedError(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// What ranks compare about an op (the fingerprint): its kind, element count and dtype, and its
// sequence number.
enum class OpKind : std::uint8_t {
  kAllreduce,
  kAllreduceCoalesced,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kBarrier
};
const char* op_kind_name(OpKind kind);

struct OpRecord {
  std::uint64_t sequence_number = 0;
  OpKind kind = OpKind::kAllreduce;
  std::uint64_t count = 0;  // elements (per rank for allgather and reduce_scatter)
  DType dtype = DType::kF32;
};
// "allreduce #7 (1237 x float32)"
std::string describe_op(const OpRecord& op);

// A running hash of every op a group issued, and how many.
struct OpFingerprint {
  std::uint64_t ops = 0;
  std::uint64_t hash = 0;
};

// When an op ran, on the host's steady clock (for statistics and timelines).
struct WorkTiming {
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
};

class Work {
 public:
  virtual ~Work() = default;
  // CPU: blocks until done. CUDA: makes the current compute stream wait; returns at once.
  // Throws CommError if the op failed or timed out.
  virtual void wait() = 0;
  // Non-blocking: finished (successfully or not)?
  virtual bool is_completed() = 0;
  // The failure, if the op failed (null otherwise, or while running).
  virtual std::exception_ptr error() = 0;
  virtual std::uint64_t sequence_number() const = 0;
  virtual const std::string& op_name() const = 0;
  // When the op started and finished running, once it has completed. CUDA ops are timed with
  // events on the communication stream, mapped onto the host clock.
  virtual std::optional<WorkTiming> timing() const { return std::nullopt; }
};

// A Work that is done before it starts: what a world of one "runs" instead of a collective
// (the average of one rank's tensor is the tensor). No sequence number is taken: nothing is
// issued, so nothing needs matching.
std::shared_ptr<Work> completed_work(std::string op_name);

struct ProcessGroupOptions {
  // Deadline of every op (from its start) and of the connection set-up.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Namespace of this group's keys in the store.
  std::string name = "default";
  // Gloo: the network interface to use ("" = the one that reaches the master;
  // $NANODDP_SOCKET_IFNAME overrides).
  std::string interface;
  // Gloo: the master's address (MASTER_ADDR). With no interface given, the device binds to the
  // local address whose route reaches it ("" = the address this host's name resolves to).
  std::string master_addr;
  // NCCL: the CUDA device of this rank (usually LOCAL_RANK).
  int device_index = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // In place over `tensor` (float32 or bfloat16).
  virtual std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // Several tensors as one op (NCCL: one ncclGroupStart/End; Gloo: one call over a list).
  virtual std::shared_ptr<Work> allreduce_coalesced(std::vector<Tensor>& tensors,
                                                    ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, int root) = 0;
  // output holds size() * input.numel() elements: rank r's input lands at r * input.numel().
  virtual std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output) = 0;
  // input holds size() * output.numel() elements; rank r gets the reduction of block r.
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output,
                                               ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // The fingerprint of the ops issued so far, and the last kRecentOps of them (oldest first).
  static constexpr std::size_t kRecentOps = 6;
  OpFingerprint fingerprint() const;
  std::vector<OpRecord> recent_ops() const;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  // Every backend calls this for every op, in issue order, as it hands out its sequence number.
  void record_op(const OpRecord& op);

 private:
  int rank_;
  int size_;
  mutable std::mutex fingerprint_mutex_;
  OpFingerprint fingerprint_{.ops = 0, .hash = 14695981039346656037ull};  // FNV-1a's start
  std::array<OpRecord, kRecentOps> recent_{};  // a ring: op n at n % kRecentOps
};

// Every rank's `mine` (the same length on every rank), rank after rank: an all-gather of a few
// host values, staged through a tensor on `device` (NCCL gathers device tensors, Gloo host
// ones). For reports (every rank's step times, its memory), not for the training path.
std::vector<float> allgather_values(const std::vector<float>& mine, ProcessGroup& group,
                                    Device device);

// Gloo over TCP (CPU tensors). Connects all pairs through `store`; throws on timeout.
std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, const ProcessGroupOptions& options);
// NCCL (CUDA tensors). The unique id goes through `store`. Throws a clear Error without CUDA.
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, const ProcessGroupOptions& options);

}  // namespace nanoddp::comm
