// Shared by `pipesched train` and `pipesched bench`: the TrainerConfig the flags
// describe, with range checks that name the flag.
#pragma once

#include "absl/status/statusor.h"
#include "cli/command.h"
#include "stages/trainer.h"

namespace pipesched::cli {

// The most --layers (hidden blocks) a run takes.
inline constexpr int kMaxLayers = 4096;

// Everything but the schedule name, P, V and M (bench sweeps those).
absl::StatusOr<stages::TrainerConfig> TrainerConfigFromFlags(const CommandContext& ctx);

}  // namespace pipesched::cli
