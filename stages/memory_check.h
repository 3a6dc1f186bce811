// Pre-flight check of activation memory: before the first step, does the activation
// memory a schedule's plan holds at its peak fit where it will live? Parameters,
// gradients and optimizer state are allocated when the executor is built (a model too
// large fails there); activations are allocated step by step, so without this check a
// configuration whose activations do not fit runs until the step that exhausts the
// memory -- minutes into a large run on a CPU.
//
// The plan's peak per rank is the simulator's RankStats::peak_live_bytes with each
// stage's Executor::activation_bytes and workspace_bytes: it depends only on the order
// of each rank's program, not on timings, and equals what the runtime measures (the
// executor contract test). Where several ranks share memory -- every host device without
// a capacity shares the machine's, ranks placed on one GPU share it -- their peaks are
// added: the ranks of GPipe, 1F1B and the zero-bubble schedules all reach (or come
// within one micro-batch of) their peaks in the same steady state, so the sum is the
// plan's peak there to within a micro-batch per rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/runtime.h"
#include "stages/executor.h"

namespace pipesched::stages {

// One place activations live in: the machine's memory (host devices without a
// capacity) or one device.
struct MemoryPlace {
  std::string name;                  // "host memory", "host:1", "cuda:0 (NVIDIA H200)"
  std::int64_t planned_bytes = 0;    // the plan's activation peak there: its ranks' peaks
  std::int64_t available_bytes = 0;  // what is free there now, for activations
  int ranks = 0;                     // (replica, rank) pairs there
  // The rank there with the largest peak: its index, micro-batches in flight at its peak
  // and bytes held then (for the message).
  int busiest_rank = 0;
  int busiest_microbatches = 0;
  std::int64_t busiest_bytes = 0;
};

// What the plan is, for the message.
struct PlanShape {
  std::string schedule;      // its name (or file name)
  int num_ranks = 1;         // P
  int num_microbatches = 1;  // M
};

// OK when every place's planned_bytes <= available_bytes. Otherwise ResourceExhausted,
// one sentence for the first place that does not fit: the schedule, the peak there and
// what makes it up, what is available, and what would fit -- a smaller
// --microbatch-size, --hidden or --layers; fewer --microbatches when the busiest rank
// holds all M; a schedule that keeps fewer in flight (1f1b: at most P per rank) when it
// holds more than P; more --stages (fewer layers on each) when the place is a device.
absl::Status CheckActivationsFit(const PlanShape& plan, const std::vector<MemoryPlace>& places);

// The places of `executor`'s (replica, rank) pairs with the plan's peaks added up:
// host devices without a capacity (Device::AvailableBytes() nullopt) form one place,
// "host memory", whose availability is `machine_available_bytes` (nullopt: unknown, the
// place is left out); every other device is its own place. The plan's peaks come from
// scheduler::Simulate (InvalidArgument if the bytes overflow); a device's error from
// AvailableBytes.
absl::StatusOr<std::vector<MemoryPlace>> ActivationPlaces(
    const Executor& executor, std::optional<std::int64_t> machine_available_bytes);

}  // namespace pipesched::stages
