// Private to scheduler/: the checked, flat dependency structure of a schedule and the
// in-order walk that Validate() and Simulate() share, so that both accept exactly the
// same schedules and diagnose a deadlock with the same words.
//
// Not a public header: nothing outside scheduler/*.cc includes it.
//
// Dependencies are DESIGN.md's and no others:
//   F(s,m) after F(s-1,m);  B(s,m)/I(s,m) after F(s,m) and after B/I(s+1,m);
//   W(s,m) after I(s,m);    ALLREDUCE(s) after every B/W of stage s.
// Lowered SEND/RECV actions (PyTorch's semantics), only when a schedule has them:
//   SEND_F(s,m) after F(s,m);   SEND_B(s,m) after B/I(s,m)   (on the sender's rank);
//   RECV_F(s,m) after SEND_F(s-1,m);   RECV_B(s,m) after SEND_B(s+1,m)   (a receive
//   blocks until its send is issued);   F(s,m) after RECV_F(s,m);   B/I(s,m) after
//   RECV_B(s,m)   (a compute after the receive of its input, when there is one).
// Every send needs its receive and every receive its send; the transfer times are the
// compute dependencies' (the simulator draws no SEND/RECV span of its own).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler::internal {

inline constexpr int kNoAction = -1;
// Boundary value of a dependency that never crosses a stage boundary (F -> B of one
// stage, I -> W, backward -> ALLREDUCE): both ends always live on the same rank.
inline constexpr int kSameStage = -1;

// The shape checks that come before anything is sized by it: P, V and M >= 1, one
// program per rank, P*V (computed in int64) and the number of actions below INT32_MAX,
// and at least P*V*M actions (an F for each stage and micro-batch). After it,
// Schedule::num_stages() does not overflow. InvalidArgument naming the value otherwise.
absl::Status CheckShape(const Schedule& schedule);

// Every action has an id: its rank's offset plus its step in the rank's program.
class DependencyIndex {
 public:
  // Checks the shape (CheckShape), every action's stage, micro-batch and
  // rank, that every (stage, mb) has F once and either B once or I and W once each,
  // at most one ALLREDUCE per stage, each SEND/RECV at most once and matched by its
  // peer, the receives of each pair of ranks in the order of their sends (NCCL, and so
  // PyTorch, pairs them in order), and that no action waits for one that comes later on
  // its own rank.
  // InvalidArgument naming the action, with the grid, otherwise.
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

  struct CommSlot {  // ids of one (stage, mb)'s lowered transfers, kNoAction when absent
    int send_f = kNoAction;
    int recv_f = kNoAction;
    int send_b = kNoAction;
    int recv_b = kNoAction;
  };

  const Slot& SlotOf(int stage, int mb) const {
    return slots_[static_cast<std::size_t>(stage) * num_microbatches_ + mb];
  }
  // nullptr when the schedule has no SEND/RECV actions.
  const CommSlot* CommOf(int stage, int mb) const {
    return comm_.empty() ? nullptr
                         : &comm_[static_cast<std::size_t>(stage) * num_microbatches_ + mb];
  }
  absl::Status CheckTransfers(const Schedule& schedule) const;
  absl::Status CheckTransferOrder(const Schedule& schedule) const;
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
  std::vector<CommSlot> comm_;    // [stage * M + mb]; empty without SEND/RECV actions
};

// "rank 0 blocked at 0B1 (waits for 1B1 on rank 1)" for every rank whose next action
// cannot run (the first 8), the ranks of the cycle of waits that causes the deadlock
// first, and when other ranks only wait behind that cycle, "the cause: ranks 15 and 16
// wait for each other, and the other 28 blocked ranks wait behind them"; then the grid
// with the arrow at the cycle's first rank. FailedPrecondition.
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
  const int m = a.microbatch;
  // The transfer dependencies; their ids are kNoAction where a file has no such action
  // (Build has checked that every send has its receive and every receive its send).
  const CommSlot* comm = a.op == Op::kAllReduce ? nullptr : CommOf(s, m);
  auto transfer = [&](int id) {
    if (id != kNoAction) fn(id, kSameStage);
  };
  switch (a.op) {
    case Op::kF:
      if (s > 0) fn(SlotOf(s - 1, m).f, s - 1);
      if (comm != nullptr) transfer(comm->recv_f);
      return;
    case Op::kB:
    case Op::kI:
      fn(SlotOf(s, m).f, kSameStage);
      if (s + 1 < num_stages_) fn(SlotOf(s + 1, m).InputGrad(), s);
      if (comm != nullptr) transfer(comm->recv_b);
      return;
    case Op::kW:
      fn(SlotOf(s, m).i, kSameStage);
      return;
    case Op::kAllReduce:
      for (int mb = 0; mb < num_microbatches_; ++mb) fn(SlotOf(s, mb).LastBackward(), kSameStage);
      return;
    case Op::kSendF:
      fn(SlotOf(s, m).f, kSameStage);
      return;
    case Op::kSendB:
      fn(SlotOf(s, m).InputGrad(), kSameStage);
      return;
    case Op::kRecvF:
      transfer(CommOf(s - 1, m)->send_f);
      return;
    case Op::kRecvB:
      transfer(CommOf(s + 1, m)->send_b);
      return;
  }
}

template <typename Fn>
void DependencyIndex::ForEachDependent(const Action& a, Fn&& fn) const {
  const int s = a.stage;
  const int m = a.microbatch;
  const CommSlot* comm = a.op == Op::kAllReduce ? nullptr : CommOf(s, m);
  auto transfer = [&](int id) {
    if (id != kNoAction) fn(id);
  };
  switch (a.op) {
    case Op::kF:
      if (s + 1 < num_stages_) fn(SlotOf(s + 1, m).f);
      fn(SlotOf(s, m).InputGrad());
      if (comm != nullptr) transfer(comm->send_f);
      return;
    case Op::kB:
    case Op::kI:
      if (s > 0) fn(SlotOf(s - 1, m).InputGrad());
      if (a.op == Op::kI) {
        fn(SlotOf(s, m).w);
      } else if (allreduce_[s] != kNoAction) {
        fn(allreduce_[s]);
      }
      if (comm != nullptr) transfer(comm->send_b);
      return;
    case Op::kW:
      if (allreduce_[s] != kNoAction) fn(allreduce_[s]);
      return;
    case Op::kAllReduce:
      return;
    case Op::kSendF:
      transfer(CommOf(s + 1, m)->recv_f);
      return;
    case Op::kSendB:
      transfer(CommOf(s - 1, m)->recv_b);
      return;
    case Op::kRecvF:
      fn(SlotOf(s, m).f);
      return;
    case Op::kRecvB:
      fn(SlotOf(s, m).InputGrad());
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
