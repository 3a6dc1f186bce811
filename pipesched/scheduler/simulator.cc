// Simulate(): list scheduling of each rank's program under a cost model.
//
// Semantics (one compute stream and one collective stream per rank):
// - A rank runs its program in order. A compute action (F, B, I, W) starts at
//     max(rank's compute lane free, each dependency's end [+ CostModel::TransferInto()
//         -- Comm(boundary) unless overridden for this action -- when the dependency ran
//         on another rank])
//   and lasts CostModel::Duration(); it occupies trace::kComputeLane. When it is not the
//   rank's first compute action, the lane is free only CostModel::GapBefore() after the
//   previous one ended (the runtime's overhead between actions; 0 unless measured).
// - ALLREDUCE runs on trace::kCommLane: it starts when the rank's comm lane is free and
//   every B/W of its stage is done, and does NOT hold the compute lane (the executor
//   runs it on its own stream, overlapping the remaining backward). It counts towards
//   the makespan, not towards a rank's busy time.
// - A cross-rank transfer is not contended: it is drawn as a span of its time on
//   the sending rank's trace::kSendLane ("SEND_F" / "SEND_B", with the sender's stage
//   and micro-batch) only when that time is > 0, and every cross-rank dependency is a
//   trace::Flow from the producing span to the consuming one.
// - Lowered SEND/RECV actions are zero-time markers: the transfers are already modelled
//   by the dependencies, so they are neither drawn nor charged.
// - busy = compute time on the compute lane; idle = makespan - busy.
// - Outside the actions: a rank's compute lane first zeroes the gradients of each of its
//   stages (StageCosts::zero_grad, in stage order), and after its last compute action
//   (and CostModel::action_gap) runs each of its stages' optimizer step
//   (StageCosts::optimizer), not before that stage's ALLREDUCE has ended. The timeline
//   and the makespan start at the first action; SimResult::step_time runs from the start
//   of the zero-grads to the end of the last optimizer step.
#include "pipesched/scheduler/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_format.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/dependency_walk.h"
#include "pipesched/scheduler/lower.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {

using internal::DependencyIndex;
using internal::kSameStage;

namespace {

// Whether some stage of `schedule` has an all-reduce time in `costs` but no ALLREDUCE
// action to spend it on.
// Checks the shape only when some stage has such a time, so that the common case (and
// every Simulate of a search) pays nothing.
absl::StatusOr<bool> MissesAllReduces(const Schedule& schedule, const CostModel& costs) {
  bool any = costs.uniform.allreduce > 0;
  for (const StageCosts& stage : costs.stages) any = any || stage.allreduce > 0;
  if (!any) return false;
  PS_RETURN_IF_ERROR(internal::CheckShape(schedule));  // the table below is P x V
  std::vector<char> reduced(std::max(schedule.num_stages(), 0), 0);
  for (const std::vector<Action>& program : schedule.programs) {
    for (const Action& a : program) {
      if (a.op == Op::kAllReduce && a.stage >= 0 && a.stage < schedule.num_stages()) {
        reduced[a.stage] = 1;
      }
    }
  }
  for (int stage = 0; stage < schedule.num_stages(); ++stage) {
    if (!reduced[stage] && costs.Stage(stage).allreduce > 0) return true;
  }
  return false;
}

absl::StatusOr<SimResult> SimulateAsGiven(const Schedule& schedule, const CostModel& costs);

}  // namespace

absl::StatusOr<SimResult> Simulate(const Schedule& schedule, const CostModel& costs) {
  PS_ASSIGN_OR_RETURN(const bool misses_allreduces, MissesAllReduces(schedule, costs));
  if (misses_allreduces) {
    PS_RETURN_IF_ERROR(Validate(schedule));  // PlaceAllReduce needs every backward there
    PS_ASSIGN_OR_RETURN(Schedule reduced, PlaceAllReduce(schedule, /*num_replicas=*/2));
    // Only the stages with a time: the others have nothing to reduce.
    for (std::vector<Action>& program : reduced.programs) {
      std::erase_if(program, [&](const Action& a) {
        return a.op == Op::kAllReduce && costs.Stage(a.stage).allreduce <= 0;
      });
    }
    return SimulateAsGiven(reduced, costs);
  }
  return SimulateAsGiven(schedule, costs);
}

