// The checked dependency index and the deadlock diagnosis shared by Validate() and
// Simulate(). Every error is one line naming the problem and the action, then the
// rank x step grid with an arrow at that action.
#include "pipesched/scheduler/dependency_walk.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pipesched/base/status.h"

namespace pipesched::scheduler::internal {
namespace {

std::string Name(const Action& a) { return ToString(a); }

absl::Status Invalid(const Schedule& schedule, int rank, int step, const std::string& line) {
  return absl::InvalidArgumentError(
      absl::StrCat(line, "\n", RenderProgramGrid(schedule, rank, step)));
}

absl::Status InvalidAt(const Schedule& schedule, int rank, int step, const std::string& what) {
  return Invalid(schedule, rank, step,
                 absl::StrFormat("rank %d step %d: action %s %s", rank, step,
                                 Name(schedule.programs[rank][step]), what));
}

// The boundary a lowered transfer crosses, which must exist.
bool TransferHasPeer(const Action& a, int num_stages) {
  switch (a.op) {
    case Op::kSendF:
    case Op::kRecvB:
      return a.stage + 1 < num_stages;
    case Op::kSendB:
    case Op::kRecvF:
      return a.stage > 0;
    default:
      return true;
  }
}

}  // namespace

absl::Status CheckShape(const Schedule& schedule) {
  const Placement& placement = schedule.placement;
  const int P = placement.num_ranks;
  const int V = placement.num_chunks;
  const int M = schedule.num_microbatches;
  if (P < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("schedule '%s': P (ranks) must be >= 1, got %d", schedule.name, P));
  }
  if (V < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "schedule '%s': V (chunks per rank) must be >= 1, got %d", schedule.name, V));
  }
  if (M < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("schedule '%s': M (micro-batches) must be >= 1, got %d", schedule.name, M));
  }
  if (schedule.programs.size() != static_cast<std::size_t>(P)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("schedule '%s': has %d rank programs but P = %d", schedule.name,
                        schedule.programs.size(), P));
  }
  const int64_t S = static_cast<int64_t>(P) * V;
  const std::size_t total = schedule.NumActions();
  if (total >= static_cast<std::size_t>(INT32_MAX) || S >= INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrFormat("schedule '%s': %d actions over %d stages is more than this tool handles",
                        schedule.name, total, S));
  }
  if (absl::Status placed = CheckPlacement(placement); !placed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("schedule '%s': %s", schedule.name, placed.message()));
  }
  // Every (stage, mb) needs at least an F and a backward: refuse before allocating a
  // table sized by a bogus M (or P*V).
  if (S * M > static_cast<int64_t>(total)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "schedule '%s': has %d actions, fewer than the P*V*M = %d*%d*%d = %d forwards it "
        "needs (plus a backward each); most actions are missing",
        schedule.name, total, P, V, M, S * M));
  }
  return absl::OkStatus();
}

