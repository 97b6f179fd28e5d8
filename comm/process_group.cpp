#include "nanoddp/comm/process_group.h"

#include <fmt/format.h>

namespace nanoddp::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllreduceCoalesced:
      return "allreduce_coalesced";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string describe_op(const OpRecord& op) {
  return fmt::format("{} #{} ({} x {})", op_kind_name(op.kind), op.sequence_number, op.count,
                     dtype_name(op.dtype));
}

void ProcessGroup::record_op(const OpRecord& op) {
  // FNV-1a over the four fields: cheap, and order-sensitive, so two ranks agree only if they
  // issued the same ops in the same order.
  const std::uint64_t fields[] = {op.sequence_number, static_cast<std::uint64_t>(op.kind), op.count,
                                  static_cast<std::uint64_t>(op.dtype)};
  std::lock_guard lock(fingerprint_mutex_);
  std::uint64_t hash = fingerprint_.hash;
  for (std::uint64_t field : fields) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (field >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  }
  fingerprint_.hash = hash;
  recent_[fingerprint_.ops % kRecentOps] = op;
  ++fingerprint_.ops;
}

OpFingerprint ProcessGroup::fingerprint() const {
  std::lock_guard lock(fingerprint_mutex_);
  return fingerprint_;
}

std::vector<OpRecord> ProcessGroup::recent_ops() const {
  std::lock_guard lock(fingerprint_mutex_);
  std::vector<OpRecord> out;
  const std::uint64_t first = fingerprint_.ops > kRecentOps ? fingerprint_.ops - kRecentOps : 0;
  for (std::uint64_t n = first; n < fingerprint_.ops; ++n) out.push_back(recent_[n % kRecentOps]);
  return out;
}

namespace {

class CompletedWork final : public Work {
 public:
  explicit CompletedWork(std::string op_name) : op_name_(std::move(op_name)) {}
  void wait() override {}
  bool is_completed() override { return true; }
  std::exception_ptr error() override { return nullptr; }
  std::uint64_t sequence_number() const override { return 0; }
  const std::string& op_name() const override { return op_name_; }

 private:
  std::string op_name_;
};

}  // namespace

std::shared_ptr<Work> completed_work(std::string op_name) {
  return std::make_shared<CompletedWork>(std::move(op_name));
}

std::vector<float> allgather_values(const std::vector<float>& mine, ProcessGroup& group,
                                    Device device) {
  const auto len = static_cast<std::int64_t>(mine.size());
  const Tensor input = Tensor::from_vector(mine, {len}, device);
  Tensor output = Tensor::empty({group.size() * len}, device);
  group.allgather(input, output)->wait();
  return output.to_vector();
}

}  // namespace nanoddp::comm
