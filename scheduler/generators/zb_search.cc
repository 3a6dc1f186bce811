// ZB-1p and ZB-2p (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3): the
// zero-bubble schedules found for a cost model and a memory limit rather than drawn by
// hand. One chunk per rank, backward split into I and W, at most P (zb-1p: 1F1B's peak
// on rank 0) or 2P (zb-2p) live activations on any rank.
//
// The paper's heuristic, as a list scheduler over simulated time: each rank, whenever it
// is free, starts the ready I (on the critical path: every upstream rank waits for it),
// else a ready F that the memory limit allows (warm-up fills the wait for the first I
// with as many forwards as fit), else a W into the gap, else waits. Variants differ in
// two knobs: whether a rank keeps 1F1B's rhythm after its first I (no more F's ahead of
// its I's than before it) and how large a gap must be before a W goes into it (a W that
// starts just before an I arrives delays that I and every rank above it). Each variant,
// and zb-h1's fixed order where it fits the limit, is timed with the costs exactly as
// the simulator times a program (an action starts when its rank is free -- after its
// zero-grads, then after the cost model's gap -- and its inputs have arrived); the one
// with the shortest step (zero-grads, actions, optimizer steps: Simulate's step_time,
// the makespan when those cost nothing) wins, ties going to the shorter makespan, the
// smaller activation peak and then the earlier variant (zb-h1 first).
//
// Without a cost model the costs are unit (F = I = W = 1). There zb-h1 already meets the
// one-step lower bound 3M + P - 1, so both searches return zb-h1's order; they differ
// from it for uneven stages, T_W unlike T_F and T_I, or transfers that cost.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "scheduler/generators/generators.h"
#include "scheduler/generators/util.h"

namespace pipesched::scheduler {
namespace {

constexpr double kUnknown = -1;  // a time not yet decided (every real time is >= 0)

struct Policy {
  int limit = 1;            // live activations per rank: F started, its W not yet
  bool steady_cap = false;  // after the first I, F's ahead of I's <= the warm-up's
  double fill = 0;          // a W fills a gap when nothing can start for fill x T_W
};

struct Outcome {
  double step_time = 0;  // as SimResult::step_time
  double makespan = 0;   // as SimResult::makespan
  int peak = 0;          // the largest live activation count on any rank
  std::vector<std::vector<Action>> programs;

  bool BetterThan(const Outcome& other) const {
    if (step_time != other.step_time) return step_time < other.step_time;
    if (makespan != other.makespan) return makespan < other.makespan;
    return peak < other.peak;
  }
};

// InvalidArgument naming the first cost the search cannot time (negative, not a number,
// above kMaxCostTime): the parser and the --cost-* flags refuse them, a library caller
// may not have.
absl::Status CheckSearchCosts(const CostModel& costs) {
  auto check = [](const std::string& what, double t) -> absl::Status {
    if (t >= 0 && t <= kMaxCostTime) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot search a schedule for these costs: %s is %g; give a number in [0, %g]", what, t,
        kMaxCostTime));
  };
  for (int s = -1; s < static_cast<int>(costs.stages.size()); ++s) {
    const StageCosts& c = s < 0 ? costs.uniform : costs.stages[s];
    const std::string stage = s < 0 ? "the default" : absl::StrCat("stage ", s, "'s");
    for (const auto& [name, t] :
         {std::pair{"f", c.f}, std::pair{"i", c.i}, std::pair{"w", c.w},
          std::pair{"zero_grad", c.zero_grad}, std::pair{"optimizer", c.optimizer}}) {
      PS_RETURN_IF_ERROR(check(absl::StrCat(stage, " ", name), t));
    }
  }
  PS_RETURN_IF_ERROR(check("the transfer time", costs.comm_uniform));
  for (std::size_t k = 0; k < costs.comm.size(); ++k) {
    PS_RETURN_IF_ERROR(check(absl::StrCat("boundary ", k, "'s transfer time"), costs.comm[k]));
  }
  PS_RETURN_IF_ERROR(check("the action gap", costs.action_gap));
  for (const auto* overrides : {&costs.actions, &costs.transfers, &costs.gaps}) {
    for (const auto& [key, t] : *overrides) {
      const auto& [stage, op, microbatch] = key;
      PS_RETURN_IF_ERROR(
          check(absl::StrCat("a time of ", ToString(Action{stage, microbatch, op})), t));
    }
  }
  return absl::OkStatus();
}

