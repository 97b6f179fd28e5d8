#pragma once
// Why a worker failed, written for the launcher that started it, so that the launcher names the
// rank that failed first rather than the first to exit. After rank 0 failed to write a
// checkpoint, rank 1 (told through the store) often exited before rank 0 had finished saying
// why, and nanoddp-run named rank 1.
//
// The file is torchelastic's (PyTorch's `record` decorator writes it to TORCHELASTIC_ERROR_FILE):
// torchrun names as the root cause the failure with the earliest timestamp, which for a worker
// with no file is the moment torchrun noticed its exit. nanoddp-run sets NANODDP_ERROR_FILE to
// the same path and reads two fields of nanoddp's beside torchelastic's: the time to the
// nanosecond (torchelastic keeps whole seconds) and whether another rank's failure caused this
// one.

#include <cstdint>
#include <optional>
#include <string>

namespace nanoddp::common {

struct FailureRecord {
  std::string message;
  bool caused_by_peer = false;   // this rank stopped because another one failed
  std::optional<int> peer_rank;  // that rank, when known
  std::int64_t time_ns = 0;      // CLOCK_REALTIME: comparable across the workers of one host
};

// Writes the record (time: now) to TORCHELASTIC_ERROR_FILE, where the launcher asked for it.
// Under torchrun (NANODDP_ERROR_FILE unset, or not the same path: inherited from elsewhere) a
// failure caused by a peer writes nothing: torchrun compares whole seconds and names the lower
// rank on a tie, and without a file the time it noticed the exit ranks it after the rank that
// failed first. Never throws: a file that cannot be written costs a warning on stderr.
void record_failure(const std::string& message, bool caused_by_peer,
                    std::optional<int> peer_rank = std::nullopt);

// The record in `path` (nanoddp-run), or nullopt when there is none or it is not one: a
// program other than nanoddp's may write torchelastic's format without nanoddp's fields (then
// only the whole second is known, and the cause is taken as its own).
std::optional<FailureRecord> read_failure_record(const std::string& path);

}  // namespace nanoddp::common
