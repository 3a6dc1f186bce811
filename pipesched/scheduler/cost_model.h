// Costs that drive the simulator: per virtual stage the duration of F, B, I, W and the
// activation bytes one micro-batch leaves stashed for backward; per stage boundary the
// transfer time; per stage the data-parallel all-reduce time. Units are arbitrary
// (unit costs by default, microseconds when fed from measurements).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/action.h"

namespace pipesched::scheduler {

// Bounds on every cost, one definition for cost files, schedule files and the --cost-*
// flags. Times above kMaxCostTime make makespans that the grid, the SVG and the trace
// cannot draw (1e308 overflowed to inf); 1e15 us is 31 years. Byte counts are at most
// kMaxCostBytes (1 PiB per micro-batch, beyond any device); their sums in the simulator
// are still checked, since thousands of micro-batches in flight can pass 2^63.
inline constexpr double kMaxCostTime = 1e15;
inline constexpr std::int64_t kMaxCostBytes = std::int64_t{1} << 50;

struct StageCosts {
  double f = 1;
  double b = 2;
  double i = 1;
  double w = 1;
  double allreduce = 0;
  std::int64_t activation_bytes = 0;  // stashed per in-flight micro-batch; 0 = unknown
  // Scratch a B or I of this stage holds only while it runs (allocated at its start,
  // freed at its end), on top of the stashes: the simulated peak is then the largest of
  // the live stashes and, during each B or I, the live stashes plus this.
  std::int64_t workspace_bytes = 0;
  // The part of activation_bytes that is the micro-batch's received input (stages > 0):
  // it becomes live when the rank's previous compute action starts, not at the F, because
  // the executor allocates the receive buffer there so that the transfer overlaps that
  // action (stages/executor.h). At most activation_bytes; 0 = all of it from the F.
  std::int64_t input_bytes = 0;
  // What the stage holds for the whole step whatever the schedule: its parameters,
  // gradients and optimizer state (train --save-costs measures them). Counted once on
  // its rank (SimResult's RankStats::static_bytes), next to the activations' peak, so
  // that a device's memory can be checked whole. 0 = not modelled.
  std::int64_t static_bytes = 0;
  // Activation recomputation (activation checkpointing): what the stage drops after each
  // F and rebuilds at the start of the micro-batch's backward by running its forward
  // again (the b and i times then include that forward). Live while the F runs, then
  // from the start of the B or I until the end of the B, or of the W when the backward
  // is split (W needs the rebuilt activations too); activation_bytes is then only what
  // the stage keeps from F to backward. 0 = nothing rebuilt (no recomputation, or
  // recomputation of a stage whose sizes are not modelled). WithRecompute turns costs
  // without it into costs with it.
  std::int64_t recompute_bytes = 0;
  // The stage recomputes even with nothing to rebuild: its b and i include the second
  // forward. Set by WithRecompute and WithRecomputeOn, and by files with "recompute":
  // true or recompute_bytes > 0; recomputes() is what to ask.
  bool recompute = false;
  // Once per training step, outside the schedule's actions: zeroing the stage's gradients
  // before its rank's first action, and its optimizer step after its rank's last action
  // and its all-reduce. They make the simulated step time (SimResult::step_time); the
  // makespan and the bubble change only where a rank's zero-grads hold its first action
  // back (ranks whose totals differ). 0 = not modelled.
  double zero_grad = 0;
  double optimizer = 0;

  // Activation recomputation is on: b and i include the second forward (with or without
  // activation sizes, which recompute_bytes > 0 implies).
  bool recomputes() const { return recompute || recompute_bytes > 0; }
};

struct CostModel {
  StageCosts uniform;              // used for stages beyond `stages`
  std::vector<StageCosts> stages;  // per virtual stage (optional)
  double comm_uniform = 0;         // transfer time across a boundary
  std::vector<double> comm;        // per boundary s -> s+1 (optional)
  // Per-action durations that override the stage's for that one action: (stage, op,
  // micro-batch) of a compute op -> duration. Empty normally; filled to replay one
  // measured step action by action (stages::WithActionDurations).
  std::map<std::tuple<int, Op, int>, double> actions;
  // Per-dependency transfer times that override Comm() for one cross-rank input: the
  // consuming compute action's (stage, op, micro-batch) -> time from its producer's end
  // until it may start. Empty normally; filled to replay a measured step's hand-offs
  // (stages::WithHandoffs) or to draw them (stages::SpreadBubble).
  std::map<std::tuple<int, Op, int>, double> transfers;
  // Time a rank's compute stream takes between the end of one compute action and the
  // start of the next when nothing else holds the next one back: the runtime's own
  // overhead between actions (on the host backend the stream's bookkeeping closures and
  // its thread's hand-over, on a GPU the launch gap between kernels). Not before a rank's
  // first action; a cross-rank input's transfer time runs from its producer's end, in
  // parallel with it. 0 = none (unit-cost planning, the closed forms).
  double action_gap = 0;
  // Per-action gaps that override action_gap: compute action (stage, op, micro-batch) ->
  // its gap after the previous compute action of its rank. Empty normally; filled to
  // replay a measured step's gaps (stages::WithHandoffs) or to draw them
  // (stages::SpreadBubble).
  std::map<std::tuple<int, Op, int>, double> gaps;
  // What the times are in: "unit" (abstract, the default), or "ns", "us", "ms", "s" --
  // "us" for the costs a run measured (train --save-costs). The simulated timeline takes
  // it, so that a Chrome trace of measured costs is in real time.
  std::string time_unit = "unit";