// Lists one schedule's actions in simulated time, either by a Policy or by replaying
// fixed programs. Both time each action as scheduler::Simulate does.
class ListScheduler {
 public:
  ListScheduler(int num_ranks, int num_microbatches, const CostModel& costs)
      : p_(num_ranks), m_(num_microbatches), costs_(costs) {}

  absl::StatusOr<Outcome> Run(const Policy& policy) { return RunImpl(&policy, nullptr); }
  absl::StatusOr<Outcome> Replay(const std::vector<std::vector<Action>>& programs) {
    return RunImpl(nullptr, &programs);
  }

 private:
  struct Rank {
    int next_f = 0, next_i = 0, next_w = 0;
    int warmup = -1;  // F's issued before the first I; -1 before it
    int pos = 0;      // replay: next position in the fixed program
    bool started = false;
    double last_end = 0;
    bool blocked = false;  // waiting for a neighbour to issue the producer of its next input
    int peak = 0;
  };

  std::size_t Index(int r, int mb) const {
    return static_cast<std::size_t>(r) * static_cast<std::size_t>(m_) + mb;
  }

  // When F(r, mb)'s input has arrived; kUnknown while its producer is not issued.
  double FReady(int r, int mb) const {
    if (r == 0) return 0;
    const double end = f_end_[Index(r - 1, mb)];
    return end < 0 ? kUnknown : end + costs_.TransferInto({r, mb, Op::kF}, r - 1);
  }
  // When I(r, mb)'s inputs (its F, the gradient from stage r+1) are there.
  double IReady(int r, int mb) const {
    const double f = f_end_[Index(r, mb)];
    if (f < 0 || r == p_ - 1) return f;
    const double end = i_end_[Index(r + 1, mb)];
    if (end < 0) return kUnknown;
    return std::max(f, end + costs_.TransferInto({r, mb, Op::kI}, r));
  }
  // A time before which the still unissued producer of rank r's next `op` cannot end.
  double EarliestUnknown(int r, Op op, int mb, double now) const {
    if (op == Op::kF) {
      return now + costs_.Duration({r - 1, mb, Op::kF}) +
             costs_.TransferInto({r, mb, Op::kF}, r - 1);
    }
    return now + costs_.Duration({r + 1, mb, Op::kI}) + costs_.TransferInto({r, mb, Op::kI}, r);
  }
  double ReadyOf(int r, const Action& a) const {
    switch (a.op) {
      case Op::kF:
        return FReady(r, a.microbatch);
      case Op::kI:
        return IReady(r, a.microbatch);
      default:
        return i_end_[Index(r, a.microbatch)];
    }
  }

  void Issue(int r, const Action& a, double ready, double now) {
    Rank& rank = ranks_[r];
    // Before the first action last_end is where the rank's zero-grads end, with no gap.
    const double start =
        std::max(ready, rank.started ? rank.last_end + costs_.GapBefore(a) : rank.last_end);
    const double end = start + costs_.Duration(a);
    if (!rank.started) first_start_ = std::min(first_start_, start);
    rank.started = true;
    rank.last_end = end;
    last_end_ = std::max(last_end_, end);
    out_.programs[r].push_back(a);
    switch (a.op) {
      case Op::kF:
        f_end_[Index(r, a.microbatch)] = end;
        ++rank.next_f;
        rank.peak = std::max(rank.peak, rank.next_f - rank.next_w);
        if (r + 1 < p_) Wake(r + 1, now);
        break;
      case Op::kI:
        i_end_[Index(r, a.microbatch)] = end;
        if (rank.warmup < 0) rank.warmup = rank.next_f;
        ++rank.next_i;
        if (r > 0) Wake(r - 1, now);
        break;
      default:
        ++rank.next_w;
        break;
    }
    if (Done(r)) {
      --remaining_;
    } else {
      queue_.push({end + costs_.action_gap, r});
    }
  }

  void Wake(int r, double now) {
    if (!ranks_[r].blocked) return;
    ranks_[r].blocked = false;
    queue_.push({now, r});
  }

