// Pre-flight check of activation memory: before the first step, does the activation
// memory a schedule's plan holds at its peak fit where it will live? Parameters,
// gradients and optimizer state are allocated when the executor is built (a model too
// large fails there); activations are allocated step by step, so without this check a
// configuration whose activations do not fit runs until the step that exhausts the
// memory -- minutes into a large run on a CPU.
//
// The plan's peak per rank is the simulator's RankStats::peak_live_bytes with each
// stage's Executor::activation_bytes, workspace_bytes and input_bytes: it depends only on the order
// of each rank's program, not on timings, and equals what the runtime measures (the
// executor contract test) when the executor accounts memory in stream order. Where
// several ranks share memory -- every host device takes its memory from the machine's
// (a capped one too), ranks placed on one GPU share it -- their peaks are added: the
// ranks of GPipe, 1F1B and the zero-bubble schedules all reach (or come within one
// micro-batch of) their peaks in the same steady state, so the sum is the plan's peak
// there to within a micro-batch per rank.
//
// A floor, not a guarantee: the runtime counts an allocation when the host issues it, so
// a host running ahead of its streams holds more than the plan unless the executor
// accounts exactly (ExecutorOptions::exact_memory_accounting, which a Trainer with a
// device memory cap turns on).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/executor.h"

namespace pipesched::stages {

// One place activations live in: the machine's memory or one device.
struct MemoryPlace {
  std::string name;                  // "host memory", "host:1", "cuda:0 (NVIDIA H200)"
  std::int64_t planned_bytes = 0;    // the plan's activation peak there: its ranks' peaks
  std::int64_t available_bytes = 0;  // what is free there now, for activations
  int ranks = 0;                     // (replica, rank) pairs there
  // The rank there with the largest peak: its index, the forward activations (one per F
  // of one of its chunks, so up to V x M) it holds at its peak, the bytes held then, and
  // what one micro-batch's activations on all its chunks take (for the message).
  int busiest_rank = 0;
  int busiest_activations = 0;
  std::int64_t busiest_bytes = 0;
  std::int64_t busiest_microbatch_bytes = 0;
  // ActivationPlaces: the pipeline rank of each (replica, rank) there, in order.
  std::vector<int> members;
};

// What the plan is, for the message.
struct PlanShape {
  std::string schedule;      // its name (or file name)
  int num_ranks = 1;         // P
  int num_chunks = 1;        // V
  int num_microbatches = 1;  // M
  // The fixes the message suggests, in the words of whoever runs the plan; the defaults
  // are pipesched's command line (an embedder names their own knobs, or quantities).
  // The first fix suggested: what makes one micro-batch's activations smaller.
  std::string smaller = "a smaller --microbatch-size, --hidden or --layers";
  std::string fewer_microbatches = "fewer --microbatches";
  std::string more_devices = "more devices (--devices)";  // ranks share a device
  std::string more_stages = "more --stages (fewer layers on each device)";
};

// OK when every place's planned_bytes <= available_bytes. Otherwise ResourceExhausted,
// one sentence for the first place that does not fit: the schedule, the peak there and
// what makes it up, what is available, and what would fit -- PlanShape::smaller (a
// smaller --microbatch-size, --hidden or --layers); fewer --microbatches when the busiest rank
// holds all V x M activations; a schedule that keeps fewer in flight (1f1b: at most P
// micro-batches per rank) when the busiest rank holds more than P micro-batches of all
// its chunks; on a device holding one rank, more --stages (fewer layers on each); on a
// device holding several, more devices (--devices).
absl::Status CheckActivationsFit(const PlanShape& plan, const std::vector<MemoryPlace>& places);

// The place rank `rank` of a simulated plan makes on its own: its peak
// (planned_bytes = busiest_bytes), the activations it holds then, and the bytes of one
// micro-batch on all its chunks (from `costs`' activation_bytes); ranks = 1. The name and
// the available bytes are the caller's.
MemoryPlace RankPlace(const scheduler::Schedule& schedule, const scheduler::CostModel& costs,
                      const scheduler::SimResult& sim, int rank);

// The places of `executor`'s (replica, rank) pairs with the plan's peaks added up
// (saturating at 2^63 - 1): every device with memory of its own (Device::AvailableBytes
// not nullopt: a GPU, a host device with a capacity) is a place, and every host device,
// with a capacity or not, also counts towards "host memory", the machine's, whose
// availability is `machine_available_bytes` (nullopt: unknown, that place is left out).
// The plan's peaks come from scheduler::Simulate (InvalidArgument if a rank's bytes
// overflow); a device's error from AvailableBytes. With ExecutorOptions::pipeline, this
// process's ranks only (each process checks the memory it has).
absl::StatusOr<std::vector<MemoryPlace>> ActivationPlaces(
    const Executor& executor, std::optional<std::int64_t> machine_available_bytes);

}  // namespace pipesched::stages