  const StageCosts& Stage(int stage) const {
    return stage >= 0 && static_cast<std::size_t>(stage) < stages.size() ? stages[stage] : uniform;
  }
  // Transfer time of boundary stage -> stage+1.
  double Comm(int boundary) const {
    return boundary >= 0 && static_cast<std::size_t>(boundary) < comm.size() ? comm[boundary]
                                                                             : comm_uniform;
  }
  // Duration of a compute or ALLREDUCE action (its entry in `actions` if it has one, else
  // its stage's); lowered SEND/RECV take Comm() of their boundary.
  double Duration(const Action& action) const;
  // Transfer time of the cross-rank input of compute action `consumer` across
  // `boundary`: its entry in `transfers` if it has one, else Comm(boundary).
  double TransferInto(const Action& consumer, int boundary) const;
  // The gap before compute action `action` when it follows another compute action of its
  // rank: its entry in `gaps` if it has one, else action_gap.
  double GapBefore(const Action& action) const;
};

// The same stages with activation recomputation: each keeps only its received input
// (input_bytes) from its F to its backward; the rest of its activation_bytes becomes
// recompute_bytes, rebuilt by running F again at the start of the B or I, which each take
// F longer (B = I + W still holds). What a stage keeps is thus the least any executor
// keeps: pipesched's also holds each micro-batch's output and gradient buffers until its
// backward (stages/executor.h), which costs measured by `train --recompute` include.
// InvalidArgument, naming the stage, when a stage's costs recompute already
// (recompute_bytes > 0: measured with recomputation, its times include it; the default
// counts only without a per-stage list), when B + F or I + F passes kMaxCostTime, or when
// `costs` carries per-action overrides (a replayed measured step, whose durations are what
// they were).
absl::StatusOr<CostModel> WithRecompute(const CostModel& costs);

// WithRecompute on the listed virtual stages only (selective recomputation), of a
// schedule with `num_stages` stages: costs without a per-stage list are first spread into
// one entry per stage, and the others keep their costs. InvalidArgument for a listed
// stage outside [0, num_stages) or listed twice, a per-stage list of another length, and
// what WithRecompute refuses for a listed stage (naming it).
absl::StatusOr<CostModel> WithRecomputeOn(const CostModel& costs, const std::vector<int>& stages,
                                          int num_stages);

// Parses the cost-model JSON file:
//   {"version": 1,
//    "default": {"f": 1, "b": 2, "i": 1, "w": 1, "allreduce": 0, "activation_bytes": 0,
//                "workspace_bytes": 0, "input_bytes": 0, "static_bytes": 0,
//                "recompute_bytes": 0, "zero_grad": 0, "optimizer": 0},
//    "stages": [{"f": 1.2, "b": 2.4}, ...],   // optional, fields default to "default"
//    "comm": 0.1 | [0.1, 0.2, ...],           // optional, uniform or per boundary
//    "action_gap": 0.01,                      // optional, CostModel::action_gap
//    "time_unit": "us"}                       // optional, CostModel::time_unit
// InvalidArgument naming the key and what is expected for anything else (times outside
// [0, kMaxCostTime], byte counts outside [0, kMaxCostBytes], unknown keys, wrong types,
// nesting deeper than base/json_util.h's limit).
absl::StatusOr<CostModel> ParseCostModelJson(std::string_view text);

// Whether a cost model read from a file fits a schedule of P ranks x V chunks: "stages"
// empty or one entry per virtual stage (P*V), "comm" empty (one number for all
// boundaries) or one entry per boundary s -> s+1 (P*V - 1). InvalidArgument stating the
// length expected otherwise. (CostModel::Stage() and Comm() fall back to the uniform
// values past the end of the lists; a file that is too short or too long is a mistake.)
// Also InvalidArgument, naming the stage, when a stage > 0 receives more input_bytes than
// its activation_bytes (what Simulate refuses too).
absl::Status CheckCostsFit(const CostModel& costs, int num_ranks, int num_chunks);

// InvalidArgument naming the first field that is out of range: a time (f, b, i, w,
// allreduce, zero_grad, optimizer of the default and of each stage, comm_uniform, each
// comm entry, action_gap, each entry of actions, transfers and gaps) that is not a number
// in [0, kMaxCostTime], or a byte count (activation_bytes, workspace_bytes, input_bytes,
// static_bytes, recompute_bytes) outside [0, kMaxCostBytes], or a time_unit other than
// "unit", "ns", "us", "ms", "s". ParseCostModelJson never returns such
// a model; a library caller (or a measured replay) may build one. Simulate and the searched
// generators check it first.
absl::Status CheckCostModel(const CostModel& costs);

// InvalidArgument naming the stage when a stage in [1, num_stages) receives more
// input_bytes than its activation_bytes (the received input is part of them; stage 0
// receives nothing). Simulate and CheckCostsFit both check it.
absl::Status CheckInputBytes(const CostModel& costs, std::int64_t num_stages);

}  // namespace pipesched::scheduler
