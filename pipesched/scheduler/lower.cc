// Lowering passes (scheduler/lower.h).
#include "pipesched/scheduler/lower.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/dependency_walk.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> PlaceAllReduce(const Schedule& schedule, int num_replicas) {
  if (num_replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the number of data-parallel replicas must be at least 1, not ", num_replicas));
  }
  // The shape first: the tables below are sized by P*V, which must not overflow (an
  // unvalidated schedule may have any P and V).
  PS_RETURN_IF_ERROR(internal::CheckShape(schedule));
  if (num_replicas == 1) return schedule;
  const int num_stages = schedule.num_stages();
  // Per stage: (rank, step) of its last backward, and whether it already has an ALLREDUCE.
  std::vector<int> last_rank(num_stages, -1), last_step(num_stages, -1);
  std::vector<bool> has_allreduce(num_stages, false);
  for (int rank = 0; rank < static_cast<int>(schedule.programs.size()); ++rank) {
    const std::vector<Action>& program = schedule.programs[rank];
    for (int step = 0; step < static_cast<int>(program.size()); ++step) {
      const Action& a = program[step];
      if (a.stage < 0 || a.stage >= num_stages) {
        return absl::InvalidArgumentError(
            absl::StrCat("action ", ToString(a), " on rank ", rank, " names stage ", a.stage,
                         " but the schedule has stages 0..", num_stages - 1));
      }
      if (a.op == Op::kAllReduce) has_allreduce[a.stage] = true;
      if (a.op == Op::kB || a.op == Op::kW) {
        last_rank[a.stage] = rank;
        last_step[a.stage] = step;
      }
    }
  }
  // Per rank: the stages to reduce after each step.
  std::vector<std::vector<std::vector<int>>> after(schedule.programs.size());
  for (int rank = 0; rank < static_cast<int>(schedule.programs.size()); ++rank) {
    after[rank].resize(schedule.programs[rank].size());
  }
  for (int stage = 0; stage < num_stages; ++stage) {
    if (has_allreduce[stage]) continue;
    if (last_rank[stage] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot place the all-reduce of stage ", stage,
          ": no rank runs a backward (B or W) of that stage; validate the schedule first"));
    }
    after[last_rank[stage]][last_step[stage]].push_back(stage);
  }
  Schedule lowered = schedule;
  for (int rank = 0; rank < static_cast<int>(schedule.programs.size()); ++rank) {
    std::vector<Action>& program = lowered.programs[rank];
    program.clear();
    for (int step = 0; step < static_cast<int>(schedule.programs[rank].size()); ++step) {
      program.push_back(schedule.programs[rank][step]);
      for (int stage : after[rank][step]) {
        program.push_back(Action{.stage = stage, .microbatch = -1, .op = Op::kAllReduce});
      }
    }
  }
  return lowered;
}

Schedule SplitBackward(Schedule schedule) {
  for (std::vector<Action>& program : schedule.programs) {
    if (std::none_of(program.begin(), program.end(),
                     [](const Action& a) { return a.op == Op::kB; }))
      continue;
    std::vector<Action> split;
    split.reserve(program.size() + program.size() / 2);
    for (const Action& a : program) {
      if (a.op != Op::kB) {
        split.push_back(a);
        continue;
      }
      split.push_back({a.stage, a.microbatch, Op::kI});
      split.push_back({a.stage, a.microbatch, Op::kW});
    }
    program = std::move(split);
  }
  return schedule;
}

}  // namespace pipesched::scheduler
