// Selective activation recomputation chosen for a trainer: which stages must recompute
// (stages/recompute_stage_work.h) so that every rank's activations fit what its device
// has left once the model is on it. The choice is scheduler::RecomputeWithinMemory's
// (greedy: the rank that peaks highest recomputes the stage of its own that lowers its
// peak most, then what later choices made unnecessary is dropped), fed with what this
// executor really holds: a recomputing stage keeps its received input and boundary
// buffers, and drops its StageWork's stash (not WithRecompute's model, which keeps the
// input only). The peaks are the pre-flight check's (stages/memory_check.h): they
// depend on the order of each rank's program, not on timings, so no step is run.
//
//   TrainerConfig config = ...;               // config.device_memory_bytes on the host
//   auto plan = PlanRecompute(config);
//   config.recompute_stages = plan->stages;   // empty: it fits without
//   auto trainer = Trainer::Create(config);
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "stages/trainer.h"

namespace pipesched::stages {

struct RecomputePlan {
  std::vector<int> stages;  // ascending virtual stages; empty: every rank fits without
  // Per pipeline rank: what its device has left for activations once the model is on it
  // (the least over its replicas' devices), and its planned activation peak without
  // recomputation and with `stages` recomputing (at most room_bytes).
  std::vector<std::int64_t> room_bytes;
  std::vector<std::int64_t> peak_without;
  std::vector<std::int64_t> peak_with;
};

// Builds the trainer of `config` with every stage recomputing (its parameters are
// allocated, then freed on return) to learn each stage's bytes and each device's room,
// and chooses. The order is the one Trainer::Create makes of `config` (for a searched
// schedule, its unit-cost order: a search for measured costs afterwards is checked
// again by Create). Errors: InvalidArgument when `config` recomputes already
// (recompute, recompute_stages), when a device's size is not known (host devices
// without device_memory_bytes share the machine's memory) or when ranks share a device
// (their peaks add up: give each rank its own); ResourceExhausted when even every stage
// recomputing does not fit, naming the rank; what Trainer::Create refuses.
absl::StatusOr<RecomputePlan> PlanRecompute(const TrainerConfig& config);

}  // namespace pipesched::stages