absl::StatusOr<DependencyIndex> DependencyIndex::Build(const Schedule& schedule) {
  PS_RETURN_IF_ERROR(CheckShape(schedule));
  const Placement& placement = schedule.placement;
  const int P = placement.num_ranks;
  const int V = placement.num_chunks;
  const int M = schedule.num_microbatches;
  const int64_t S = static_cast<int64_t>(P) * V;
  const std::size_t total = schedule.NumActions();

  DependencyIndex index;
  index.programs_ = &schedule.programs;
  index.num_ranks_ = P;
  index.num_stages_ = static_cast<int>(S);
  index.num_microbatches_ = M;
  index.offsets_.resize(P + 1);
  index.action_rank_.resize(total);
  index.stage_rank_.resize(S);
  index.slots_.assign(static_cast<std::size_t>(S) * M, Slot{});
  index.allreduce_.assign(S, kNoAction);
  for (int s = 0; s < S; ++s) index.stage_rank_[s] = placement.RankOf(s);

  int id = 0;
  for (int r = 0; r < P; ++r) {
    index.offsets_[r] = id;
    const std::vector<Action>& program = schedule.programs[r];
    for (int step = 0; step < static_cast<int>(program.size()); ++step, ++id) {
      index.action_rank_[id] = r;
      const Action& a = program[step];
      if (static_cast<int>(a.op) >= kNumOps) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("has op %d, not one of F, B, I, W, SEND_F, RECV_F, "
                                         "SEND_B, RECV_B, ALLREDUCE",
                                         static_cast<int>(a.op)));
      }
      if (a.stage < 0 || a.stage >= S) {
        return InvalidAt(
            schedule, r, step,
            absl::StrFormat("has stage %d, outside [0, %d) (P=%d x V=%d)", a.stage, S, P, V));
      }
      if (a.op != Op::kAllReduce && (a.microbatch < 0 || a.microbatch >= M)) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("has micro-batch %d, outside [0, %d)", a.microbatch, M));
      }
      // Its micro-batch is ignored; one that is not the documented -1 is a mistake.
      if (a.op == Op::kAllReduce && a.microbatch != -1) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("has micro-batch %d; an ALLREDUCE reduces every "
                                         "micro-batch of its stage and takes -1",
                                         a.microbatch));
      }
      if (index.stage_rank_[a.stage] != r) {
        return InvalidAt(
            schedule, r, step,
            absl::StrFormat("is on rank %d but stage %d is placed on rank %d (%s "
                            "placement, P=%d, V=%d)",
                            r, a.stage, index.stage_rank_[a.stage], placement.Describe(), P, V));
      }
      if (!TransferHasPeer(a, static_cast<int>(S))) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("transfers across a boundary that does not exist "
                                         "(stages are 0..%d)",
                                         S - 1));
      }
      int* slot_id = nullptr;
      if (a.op == Op::kAllReduce) {
        slot_id = &index.allreduce_[a.stage];
      } else if (!IsCompute(a.op)) {  // a lowered transfer
        if (index.comm_.empty()) index.comm_.assign(static_cast<std::size_t>(S) * M, CommSlot{});
        CommSlot& comm = index.comm_[static_cast<std::size_t>(a.stage) * M + a.microbatch];
        slot_id = a.op == Op::kSendF   ? &comm.send_f
                  : a.op == Op::kRecvF ? &comm.recv_f
                  : a.op == Op::kSendB ? &comm.send_b
                                       : &comm.recv_b;
      } else {
        Slot& slot = index.slots_[static_cast<std::size_t>(a.stage) * M + a.microbatch];
        switch (a.op) {
          case Op::kF:
            slot_id = &slot.f;
            break;
          case Op::kB:
            slot_id = &slot.b;
            break;
          case Op::kI:
            slot_id = &slot.i;
            break;
          case Op::kW:
            slot_id = &slot.w;
            break;
          default:
            break;
        }
      }
      if (slot_id == nullptr) continue;
      if (*slot_id != kNoAction) {
        const int first_rank = index.action_rank_[*slot_id];
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("is a duplicate (first at rank %d step %d)", first_rank,
                                         *slot_id - index.offsets_[first_rank]));
      }
      *slot_id = id;
    }
  }
  index.offsets_[P] = id;

  // Completeness, and B never mixed with I/W.
  for (int s = 0; s < S; ++s) {
    for (int m = 0; m < M; ++m) {
      const Slot& slot = index.SlotOf(s, m);
      const int r = index.stage_rank_[s];
      auto at = [&](int action_id, const std::string& what) {
        return InvalidAt(schedule, r, action_id - index.offsets_[r], what);
      };
      const std::string f_name = Name(Action{s, m, Op::kF});
      if (slot.b != kNoAction && (slot.i != kNoAction || slot.w != kNoAction)) {
        const int split = slot.i != kNoAction ? slot.i : slot.w;
        const int later = std::max(slot.b, split);
        return at(later,
                  absl::StrFormat("mixes a full backward B with a split backward I/W for stage %d "
                                  "micro-batch %d; use either B, or I and W",
                                  s, m));
      }
      const int any_backward = std::max({slot.b, slot.i, slot.w});
      if (slot.f == kNoAction) {
        const std::string line =
            absl::StrFormat("missing action %s: stage %d micro-batch %d has no forward on rank %d",
                            f_name, s, m, r);
        if (any_backward != kNoAction) return at(any_backward, "has no matching forward " + f_name);
        // Nothing to point at: mark the end of the rank's program, where it is missing.
        return Invalid(schedule, r, static_cast<int>(schedule.programs[r].size()), line);
      }
      if (slot.b == kNoAction && slot.i == kNoAction && slot.w == kNoAction) {
        return at(slot.f, absl::StrFormat("has no backward: missing action %s (or %s and %s)",
                                          Name(Action{s, m, Op::kB}), Name(Action{s, m, Op::kI}),
                                          Name(Action{s, m, Op::kW})));
      }
      if (slot.i != kNoAction && slot.w == kNoAction) {
        return at(slot.i, "has no matching W: missing action " + Name(Action{s, m, Op::kW}));
      }
      if (slot.w != kNoAction && slot.i == kNoAction) {
        return at(slot.w, "has no matching I: missing action " + Name(Action{s, m, Op::kI}));
      }
    }
  }
  PS_RETURN_IF_ERROR(index.CheckTransfers(schedule));
  PS_RETURN_IF_ERROR(index.CheckTransferOrder(schedule));
  PS_RETURN_IF_ERROR(index.CheckProgramOrder(schedule));
  return index;
}