  // Replay: issue the rank's next fixed action as soon as its inputs' times are known.
  void DecideFixed(int r, double now, const std::vector<Action>& program) {
    Rank& rank = ranks_[r];
    if (rank.pos >= static_cast<int>(program.size())) return;
    const Action& a = program[rank.pos];
    const double ready = ReadyOf(r, a);
    if (ready < 0) {
      rank.blocked = true;
      return;
    }
    ++rank.pos;
    Issue(r, a, ready, now);
  }

  // Policy: at time `now` rank r is free; start what the policy picks or wait.
  void DecidePolicy(int r, double now, const Policy& policy, bool force_w) {
    Rank& rank = ranks_[r];
    const bool i_ok = rank.next_i < rank.next_f;
    const bool f_memory = rank.next_f - rank.next_w < policy.limit;
    const bool f_rhythm =
        !policy.steady_cap || rank.warmup < 0 || rank.next_f - rank.next_i < rank.warmup;
    const bool f_ok = rank.next_f < m_ && f_memory && f_rhythm;
    const bool w_ok = rank.next_w < rank.next_i;
    const double i_ready = i_ok ? IReady(r, rank.next_i) : kUnknown;
    const double f_ready = f_ok ? FReady(r, rank.next_f) : kUnknown;
    if (i_ok && i_ready >= 0 && i_ready <= now) {
      return Issue(r, {r, rank.next_i, Op::kI}, i_ready, now);
    }
    if (f_ok && f_ready >= 0 && f_ready <= now) {
      return Issue(r, {r, rank.next_f, Op::kF}, f_ready, now);
    }
    // Nothing on the critical path can start now: when might something?
    double next_known = -1;
    double earliest = -1;  // lower bound over known and unknown next inputs
    auto consider = [&](bool ok, double ready, Op op, int mb) {
      if (!ok) return;
      const double bound = ready >= 0 ? ready : EarliestUnknown(r, op, mb, now);
      if (ready >= 0 && (next_known < 0 || ready < next_known)) next_known = ready;
      if (earliest < 0 || bound < earliest) earliest = bound;
    };
    consider(i_ok, i_ready, Op::kI, rank.next_i);
    consider(f_ok, f_ready, Op::kF, rank.next_f);
    if (w_ok) {
      const Action w{r, rank.next_w, Op::kW};
      const bool memory_bound = rank.next_f < m_ && !f_memory;
      if (force_w || policy.fill <= 0 || memory_bound || earliest < 0 ||
          earliest >= now + policy.fill * costs_.Duration(w)) {
        return Issue(r, w, i_end_[Index(r, rank.next_w)], now);
      }
    }
    if (next_known >= 0) {
      queue_.push({next_known, r});
    } else {
      rank.blocked = true;
    }
  }

  bool Done(int r) const {
    const Rank& rank = ranks_[r];
    return rank.next_w == m_ && rank.next_i == m_;
  }

