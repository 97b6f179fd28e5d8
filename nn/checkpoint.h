#pragma once
// Checkpoints: safetensors files holding the parameters (named as the model names them), the
// optimizer state ("optimizer.<name>", flat), and in the metadata everything needed to continue
// the exact trajectory: step, epoch, the global position in the epoch's sample order, the seed,
// the format version and a checksum of all tensor bytes.
//
// The position is counted in *global* samples, not in per-rank steps, so a checkpoint does not
// depend on the world size: 4 ranks x batch 16 can resume what 2 ranks x batch 32 saved.
//
// Writes are atomic (temporary file in the same directory, fsync, rename, fsync of the
// directory): a crash mid-write leaves the previous checkpoint as it was.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nanoddp/nn/module.h"
#include "nanoddp/nn/optimizer.h"

namespace nanoddp::nn {

inline constexpr int kCheckpointFormatVersion = 1;

struct TrainingState {
  std::int64_t step = 0;           // optimizer steps completed
  std::int64_t epoch = 0;          // epoch of the next step
  std::int64_t epoch_samples = 0;  // global samples of `epoch` already consumed
  std::uint64_t seed = 0;
  // Which run wrote the checkpoint (any string; nanoddp-train uses host, pid and start time, and
  // a resumed run takes over the id of the checkpoint it resumed). Housekeeping only ever
  // removes checkpoints of the same id: another run's in the same folder are not its to delete.
  std::string run_id;
  // Free-form settings recorded for the reader (model description, batch, world size).
  std::map<std::string, std::string> info;
};

// Writes `dir`/step-<step>.safetensors (creating `dir` if needed) and then removes the oldest
// of the checkpoints with the same run_id at earlier steps, so that `keep` of them remain
// (checkpoints of other runs, or unreadable ones, are never removed). An existing file of the
// same name is never overwritten: that is an Error naming it. Returns the path written.
// A sharded optimizer (ZeRO, comm/zero.h) holds only its shard: `optimizer_state` then gives
// the whole state in the flat layout (comm::Zero::full_optimizer_state()), so that the file is
// the same as without ZeRO and resumes at any world size and stage.
std::string save_checkpoint(const std::string& dir, const Module& model, const Optimizer& optimizer,
                            const TrainingState& state, int keep,
                            const std::vector<NamedTensor>* optimizer_state = nullptr);

// All step-*.safetensors regular files in `dir`, oldest first (by step number).
std::vector<std::string> list_checkpoints(const std::string& dir);
// The step a checkpoint file name says ("step-000000020.safetensors" -> 20); none for another
// name.
std::optional<std::int64_t> checkpoint_step_from_name(const std::string& filename);

// Loads `path` into the model's parameters and the optimizer's state, after checking the
// format version, the checksum, and that every tensor exists with the right shape. Any problem
// is an Error naming the file and what is wrong; the model is untouched then. A file named
// step-N.safetensors must record step N. Into a whole (not yet sharded) optimizer: ZeRO shards
// what was loaded.
TrainingState load_checkpoint(const std::string& path, Module& model, Optimizer& optimizer);

// Loads `path`, a safetensors file of parameters named as the model names them, into the model:
// what nanoddp-train --save writes, or what PyTorch writes for the same architecture with
// safetensors.torch.save_file(model.state_dict(), path) ("layers.0.weight", ...). Every
// parameter must be there with its shape, stored as F32, BF16, F16 or F64 (converted to float32),
// and a tensor the model has no parameter for is an error too, as with PyTorch's
// load_state_dict(strict=True): a silently ignored tensor would mean a silently different model.
// Everything is checked before the model is touched, NaN and Inf values included (a model that
// starts from them trains to NaN), and the tensor names from the header before the body is read
// (a file with other, perhaps huge, tensors is refused at once); errors name the file and the
// tensors. A training checkpoint (save_checkpoint) loads too: its parameters, for evaluation,
// with the optimizer's state skipped.
void load_parameters(const std::string& path, Module& model);

}  // namespace nanoddp::nn