// Every send has the one receive on the consumer's rank that takes it, and every receive
// the send it takes (duplicates were refused while indexing).
absl::Status DependencyIndex::CheckTransfers(const Schedule& schedule) const {
  if (comm_.empty()) return absl::OkStatus();
  for (int s = 0; s < num_stages_; ++s) {
    for (int m = 0; m < num_microbatches_; ++m) {
      const CommSlot& comm = *CommOf(s, m);
      // (this end's id, the peer's stage, the peer's id, the peer's op)
      struct End {
        int id;
        int peer_stage;
        int peer_id;
        Op peer_op;
      };
      const End ends[] = {
          {comm.send_f, s + 1, comm.send_f != kNoAction ? CommOf(s + 1, m)->recv_f : kNoAction,
           Op::kRecvF},
          {comm.recv_f, s - 1, comm.recv_f != kNoAction ? CommOf(s - 1, m)->send_f : kNoAction,
           Op::kSendF},
          {comm.send_b, s - 1, comm.send_b != kNoAction ? CommOf(s - 1, m)->recv_b : kNoAction,
           Op::kRecvB},
          {comm.recv_b, s + 1, comm.recv_b != kNoAction ? CommOf(s + 1, m)->send_b : kNoAction,
           Op::kSendB},
      };
      for (const End& end : ends) {
        if (end.id == kNoAction || end.peer_id != kNoAction) continue;
        const int r = action_rank_[end.id];
        const bool is_send = end.peer_op == Op::kRecvF || end.peer_op == Op::kRecvB;
        return InvalidAt(schedule, r, end.id - offsets_[r],
                         absl::StrFormat("has no matching %s: missing action %s on rank %d",
                                         is_send ? "receive" : "send",
                                         Name(Action{end.peer_stage, m, end.peer_op}),
                                         stage_rank_[end.peer_stage]));
      }
    }
  }
  return absl::OkStatus();
}

