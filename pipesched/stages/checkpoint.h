// Training checkpoints: everything a Trainer needs to continue a run bit for bit (on the
// host backend: training N steps equals training K, saving, loading into a fresh Trainer
// and training N - K more). What it is not: a schedule snapshot -- the schedule, P, V, M
// and D may change between save and resume (the numbers then follow the new schedule),
// as long as the data set keeps its size (synthetic data: 8 x D x M x B samples).
//
// The file is safetensors (model/safetensors.h), written atomically (temporary file,
// fsync, rename, fsync of the directory: a failed or killed save leaves the previous
// checkpoint intact):
//   tensors   the parameters with the model's PyTorch names (blocks.{i}.weight, ...,
//             head.bias), as SaveParameters writes them, plus the optimizer state as
//             "optimizer.<param>.momentum" (SGD with momentum) or
//             "optimizer.<param>.exp_avg" / "optimizer.<param>.exp_avg_sq" (AdamW)
//   metadata  format=pipesched-checkpoint, version=1, step (optimizer steps taken),
//             data_cursor (next sample; the synthetic data and the order of samples are
//             functions of the seed, so the cursor is the whole data/RNG state),
//             data_samples, seed, model.{layers,hidden,inputs,classes}, optimizer
//             (sgd|adamw), optimizer.state (none|momentum|adamw), the optimizer's
//             hyper-parameters (informative), and checksum = "fnv1a64:<16 hex digits>"
//             over every other metadata entry and every tensor's name, dtype, shape
//             and bytes.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/model/safetensors.h"
#include "pipesched/stages/trainer.h"

namespace pipesched::stages {

struct CheckpointInfo {
  std::int64_t step = 0;         // optimizer steps taken when it was saved
  std::int64_t data_cursor = 0;  // the next sample
};

// Saves replica 0's parameters and optimizer state (replicas are identical after every
// step), the step count and the data cursor. Call between steps. Errors name the file.
// With TrainerConfig::pipeline every process of the pipeline must call it (the stages are
// gathered), or call MakeCheckpoint on the processes that do not write (in a
// two-dimensional job, the processes of the pipeline that writes).
absl::Status SaveCheckpoint(const Trainer& trainer, const std::string& path);
// The checkpoint SaveCheckpoint writes, in memory (every process of a pipeline calls it).
// FailedPrecondition when a parameter or optimizer state is not finite (Trainer::CheckFinite):
// LoadCheckpoint would refuse it.
absl::StatusOr<model::SafetensorsFile> MakeCheckpoint(const Trainer& trainer);

// Restores a checkpoint into every replica of `trainer` (with TrainerConfig::pipeline,
// into this process's stages: every process loads its own copy). InvalidArgument naming the file
// and what is wrong when it is truncated or not safetensors, not a pipesched checkpoint
// (parameters only: use Trainer::LoadParameters), corrupted (checksum mismatch), or
// written for another configuration (each differing model dimension, the optimizer or
// its state, the data set size, the seed), or with a step or data cursor out of range;
// NotFound when it does not exist.
absl::StatusOr<CheckpointInfo> LoadCheckpoint(const std::string& path, Trainer& trainer);

// The checksum a checkpoint's metadata must hold ("fnv1a64:<16 hex digits>", above), for
// tools that edit a checkpoint's metadata and write it again.
std::string CheckpointChecksum(const model::SafetensorsFile& file);

// The checksum check of LoadCheckpoint, also made by Trainer::LoadParameters (--init):
// when `file` carries pipesched's checksum entry ("checksum" = "fnv1a64:...") or is a
// pipesched checkpoint (format=pipesched-checkpoint), the checksum must match, else
// InvalidArgument "checkpoint <path> rejected: checksum mismatch: the file is corrupted
// (stored '...', computed '...')". A file written elsewhere, without the entry, passes.
absl::Status VerifyCheckpointChecksum(const model::SafetensorsFile& file, const std::string& path);

}  // namespace pipesched::stages