  absl::StatusOr<Outcome> RunImpl(const Policy* policy,
                                  const std::vector<std::vector<Action>>* fixed) {
    const std::size_t cells = static_cast<std::size_t>(p_) * static_cast<std::size_t>(m_);
    f_end_.assign(cells, kUnknown);
    i_end_.assign(cells, kUnknown);
    ranks_.assign(p_, Rank{});
    out_ = Outcome{};
    out_.programs.resize(p_);
    for (auto& program : out_.programs) program.reserve(3 * static_cast<std::size_t>(m_));
    now_ = 0;
    first_start_ = std::numeric_limits<double>::infinity();
    last_end_ = 0;
    remaining_ = p_;
    queue_ = {};
    for (int r = 0; r < p_; ++r) {
      // Rank r (stage r) zeroes its gradients first: its lane is free after that.
      ranks_[r].last_end = costs_.Stage(r).zero_grad;
      queue_.push({ranks_[r].last_end, r});
    }
    while (remaining_ > 0) {
      if (queue_.empty()) {
        // Every rank waits for another: a policy may then only start a W (its own
        // gradients need nothing from anyone). Replaying a valid program never gets here.
        bool moved = false;
        for (int r = 0; r < p_ && policy != nullptr && !moved; ++r) {
          if (!Done(r) && ranks_[r].next_w < ranks_[r].next_i) {
            ranks_[r].blocked = false;
            DecidePolicy(r, now_, *policy, /*force_w=*/true);
            moved = true;
          }
        }
        if (!moved) {
          return absl::InternalError(absl::StrCat("the zero-bubble search stalled at time ", now_,
                                                  " with ", remaining_, " ranks unfinished"));
        }
        continue;
      }
      auto [time, r] = queue_.top();
      queue_.pop();
      now_ = std::max(now_, time);
      if (Done(r)) continue;
      if (fixed != nullptr) {
        DecideFixed(r, now_, (*fixed)[r]);
      } else {
        DecidePolicy(r, now_, *policy, /*force_w=*/false);
      }
    }
    // As Simulate: the makespan from the first action, the step from the first zero-grad
    // (time 0) to the last optimizer step, which follows the rank's last action and gap.
    out_.makespan = last_end_ - first_start_;
    out_.step_time = last_end_;
    for (int r = 0; r < p_; ++r) {
      const double optimizer = costs_.Stage(r).optimizer;
      if (optimizer > 0) {
        out_.step_time =
            std::max(out_.step_time, ranks_[r].last_end + costs_.action_gap + optimizer);
      }
      out_.peak = std::max(out_.peak, ranks_[r].peak);
    }
    return std::move(out_);
  }

  using Entry = std::pair<double, int>;  // (decision time, rank), earliest first
  const int p_;
  const int m_;
  const CostModel& costs_;
  std::vector<double> f_end_, i_end_;
  std::vector<Rank> ranks_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  double now_ = 0;
  double first_start_ = 0;  // the first action's start
  double last_end_ = 0;     // the last action's end
  int remaining_ = 0;       // ranks with actions left
  Outcome out_;
};

absl::StatusOr<Schedule> SearchZeroBubble(std::string_view name, const GeneratorParams& params,
                                          int limit_per_rank) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams(name, params, 1));
  PS_RETURN_IF_ERROR(generators_internal::RequireChunks(
      name, chunks, 1, ", or zb-v for a zero-bubble schedule with two chunks"));
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  const CostModel unit;
  const CostModel& costs = params.costs != nullptr ? *params.costs : unit;
  PS_RETURN_IF_ERROR(CheckSearchCosts(costs));
  const int limit = std::min(limit_per_rank, m);

  ListScheduler lister(p, m, costs);
  Outcome best;
  bool have_best = false;
  auto offer = [&](absl::StatusOr<Outcome> candidate) -> absl::Status {
    PS_RETURN_IF_ERROR(candidate.status());
    if (candidate->peak > limit) return absl::OkStatus();
    if (!have_best || candidate->BetterThan(best)) {
      best = *std::move(candidate);
      have_best = true;
    }
    return absl::OkStatus();
  };
  // zb-h1 holds min(P, M) activations on every rank: within both limits.
  PS_ASSIGN_OR_RETURN(Schedule h1, GenerateZbH1({.num_ranks = p, .num_microbatches = m}));
  PS_RETURN_IF_ERROR(offer(lister.Replay(h1.programs)));
  std::vector<int> limits = {limit};
  if (std::min(p, m) < limit) limits.push_back(std::min(p, m));
  for (int l : limits) {
    for (bool steady_cap : {false, true}) {
      for (double fill : {0.0, 0.5, 1.0}) {
        PS_RETURN_IF_ERROR(offer(lister.Run({.limit = l, .steady_cap = steady_cap, .fill = fill})));
      }
    }
  }
  Schedule schedule = generators_internal::EmptySchedule(name, PlacementKind::kLoop, p, 1, m);
  schedule.programs = std::move(best.programs);
  return schedule;
}

}  // namespace

absl::StatusOr<Schedule> GenerateZb1p(const GeneratorParams& params) {
  return SearchZeroBubble("zb-1p", params, params.num_ranks);
}

absl::StatusOr<Schedule> GenerateZb2p(const GeneratorParams& params) {
  return SearchZeroBubble("zb-2p", params, 2 * params.num_ranks);
}

}  // namespace pipesched::scheduler
