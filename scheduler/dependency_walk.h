// Private to scheduler/: the checked, flat dependency structure of a schedule and the
// in-order walk that Validate() and Simulate() share, so that both accept exactly the
// same schedules and diagnose a deadlock with the same words.
//
// Not a public header: nothing outside scheduler/*.cc includes it.
//
// Dependencies are DESIGN.md's and no others:
//   F(s,m) after F(s-1,m);  B(s,m)/I(s,m) after F(s,m) and after B/I(s+1,m);
//   W(s,m) after I(s,m);    ALLREDUCE(s) after every B/W of stage s.
// Lowered SEND/RECV actions are zero-cost markers with no dependencies: the transfer
// they stand for is already implied by the compute dependencies above.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/schedule.h"

namespace pipesched::scheduler::internal {

inline constexpr int kNoAction = -1;
// Boundary value of a dependency that never crosses a stage boundary (F -> B of one
// stage, I -> W, backward -> ALLREDUCE): both ends always live on the same rank.
inline constexpr int kSameStage = -1;

// Every action has an id: its rank's offset plus its step in the rank's program.
class DependencyIndex {
 public:
  // Checks the shape (P, V, M, programs.size()), every action's stage, micro-batch and
  // rank, that every (stage, mb) has F once and either B once or I and W once each,
  // at most one ALLREDUCE per stage, and that no action waits for one that comes later
  // on its own rank. InvalidArgument naming the action, with the grid, otherwise.
  static absl::StatusOr<DependencyIndex> Build(const Schedule& schedule);

  int num_ranks() const { return num_ranks_; }
  int num_stages() const { return num_stages_; }
  int num_microbatches() const { return num_microbatches_; }
  int num_actions() const { return static_cast<int>(action_rank_.size()); }
  int Id(int rank, int step) const { return offsets_[rank] + step; }
  int RankOfId(int id) const { return action_rank_[id]; }
  int StepOfId(int id) const { return id - offsets_[action_rank_[id]]; }
  int RankOfStage(int stage) const { return stage_rank_[stage]; }
  const Action& ActionOf(int id) const { return (*programs_)[RankOfId(id)][StepOfId(id)]; }

  // Calls fn(dep_id, boundary) for each dependency of `a`; `boundary` is the stage
  // boundary b (b -> b+1) the data crosses, or kSameStage.
  template <typename Fn>
  void ForEachDep(const Action& a, Fn&& fn) const;
  // Calls fn(id) for each action that depends on `a`.
  template <typename Fn>
  void ForEachDependent(const Action& a, Fn&& fn) const;

  // True for the action that frees (stage, mb)'s stashed activation: B, or W when the
  // backward is split (W still reads the stage input).
  bool ReleasesActivation(const Action& a) const { return a.op == Op::kB || a.op == Op::kW; }

 private:
  struct Slot {  // ids of one (stage, mb)'s compute actions, kNoAction when absent
    int f = kNoAction;
    int b = kNoAction;
    int i = kNoAction;
    int w = kNoAction;
    // The action that hands the input gradient to stage-1: B, or I when split.
    int InputGrad() const { return b != kNoAction ? b : i; }
    // The last backward action: B, or W when split.
    int LastBackward() const { return b != kNoAction ? b : w; }
  };

  const Slot& SlotOf(int stage, int mb) const {
    return slots_[static_cast<std::size_t>(stage) * num_microbatches_ + mb];
  }
  absl::Status CheckProgramOrder(const Schedule& schedule) const;