// Point-to-point transfers between two ranks are paired in order: NCCL (and PyTorch's
// pipelining runtime on it) hands rank A's k-th send to rank B to B's k-th receive from
// A, whatever their micro-batches. Receives out of the senders' order would not deadlock
// here (each receive waits for its own send) but would deliver the wrong micro-batch's
// data there, so they are refused.
absl::Status DependencyIndex::CheckTransferOrder(const Schedule& schedule) const {
  if (comm_.empty()) return absl::OkStatus();
  // (from, to) -> ids of the sends in the sender's program order, and of the receives in
  // the receiver's.
  std::map<std::pair<int, int>, std::vector<int>> sends, receives;
  for (int r = 0; r < num_ranks_; ++r) {
    const std::vector<Action>& program = schedule.programs[r];
    for (int step = 0; step < static_cast<int>(program.size()); ++step) {
      const Action& a = program[step];
      const int id = offsets_[r] + step;
      switch (a.op) {
        case Op::kSendF:
          sends[{r, stage_rank_[a.stage + 1]}].push_back(id);
          break;
        case Op::kSendB:
          sends[{r, stage_rank_[a.stage - 1]}].push_back(id);
          break;
        case Op::kRecvF:
          receives[{stage_rank_[a.stage - 1], r}].push_back(id);
          break;
        case Op::kRecvB:
          receives[{stage_rank_[a.stage + 1], r}].push_back(id);
          break;
        default:
          break;
      }
    }
  }
  auto receive_of = [&](int send_id) {
    const Action& a = ActionOf(send_id);
    return a.op == Op::kSendF ? CommOf(a.stage + 1, a.microbatch)->recv_f
                              : CommOf(a.stage - 1, a.microbatch)->recv_b;
  };
  auto ordinal = [](std::size_t k) {
    const std::size_t n = k + 1;
    const char* suffix = n % 100 >= 11 && n % 100 <= 13 ? "th"
                         : n % 10 == 1                  ? "st"
                         : n % 10 == 2                  ? "nd"
                         : n % 10 == 3                  ? "rd"
                                                        : "th";
    return absl::StrCat(n, suffix);
  };
  for (const auto& [pair, send_ids] : sends) {
    const auto& [from, to] = pair;
    if (from == to) continue;  // between chunks of one rank: no NCCL transfer
    const std::vector<int>& receive_ids = receives[pair];
    // CheckTransfers matched every send with one receive: the lists have one length.
    for (std::size_t k = 0; k < send_ids.size() && k < receive_ids.size(); ++k) {
      const int expected = receive_of(send_ids[k]);
      if (receive_ids[k] == expected) continue;
      return InvalidAt(
          schedule, to, StepOfId(receive_ids[k]),
          absl::StrFormat(
              "is rank %d's %s receive from rank %d, but rank %d's %s send to rank %d is %s "
              "(received by %s at step %d): NCCL pairs two ranks' transfers in order, so "
              "this receive would get %s's data; receive from rank %d in the order rank %d "
              "sends",
              to, ordinal(k), from, from, ordinal(k), to, Name(ActionOf(send_ids[k])),
              Name(ActionOf(expected)), StepOfId(expected), Name(ActionOf(send_ids[k])), from,
              from));
    }
  }
  return absl::OkStatus();
}

// No action may wait for one that comes later on its own rank: that rank would stall
// on itself. Cross-rank waits are the walk's business.
absl::Status DependencyIndex::CheckProgramOrder(const Schedule& schedule) const {
  for (int r = 0; r < num_ranks_; ++r) {
    const std::vector<Action>& program = schedule.programs[r];
    for (int step = 0; step < static_cast<int>(program.size()); ++step) {
      const Action& a = program[step];
      const int id = offsets_[r] + step;
      int bad = kNoAction;
      ForEachDep(a, [&](int dep, int) {
        if (bad == kNoAction && dep > id && action_rank_[dep] == r) bad = dep;
      });
      if (bad == kNoAction) continue;
      const int bad_step = bad - offsets_[r];
      const Action& later = program[bad_step];
      if (a.op == Op::kSendF || a.op == Op::kSendB) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("comes before %s (step %d), which computes what it "
                                         "sends: a send must follow its compute on rank %d",
                                         Name(later), bad_step, r));
      }
      if (later.op == Op::kRecvF || later.op == Op::kRecvB) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("comes before %s (step %d), which receives its input: "
                                         "a receive must come before the compute that uses it "
                                         "on rank %d",
                                         Name(later), bad_step, r));
      }
      if (a.op == Op::kAllReduce) {
        return InvalidAt(schedule, r, step,
                         absl::StrFormat("comes before %s (step %d): a stage's ALLREDUCE must "
                                         "follow all of its backward actions on rank %d",
                                         Name(program[bad_step]), bad_step, r));
      }
      return InvalidAt(schedule, r, step,
                       absl::StrFormat("waits for %s, which comes later on the same rank "
                                       "(step %d): rank %d would stall on itself",
                                       Name(program[bad_step]), bad_step, r));
    }
  }
  return absl::OkStatus();
}