namespace {

absl::StatusOr<SimResult> SimulateAsGiven(const Schedule& schedule, const CostModel& costs) {
  PS_ASSIGN_OR_RETURN(const DependencyIndex index, DependencyIndex::Build(schedule));
  const int P = index.num_ranks();
  const int N = index.num_actions();
  // Every time and byte count in range first: a negative time overlaps two pieces of
  // work on one lane, one that is not a number would read as a duration's fault.
  PS_RETURN_IF_ERROR(CheckCostModel(costs));
  // Per-stage entries for another shape would be read for the wrong stages, or not at all.
  PS_RETURN_IF_ERROR(CheckCostsFit(costs, schedule.num_ranks(), schedule.num_chunks()));

  // The stages of each rank, in order: their zero-grads hold its compute lane first.
  std::vector<std::vector<int>> stages_of(P);
  for (int stage = 0; stage < schedule.num_stages(); ++stage) {
    stages_of[schedule.placement.RankOf(stage)].push_back(stage);
  }
  // start/end: [action id]; markers get a zero-length interval at the rank's time.
  std::vector<double> start(N, 0), end(N, 0);
  std::vector<double> compute_free(P, 0), comm_free(P, 0);
  std::vector<trace::Span> phases;  // on the step's clock until the shift below
  auto add_phase = [&phases](int r, int stage, const char* op, double from, double to) {
    if (to > from) {
      phases.push_back(trace::Span{.rank = r, .stage = stage, .op = op, .start = from, .end = to});
    }
  };
  for (int r = 0; r < P; ++r) {
    for (int stage : stages_of[r]) {
      const double from = compute_free[r];
      compute_free[r] += costs.Stage(stage).zero_grad;
      add_phase(r, stage, "ZERO_GRAD", from, compute_free[r]);
    }
  }
  std::vector<double> allreduce_end(schedule.num_stages(), 0);  // [stage]
  std::vector<char> computed(P, 0);  // whether the rank ran a compute action yet
  int not_finite = -1;               // the first action whose end is not a finite time
  PS_RETURN_IF_ERROR(
      internal::WalkInOrder(schedule, index, [&](int r, int, int id, const Action& a) {
        const bool compute = IsCompute(a.op);
        if (!compute && a.op != Op::kAllReduce) {
          start[id] = end[id] = compute_free[r];
          return;
        }
        double& lane_free = compute ? compute_free[r] : comm_free[r];
        double t = lane_free;
        // No gap after the zero-grads either: the first action was issued long before and
        // follows them at once (0.5 us on the host backend).
        if (compute && computed[r]) t += costs.GapBefore(a);
        if (compute) computed[r] = 1;
        index.ForEachDep(a, [&](int dep, int boundary) {
          double ready = end[dep];
          if (boundary != kSameStage && index.RankOfId(dep) != r)
            ready += costs.TransferInto(a, boundary);
          t = std::isnan(ready) ? ready : std::max(t, ready);  // a NaN must not vanish
        });
        start[id] = t;
        end[id] = t + costs.Duration(a);
        if (not_finite < 0 && !std::isfinite(end[id])) not_finite = id;
        lane_free = end[id];
        if (a.op == Op::kAllReduce && a.stage >= 0 && a.stage < schedule.num_stages()) {
          allreduce_end[a.stage] = std::max(allreduce_end[a.stage], end[id]);
        }
      }));
  if (not_finite >= 0) {
    const Action& a = index.ActionOf(not_finite);
    return absl::InvalidArgumentError(absl::StrFormat(
        "the simulated time is not finite: %s on rank %d ends at %g (duration %g); every "
        "cost must be a number in [0, %g]",
        ToString(a), index.RankOfId(not_finite), end[not_finite], costs.Duration(a), kMaxCostTime));
  }

  // The optimizer steps, then the step's end; then the action times from the first
  // action, as a measured timeline's are.
  SimResult result;
  double first_start = N > 0 ? std::numeric_limits<double>::infinity() : 0;
  for (int id = 0; id < N; ++id) {
    const Op op = index.ActionOf(id).op;
    if (IsCompute(op) || op == Op::kAllReduce) first_start = std::min(first_start, start[id]);
    result.step_time = std::max(result.step_time, end[id]);
  }
  if (!std::isfinite(first_start)) first_start = 0;
  for (int r = 0; r < P; ++r) {
    double t = compute_free[r];
    bool any = false;
    for (int stage : stages_of[r]) any |= costs.Stage(stage).optimizer > 0;
    if (any && computed[r]) t += costs.action_gap;
    // Every stage's all-reduce holds the optimizer steps after it back, even one that
    // costs nothing itself (the executor waits for each in stage order).
    for (int stage : stages_of[r]) {
      const double from = std::max(t, allreduce_end[stage]);
      t = from + costs.Stage(stage).optimizer;
      add_phase(r, stage, "OPTIMIZER", from, t);
    }
    result.step_time = std::max(result.step_time, t);
  }
  if (!std::isfinite(result.step_time)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the simulated step time is not finite (%g); every cost must be a number in [0, %g]",
        result.step_time, kMaxCostTime));
  }
  for (int id = 0; id < N; ++id) {
    start[id] -= first_start;
    end[id] -= first_start;
  }
  for (trace::Span& s : phases) {
    s.start -= first_start;
    s.end -= first_start;
  }
  result.phases = std::move(phases);

  trace::Timeline& timeline = result.timeline;
  timeline.name = absl::StrFormat("%s P=%d V=%d M=%d (simulated)", schedule.name, P,
                                  schedule.num_chunks(), schedule.num_microbatches);
  timeline.time_unit = costs.time_unit;
  timeline.num_ranks = P;
  // Each compute action has at most one cross-rank dependency: at most N flows and N
  // transfer spans. Reserving up front avoids regrowing tens of MB at P=64, M=1024.
  const bool draws_transfers =
      costs.comm_uniform > 0 || !costs.comm.empty() || !costs.transfers.empty();
  timeline.spans.reserve(draws_transfers ? 2 * static_cast<std::size_t>(N) : N);
  timeline.flows.reserve(N);
  result.ranks.assign(P, RankStats{});

  // Spans in program order per rank; live activations counted in the same order, which
  // is time order on a rank's compute lane (its actions never overlap, and a release at
  // t comes before an F starting at t). An F of a stage > 0 that is not its rank's first
  // compute action has its input_bytes live from the start of the compute action before
  // it (the executor's receive buffer, allocated there so the transfer overlaps it).
  std::vector<int> span_of(N, -1);
  for (int r = 0; r < P; ++r) {
    RankStats& stats = result.ranks[r];
    int live = 0;
    std::int64_t live_bytes = 0;
    const std::vector<Action>& program = schedule.programs[r];
    std::int64_t prefetched = 0;  // input_bytes of the rank's next F, live already
    int next = 0;                 // program index of the next compute action after `step`
    for (int step = 0; step < static_cast<int>(program.size()); ++step) {
      const Action& a = program[step];
      const int id = index.Id(r, step);
      const bool compute = IsCompute(a.op);
      if (!compute && a.op != Op::kAllReduce) continue;
      span_of[id] = static_cast<int>(timeline.spans.size());
      timeline.spans.push_back(trace::Span{
          .rank = r,
          .lane = compute ? trace::kComputeLane : trace::kCommLane,
          .stage = a.stage,
          .microbatch = compute ? a.microbatch : -1,
          .op = std::string(OpName(a.op)),
          .start = start[id],
          .end = end[id],
      });
      result.makespan = std::max(result.makespan, end[id]);
      if (!compute) continue;
      stats.busy += end[id] - start[id];
      const StageCosts& stage_costs = costs.Stage(a.stage);
      const std::int64_t bytes = stage_costs.activation_bytes;
      auto overflow = [&](std::int64_t added, const char* what) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d's live bytes overflow 64 bits at %s: %d bytes live plus %s %d; the "
            "micro-batches in flight times activation_bytes must stay below 2^63: use smaller "
            "activation_bytes, workspace_bytes, input_bytes or recompute_bytes, or fewer "
            "micro-batches",
            r, ToString(a), live_bytes, what, added));
      };
      auto add = [&](std::int64_t added, const char* what) -> absl::Status {
        std::int64_t sum = 0;
        if (__builtin_add_overflow(live_bytes, added, &sum)) return overflow(added, what);
        live_bytes = sum;
        return absl::OkStatus();
      };
      if (a.op == Op::kF) {
        ++live;
        PS_RETURN_IF_ERROR(add(bytes - prefetched, "activation_bytes"));
        prefetched = 0;
        stats.peak_live_microbatches = std::max(stats.peak_live_microbatches, live);
      }
      // The receive buffer of the rank's next compute action, when that is an F with an
      // input, is allocated before this action starts.
      next = std::max(next, step + 1);
      while (next < static_cast<int>(program.size()) && !IsCompute(program[next].op)) ++next;
      if (next < static_cast<int>(program.size()) && program[next].op == Op::kF &&
          program[next].stage > 0) {
        prefetched = costs.Stage(program[next].stage).input_bytes;
        PS_RETURN_IF_ERROR(add(prefetched, "input_bytes"));
      }
      const std::int64_t recompute = stage_costs.recompute_bytes;
      if (a.op == Op::kB || a.op == Op::kI) {
        // Recomputation rebuilds the dropped activations at the backward's start.
        PS_RETURN_IF_ERROR(add(recompute, "recompute_bytes"));
      }
      stats.peak_live_bytes = std::max(stats.peak_live_bytes, live_bytes);
      // Held only while the action runs: a B's or I's scratch, before it releases the
      // stash; an F's activations that recomputation drops at its end.
      const std::int64_t transient = a.op == Op::kB || a.op == Op::kI ? stage_costs.workspace_bytes
                                     : a.op == Op::kF                 ? recompute
                                                                      : 0;
      std::int64_t with_transient = 0;
      if (__builtin_add_overflow(live_bytes, transient, &with_transient)) {
        return overflow(transient, a.op == Op::kF ? "recompute_bytes" : "workspace_bytes");
      }
      stats.peak_live_bytes = std::max(stats.peak_live_bytes, with_transient);
      if (index.ReleasesActivation(a)) {
        --live;
        live_bytes -= bytes + recompute;
      }
    }
  }

  // Cross-rank dependencies: a flow each, and a transfer span when it takes time.
  for (int id = 0; id < N; ++id) {
    if (span_of[id] < 0) continue;
    const Action& a = index.ActionOf(id);
    const int r = index.RankOfId(id);
    index.ForEachDep(a, [&](int dep, int boundary) {
      const int from_rank = index.RankOfId(dep);
      if (boundary == kSameStage || from_rank == r) return;
      timeline.flows.push_back(trace::Flow{.from = span_of[dep], .to = span_of[id]});
      const double comm = costs.TransferInto(a, boundary);
      if (comm <= 0) return;
      const Action& sender = index.ActionOf(dep);
      timeline.spans.push_back(trace::Span{
          .rank = from_rank,
          .lane = trace::kSendLane,
          .stage = sender.stage,
          .microbatch = sender.microbatch,
          .op = sender.op == Op::kF ? "SEND_F" : "SEND_B",
          .start = end[dep],
          .end = end[dep] + comm,
      });
    });
  }

  double total_busy = 0;
  double total_idle = 0;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    // At most P x V x 2^50 = 2^84 in all would overflow: saturate (nothing holds 2^62).
    std::int64_t& held = result.ranks[schedule.placement.RankOf(s)].static_bytes;
    held = std::min<std::int64_t>(held + costs.Stage(s).static_bytes, std::int64_t{1} << 62);
  }
  for (RankStats& stats : result.ranks) {
    stats.idle = result.makespan - stats.busy;
    total_busy += stats.busy;
    total_idle += stats.idle;
  }
  result.bubble_fraction = result.makespan > 0 ? total_idle / (P * result.makespan) : 0;
  result.bubble_ratio = total_busy > 0 ? total_idle / total_busy : 0;
  return result;
}

}  // namespace
}  // namespace pipesched::scheduler