  const std::vector<std::vector<Action>>* programs_ = nullptr;
  int num_ranks_ = 0;
  int num_stages_ = 0;
  int num_microbatches_ = 0;
  std::vector<int> offsets_;      // [rank] -> id of the rank's first action
  std::vector<int> action_rank_;  // [id] -> rank
  std::vector<int> stage_rank_;   // [stage] -> rank
  std::vector<Slot> slots_;       // [stage * M + mb]
  std::vector<int> allreduce_;    // [stage] -> id or kNoAction
};

// "rank 0 blocked at 0B1 (waits for 1B1 on rank 1)" for every rank whose next action
// cannot run, then the grid with the arrow at the first one. FailedPrecondition.
absl::Status DeadlockError(const Schedule& schedule, const DependencyIndex& index,
                           const std::vector<int>& next_step, const std::vector<uint8_t>& done);

// Runs every rank's program in order, an action as soon as its dependencies are done,
// calling on_run(rank, step, id, action) in a dependency-respecting order (deps of an
// action are reported before it). FailedPrecondition with DeadlockError() when the walk
// stops before the end.
template <typename OnRun>
absl::Status WalkInOrder(const Schedule& schedule, const DependencyIndex& index, OnRun&& on_run);

// ---------------------------------------------------------------------------------------
// Implementation of the templates.

template <typename Fn>
void DependencyIndex::ForEachDep(const Action& a, Fn&& fn) const {
  const int s = a.stage;
  switch (a.op) {
    case Op::kF:
      if (s > 0) fn(SlotOf(s - 1, a.microbatch).f, s - 1);
      return;
    case Op::kB:
    case Op::kI:
      fn(SlotOf(s, a.microbatch).f, kSameStage);
      if (s + 1 < num_stages_) fn(SlotOf(s + 1, a.microbatch).InputGrad(), s);
      return;
    case Op::kW:
      fn(SlotOf(s, a.microbatch).i, kSameStage);
      return;
    case Op::kAllReduce:
      for (int m = 0; m < num_microbatches_; ++m) fn(SlotOf(s, m).LastBackward(), kSameStage);
      return;
    default:  // lowered SEND/RECV: markers
      return;
  }
}

template <typename Fn>
void DependencyIndex::ForEachDependent(const Action& a, Fn&& fn) const {
  const int s = a.stage;
  switch (a.op) {
    case Op::kF:
      if (s + 1 < num_stages_) fn(SlotOf(s + 1, a.microbatch).f);
      fn(SlotOf(s, a.microbatch).InputGrad());
      return;
    case Op::kB:
    case Op::kI:
      if (s > 0) fn(SlotOf(s - 1, a.microbatch).InputGrad());
      if (a.op == Op::kI) {
        fn(SlotOf(s, a.microbatch).w);
      } else if (allreduce_[s] != kNoAction) {
        fn(allreduce_[s]);
      }
      return;
    case Op::kW:
      if (allreduce_[s] != kNoAction) fn(allreduce_[s]);
      return;
    default:
      return;
  }
}

template <typename OnRun>
absl::Status WalkInOrder(const Schedule& schedule, const DependencyIndex& index, OnRun&& on_run) {
  const int num_ranks = index.num_ranks();
  std::vector<int> next(num_ranks, 0);
  std::vector<uint8_t> done(index.num_actions(), 0);
  std::vector<uint8_t> queued(num_ranks, 1);
  std::vector<int> work(num_ranks);
  for (int r = 0; r < num_ranks; ++r) work[r] = num_ranks - 1 - r;  // rank 0 first
  int remaining = index.num_actions();

  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    queued[r] = 0;
    const std::vector<Action>& program = schedule.programs[r];
    while (next[r] < static_cast<int>(program.size())) {
      const Action& a = program[next[r]];
      bool ready = true;
      index.ForEachDep(a, [&](int dep, int) { ready = ready && done[dep]; });
      if (!ready) break;
      const int id = index.Id(r, next[r]);
      on_run(r, next[r], id, a);
      done[id] = 1;
      ++next[r];
      --remaining;
      // Wake the other ranks whose next action is one this action unblocks.
      index.ForEachDependent(a, [&](int dependent) {
        const int rd = index.RankOfId(dependent);
        if (rd != r && !queued[rd] && index.Id(rd, next[rd]) == dependent) {
          queued[rd] = 1;
          work.push_back(rd);
        }
      });
    }
  }
  if (remaining > 0) return DeadlockError(schedule, index, next, done);
  return absl::OkStatus();
}

}  // namespace pipesched::scheduler::internal