absl::Status DeadlockError(const Schedule& schedule, const DependencyIndex& index,
                           const std::vector<int>& next_step, const std::vector<uint8_t>& done) {
  // The first few blocked ranks are named; thousands would make a megabyte line.
  constexpr int kMaxNamed = 8;
  const int num_ranks = index.num_ranks();
  int ran = 0;
  for (int r = 0; r < num_ranks; ++r) ran += next_step[r];
  // Each blocked rank waits for an action that has not run, so for a rank that is blocked
  // too: following the waits from any blocked rank ends in a cycle of ranks that wait for
  // one another. The cycle is the cause; the other blocked ranks wait behind it.
  std::vector<int> waits_for(num_ranks, kNoAction);  // [rank] the awaited action's id
  std::vector<int> blocked;
  for (int r = 0; r < num_ranks; ++r) {
    const int step = next_step[r];
    if (step >= static_cast<int>(schedule.programs[r].size())) continue;
    blocked.push_back(r);
    index.ForEachDep(schedule.programs[r][step], [&](int dep, int) {
      if (waits_for[r] == kNoAction && !done[dep]) waits_for[r] = dep;
    });
  }
  std::vector<int> cycle;  // ascending
  if (!blocked.empty()) {
    std::vector<int> seen_at(num_ranks, -1);
    std::vector<int> path;
    int r = blocked.front();
    while (r >= 0 && seen_at[r] < 0 && waits_for[r] != kNoAction) {
      seen_at[r] = static_cast<int>(path.size());
      path.push_back(r);
      r = index.RankOfId(waits_for[r]);
    }
    if (r >= 0 && seen_at[r] >= 0) cycle.assign(path.begin() + seen_at[r], path.end());
    std::sort(cycle.begin(), cycle.end());
  }
  // Named: the cycle's ranks first, then the others, each group in rank order.
  std::vector<int> named = cycle;
  for (int r : blocked) {
    if (!std::binary_search(cycle.begin(), cycle.end(), r)) named.push_back(r);
  }
  std::string line = "deadlock: no rank can run its next action;";
  for (int k = 0; k < std::min<int>(kMaxNamed, named.size()); ++k) {
    const int r = named[k];
    const Action& a = schedule.programs[r][next_step[r]];
    absl::StrAppend(&line, k > 0 ? ";" : "", " rank ", r, " blocked at ", Name(a));
    if (waits_for[r] != kNoAction) {
      absl::StrAppend(&line, " (waits for ", Name(index.ActionOf(waits_for[r])), " on rank ",
                      index.RankOfId(waits_for[r]), ")");
    }
  }
  if (static_cast<int>(named.size()) > kMaxNamed) {
    absl::StrAppend(&line, "; and ", named.size() - kMaxNamed, " more ranks blocked");
  }
  if (!cycle.empty() && cycle.size() < blocked.size()) {
    std::vector<std::string> ranks;
    for (int k = 0; k < std::min<int>(kMaxNamed, cycle.size()); ++k) {
      ranks.push_back(std::to_string(cycle[k]));
    }
    if (static_cast<int>(cycle.size()) > kMaxNamed) {
      ranks.push_back(absl::StrCat(cycle.size() - kMaxNamed, " more"));
    }
    const std::string last = ranks.back();
    ranks.pop_back();
    absl::StrAppend(&line, "; the cause: ranks ", absl::StrJoin(ranks, ", "), " and ", last,
                    cycle.size() == 2 ? " wait for each other" : " wait for one another in a cycle",
                    ", and the other ", blocked.size() - cycle.size(),
                    " blocked ranks wait behind them");
  }
  absl::StrAppend(&line, " (", ran, " of ", index.num_actions(), " actions ran)");
  const int first_rank = named.empty() ? -1 : named.front();
  return absl::FailedPreconditionError(absl::StrCat(
      line, "\n",
      RenderProgramGrid(schedule, first_rank, first_rank >= 0 ? next_step[first_rank] : -1)));
}

}  // namespace pipesched::scheduler::internal
