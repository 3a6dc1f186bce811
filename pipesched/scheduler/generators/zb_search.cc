// ZB-1p and ZB-2p (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3): the
// zero-bubble schedules found for a cost model and a memory limit rather than drawn by
// hand. One chunk per rank, backward split into I and W, at most P (zb-1p: 1F1B's peak
// on rank 0) or 2P (zb-2p) live activations on any rank. The V-shaped ones search zb-v's
// placement (two chunks per rank in a V): zb-v-1p within zb-v's peak, 2P chunk
// activations (P stages' worth, as 1F1B's rank 0), and, after Qi et al. 2024 ("Pipeline
// Parallelism with Controllable Memory"), zb-v-half within V-Half's (P+2)/2 stages' worth
// and zb-v-min within V-Min's (P+4)/3.
//
// The paper's heuristic, as a list scheduler over simulated time: each rank, whenever it
// is free, starts a ready I (on the critical path: every upstream rank waits for it; of
// two, the later stage's), else a ready F that the memory limit allows (warm-up fills
// the wait for the first I with as many forwards as fit), else a W into the gap, else
// waits. Variants differ in knobs: whether a rank keeps 1F1B's rhythm after its first I
// (no more F's ahead of its I's than before it), how large a gap must be before a W goes
// into it (a W that starts just before an I arrives delays that I and every rank above
// it), and, with two chunks, which chunk's F goes first and how an entering micro-batch
// keeps room for the returns. Tight limits (zb-v-min) want more than greed: the 2024
// paper's building block -- one micro-batch's passes laid out so that, repeated every
// period, no two collide on a rank -- is a candidate too, laid out for unit costs and
// for the costs given. Each candidate, and the handcrafted order of the shape (zb-h1,
// zb-v), is timed with the costs exactly as the simulator times a program (an action
// starts when its rank is free -- after its zero-grads, then after the cost model's gap
// -- and its inputs have arrived); of those within the limit, the one with the shortest
// step (zero-grads, actions, all-reduces, optimizer steps: Simulate's step_time, the
// makespan when those cost nothing) wins, ties going to the shorter makespan, the smaller
// activation peak and then the earlier candidate (the handcrafted order first). A
// candidate stops as soon as it cannot win (Bounds): the search's cost is mostly the
// candidates that come close.
//
// Without a cost model the costs are unit (F = I = W = 1). There zb-h1 already meets the
// one-step lower bound 3M + P - 1, so zb-1p and zb-2p return zb-h1's order, and zb-v-1p
// keeps zb-v's wherever zb-v's steady state is reached (M >= 2P); they differ for uneven
// stages, T_W unlike T_F and T_I, transfers that cost, or (zb-v-1p) few micro-batches.
//
// The refinement (GeneratorParams::refine; RefineSchedule in refine.h for any schedule
// with I and W split) lives here too: it moves single actions and times each order with
// the same list scheduler's replay.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"
#include "pipesched/scheduler/lower.h"
#include "pipesched/scheduler/refine.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {
namespace {

constexpr double kUnknown = -1;  // a time not yet decided (every real time is >= 0)

struct Policy {
  int limit = 1;            // live activations per rank: F started, its W not yet
  bool steady_cap = false;  // after the first I, F's ahead of I's <= the warm-up's
  double fill = 0;          // a W fills a gap when nothing can start for fill x T_W
  bool deep_first = true;   // of two ready F's (V = 2), the later stage's first
  // With two stages per rank: an entering micro-batch needs one place kept free for any
  // return (a return's chunk soon frees its place, the returns ahead of it first), not a
  // place reserved for its own return; more micro-batches in flight for the same memory.
  bool spare_only = false;
};

// What a candidate must beat to be worth finishing: a run stops (Outcome::cut) once its
// step can no longer be within `step_time` or its peak is above `peak`.
struct Bounds {
  double step_time = std::numeric_limits<double>::infinity();
  int peak = std::numeric_limits<int>::max();
};

struct Outcome {
  bool cut = false;      // stopped early: worse than Bounds, the rest is unset
  double step_time = 0;  // as SimResult::step_time
  double makespan = 0;   // as SimResult::makespan
  // The end times of all F's and I's added up: how early the critical passes run, for
  // the refinement to tell apart orders of equal step and makespan (ClearlyBetter).
  double flow = 0;
  int peak = 0;  // the largest live activation count on any rank
  std::vector<std::vector<Action>> programs;

  bool BetterThan(const Outcome& other) const {
    if (step_time != other.step_time) return step_time < other.step_time;
    if (makespan != other.makespan) return makespan < other.makespan;
    return peak < other.peak;
  }
};

// The time `consumer`'s input takes across `boundary`: nothing when the two stages share
// a rank, as in Simulate.
double TransferAcross(const CostModel& costs, const Placement& placement, const Action& consumer,
                      int boundary) {
  return placement.RankOf(boundary) == placement.RankOf(boundary + 1)
             ? 0
             : costs.TransferInto(consumer, boundary);
}

// Lists one schedule's actions in simulated time, either by a Policy or by replaying
// fixed programs. Both time each action as scheduler::Simulate does. Stages sit on ranks
// by the placement (one per rank, or zb-v's two in a V); a transfer costs only between
// ranks.
class ListScheduler {
 public:
  ListScheduler(const Placement& placement, int num_microbatches, const CostModel& costs)
      : p_(placement.num_ranks),
        s_(placement.num_stages()),
        m_(num_microbatches),
        costs_(costs),
        placement_(placement) {
    rank_of_.resize(s_);
    stages_of_.resize(p_);
    for (int s = 0; s < s_; ++s) {
      rank_of_[s] = placement.RankOf(s);
      stages_of_[rank_of_[s]].push_back(s);
    }
    work_.assign(p_, 0);
    for (int s = 0; s < s_; ++s) {
      for (int mb = 0; mb < m_; ++mb) {
        for (Op op : {Op::kF, Op::kI, Op::kW}) work_[rank_of_[s]] += costs_.Duration({s, mb, op});
      }
    }
  }

  absl::StatusOr<Outcome> Run(const Policy& policy, const Bounds& bounds) {
    return RunImpl(&policy, nullptr, bounds);
  }
  absl::StatusOr<Outcome> Replay(const std::vector<std::vector<Action>>& programs,
                                 const Bounds& bounds) {
    return RunImpl(nullptr, &programs, bounds);
  }

 private:
  struct Rank {
    int f = 0, i = 0, w = 0;     // F's, I's and W's issued, over the rank's stages
    int warmup = -1;             // F's issued before the first I; -1 before it
    std::deque<Action> w_queue;  // W's whose I is issued, in I order
    bool started = false;
    double last_end = 0;
    bool blocked = false;  // waiting for a neighbour to issue the producer of an input
    int peak = 0;
    double left = 0;                // the durations of the actions not yet issued
    std::vector<int> reduce_order;  // stages whose W's are all issued, in that order
  };

  std::size_t Index(int stage, int mb) const {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(m_) + mb;
  }
  // The transfer into `consumer` across `boundary`, when producer and consumer differ in rank.
  double Transfer(const Action& consumer, int boundary) const {
    return TransferAcross(costs_, placement_, consumer, boundary);
  }
  // When F(s, mb)'s input has arrived; kUnknown while its producer is not issued.
  double FReady(int s, int mb) const {
    if (s == 0) return 0;
    const double end = f_end_[Index(s - 1, mb)];
    return end < 0 ? kUnknown : end + Transfer({s, mb, Op::kF}, s - 1);
  }
  // When I(s, mb)'s inputs (its F, the gradient from stage s+1) are there.
  double IReady(int s, int mb) const {
    const double f = f_end_[Index(s, mb)];
    if (f < 0 || s == s_ - 1) return f;
    const double end = i_end_[Index(s + 1, mb)];
    if (end < 0) return kUnknown;
    return std::max(f, end + Transfer({s, mb, Op::kI}, s));
  }
  // The stage whose F (for an F) or I (for an I) `a` needs; outside [0, S) for none.
  static int Producer(const Action& a) { return a.op == Op::kF ? a.stage - 1 : a.stage + 1; }
  // A time before which the still unissued producer of `a`'s input cannot end.
  double EarliestUnknown(const Action& a, double now) const {
    const int from = Producer(a);
    return now + costs_.Duration({from, a.microbatch, a.op}) + Transfer(a, std::min(from, a.stage));
  }
  double ReadyOf(const Action& a) const {
    switch (a.op) {
      case Op::kF:
        return FReady(a.stage, a.microbatch);
      case Op::kI:
        return IReady(a.stage, a.microbatch);
      default:
        return i_end_[Index(a.stage, a.microbatch)];
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
    rank.left -= costs_.Duration(a);
    // Its later actions start no earlier than this one ends (gaps only add).
    cut_ |= rank.last_end + rank.left > cut_after_;
    last_end_ = std::max(last_end_, end);
    out_.programs[r].push_back(a);
    switch (a.op) {
      case Op::kF:
        f_end_[Index(a.stage, a.microbatch)] = end;
        out_.flow += end;
        ++next_f_[a.stage];
        ++rank.f;
        rank.peak = std::max(rank.peak, rank.f - rank.w);
        cut_ |= rank.peak > peak_bound_;
        if (a.stage + 1 < s_) Wake(rank_of_[a.stage + 1], now);
        break;
      case Op::kI:
        i_end_[Index(a.stage, a.microbatch)] = end;
        out_.flow += end;
        ++next_i_[a.stage];
        if (rank.warmup < 0) rank.warmup = rank.f;
        ++rank.i;
        if (policy_mode_) rank.w_queue.push_back({a.stage, a.microbatch, Op::kW});
        if (a.stage > 0) Wake(rank_of_[a.stage - 1], now);
        break;
      default:
        ++rank.w;
        if (!rank.w_queue.empty() && rank.w_queue.front() == a) rank.w_queue.pop_front();
        // The stage's last W: Simulate's all-reduce of it follows (PlaceAllReduce puts it
        // right after), in this order on the rank's comm lane.
        w_end_[a.stage] = end;
        if (++w_issued_[a.stage] == m_) ranks_[r].reduce_order.push_back(a.stage);
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
  // (A program that ends early leaves its rank unfinished: the loop reports a stall.)
  void DecideFixed(int r, double now, const std::vector<Action>& program) {
    if (out_.programs[r].size() >= program.size()) return;
    const Action& a = program[out_.programs[r].size()];
    const double ready = ReadyOf(a);
    if (ready < 0) {
      ranks_[r].blocked = true;
      return;
    }
    Issue(r, a, ready, now);
  }

  // Policy: at time `now` rank r is free; start what the policy picks or wait.
  void DecidePolicy(int r, double now, const Policy& policy, bool force_w) {
    Rank& rank = ranks_[r];
    const std::vector<int>& stages = stages_of_[r];
    // A micro-batch that enters the rank (its first stage there) comes back for its other
    // stages (zb-v's chunk 1) before any of its activations can go, so entering reserves
    // a place for each: the limit and 1F1B's rhythm hold back only entries, and an F of a
    // later stage always has the place its entry reserved. (Without the reservation a
    // rank full of first-stage activations would wait for itself.) Or, spare_only, an
    // entry leaves one place free for whichever return comes first. Nothing then waits
    // for itself: entries hold at most limit - 1 places, and the earliest unfinished
    // micro-batch always has room -- every earlier one has freed its places, so it
    // enters an empty rank or returns to one with at most limit - 1 live.
    const int entry = stages.front();
    int reserved = 0;  // returns still to come: 0 with one stage per rank
    for (int s : stages) reserved += next_f_[entry] - next_f_[s];
    const int places = static_cast<int>(stages.size());
    const int live = rank.f - rank.w;
    const bool f_memory = policy.spare_only ? live + std::min(places, 2) <= policy.limit
                                            : live + reserved + places <= policy.limit;
    const bool return_memory = !policy.spare_only || live < policy.limit;
    const bool f_rhythm = !policy.steady_cap || rank.warmup < 0 || rank.f - rank.i < rank.warmup;
    // The candidates: each stage's next I and next F; ready ones start now, the latest
    // stage's I first (every stage below waits for it), then F's in the policy's order.
    double next_known = -1;
    double earliest = -1;  // lower bound over the next inputs, known and not yet
    auto consider = [&](const Action& a, double ready) {
      // An input from this rank's own stage waits for nobody else: no reason to wait.
      const int from = Producer(a);
      if (ready < 0 && from >= 0 && from < s_ && rank_of_[from] == r) return;
      const double bound = ready >= 0 ? ready : EarliestUnknown(a, now);
      if (ready >= 0 && (next_known < 0 || ready < next_known)) next_known = ready;
      if (earliest < 0 || bound < earliest) earliest = bound;
    };
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
      const int s = *it;
      if (next_i_[s] >= next_f_[s]) continue;
      const Action a{s, next_i_[s], Op::kI};
      const double ready = IReady(s, a.microbatch);
      if (ready >= 0 && ready <= now) return Issue(r, a, ready, now);
      consider(a, ready);
    }
    bool f_wanted = false;  // an F is left that only the memory limit holds back
    for (std::size_t k = 0; k < stages.size(); ++k) {
      const int s = policy.deep_first ? stages[stages.size() - 1 - k] : stages[k];
      if (next_f_[s] >= m_) continue;
      if (s == entry) {
        f_wanted |= !f_memory;
        if (!f_memory || !f_rhythm) continue;
      } else if (!return_memory) {
        f_wanted = true;
        continue;
      }
      const Action a{s, next_f_[s], Op::kF};
      const double ready = FReady(s, a.microbatch);
      if (ready >= 0 && ready <= now) return Issue(r, a, ready, now);
      consider(a, ready);
    }
    if (!rank.w_queue.empty()) {
      const Action w = rank.w_queue.front();
      if (force_w || policy.fill <= 0 || f_wanted || earliest < 0 ||
          earliest >= now + policy.fill * costs_.Duration(w)) {
        return Issue(r, w, i_end_[Index(w.stage, w.microbatch)], now);
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
    const int per_op = static_cast<int>(stages_of_[r].size()) * m_;
    return rank.f == per_op && rank.i == per_op && rank.w == per_op;
  }

  absl::StatusOr<Outcome> RunImpl(const Policy* policy,
                                  const std::vector<std::vector<Action>>* fixed,
                                  const Bounds& bounds) {
    policy_mode_ = policy != nullptr;
    peak_bound_ = bounds.peak;
    // The margin keeps the rounding of the running sums Rank::left from cutting a tie.
    cut_after_ = bounds.step_time + 1e-7 * std::max(1.0, std::abs(bounds.step_time));
    cut_ = false;
    const std::size_t cells = static_cast<std::size_t>(s_) * static_cast<std::size_t>(m_);
    f_end_.assign(cells, kUnknown);
    i_end_.assign(cells, kUnknown);
    next_f_.assign(s_, 0);
    next_i_.assign(s_, 0);
    w_issued_.assign(s_, 0);
    w_end_.assign(s_, 0);
    ranks_.assign(p_, Rank{});
    out_ = Outcome{};
    out_.programs.resize(p_);
    for (int r = 0; r < p_; ++r) {
      out_.programs[r].reserve(3 * stages_of_[r].size() * static_cast<std::size_t>(m_));
    }
    now_ = 0;
    first_start_ = std::numeric_limits<double>::infinity();
    last_end_ = 0;
    remaining_ = p_;
    queue_ = {};
    for (int r = 0; r < p_; ++r) {
      // The rank zeroes its stages' gradients first: its lane is free after that.
      for (int s : stages_of_[r]) ranks_[r].last_end += costs_.Stage(s).zero_grad;
      ranks_[r].left = work_[r];
      queue_.push({ranks_[r].last_end, r});
    }
    while (remaining_ > 0) {
      if (queue_.empty()) {
        // Every rank waits for another: a policy may then only start a W (its own
        // gradients need nothing from anyone). Replaying a valid program never gets here.
        bool moved = false;
        for (int r = 0; r < p_ && policy != nullptr && !moved; ++r) {
          if (!Done(r) && !ranks_[r].w_queue.empty()) {
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
      if (cut_) return Outcome{.cut = true};
    }
    // As Simulate: a stage with an all-reduce time reduces its gradients on the rank's
    // comm lane once its last W ends (Simulate places the ALLREDUCE there), one after
    // another; the makespan runs from the first action to the last end, all-reduces
    // included; the step from the first zero-grad (time 0) to the last optimizer step,
    // which follows the rank's last action and gap and its stage's all-reduce.
    std::vector<double> reduced(s_, 0);  // [stage]: its all-reduce's end, 0 for none
    for (int r = 0; r < p_; ++r) {
      double comm_free = 0;
      for (int s : ranks_[r].reduce_order) {
        if (costs_.Stage(s).allreduce <= 0) continue;  // Simulate erases those
        // Its duration as Simulate takes it: a per-action entry first.
        const Action reduce{.stage = s, .microbatch = -1, .op = Op::kAllReduce};
        comm_free = std::max(comm_free, w_end_[s]) + costs_.Duration(reduce);
        reduced[s] = comm_free;
        last_end_ = std::max(last_end_, comm_free);
      }
    }
    out_.makespan = last_end_ - first_start_;
    out_.step_time = last_end_;
    for (int r = 0; r < p_; ++r) {
      bool any = false;
      for (int s : stages_of_[r]) any |= costs_.Stage(s).optimizer > 0;
      // Summed in Simulate's order, so that the two agree to the last bit.
      double t = ranks_[r].last_end + (any ? costs_.action_gap : 0);
      for (int s : stages_of_[r]) t = std::max(t, reduced[s]) + costs_.Stage(s).optimizer;
      out_.step_time = std::max(out_.step_time, t);
      out_.peak = std::max(out_.peak, ranks_[r].peak);
    }
    return std::move(out_);
  }

  using Entry = std::pair<double, int>;  // (decision time, rank), earliest first
  const int p_;                          // ranks
  const int s_;                          // stages
  const int m_;                          // micro-batches
  const CostModel& costs_;
  const Placement placement_;
  std::vector<int> rank_of_;                 // [stage]
  std::vector<std::vector<int>> stages_of_;  // [rank], in stage order
  std::vector<double> f_end_, i_end_;        // [stage x M + mb]
  std::vector<int> next_f_, next_i_;         // [stage]: F's and I's issued, in mb order
  std::vector<int> w_issued_;                // [stage]: W's issued
  std::vector<double> w_end_;                // [stage]: the end of its last W issued
  std::vector<Rank> ranks_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  double now_ = 0;
  double first_start_ = 0;    // the first action's start
  double last_end_ = 0;       // the last action's end
  int remaining_ = 0;         // ranks with actions left
  bool policy_mode_ = false;  // Run (keeps the W queues), not Replay
  std::vector<double> work_;  // [rank]: the durations of all its actions
  int peak_bound_ = 0;        // Bounds of the run: the peak,
  double cut_after_ = 0;      // and the time past which a rank's end rules it out
  bool cut_ = false;          // the run is out of its Bounds
  Outcome out_;
};

// Whether `later` needs `earlier` directly (DESIGN.md's dependencies among the F, I and W
// a search lays out), so that in one rank's program `later` cannot come first.
bool Needs(const Action& later, const Action& earlier) {
  if (later.microbatch != earlier.microbatch) return false;
  switch (later.op) {
    case Op::kF:
      return earlier.op == Op::kF && earlier.stage == later.stage - 1;
    case Op::kI:
      return (earlier.op == Op::kF && earlier.stage == later.stage) ||
             (earlier.op == Op::kI && earlier.stage == later.stage + 1);
    case Op::kW:
      return earlier.op == Op::kI && earlier.stage == later.stage;
    default:
      return false;
  }
}

// `x` less rounding: what a figure must be below to count as smaller than `x`.
double LessRounding(double x) { return x - 1e-9 * std::max(1.0, std::abs(x)); }

// Whether `candidate` is better than `best` by more than rounding (LessRounding; the same
// sums added in another order differ in the last bits, and a move kept for that would be
// reported as a gain of 1e-13): a shorter step; or one no longer and a shorter makespan;
// or neither longer and a smaller peak; or, `by_flow`, the same peak, neither longer, and
// the F's and I's ending earlier in sum (Outcome::flow). Never a step or makespan longer at
// all, so that kept moves cannot add up to one. The flow lets the refinement cross
// plateaus: one rank deferring a W rarely shortens the step alone (the next rank still
// runs its W first), but it brings that rank's I's forward, and the next rank's move then
// pays (docs/schedules.md, "Refinement": it about doubled the savings).
bool ClearlyBetter(const Outcome& candidate, const Outcome& best, bool by_flow) {
  if (candidate.step_time > best.step_time) return false;
  if (candidate.step_time < LessRounding(best.step_time)) return true;
  if (candidate.makespan > best.makespan) return false;
  if (candidate.makespan < LessRounding(best.makespan)) return true;
  if (candidate.peak != best.peak) return candidate.peak < best.peak;
  return by_flow && candidate.flow < LessRounding(best.flow);
}

// The refinement (GeneratorParams::refine) in place of the paper's ILP, which polishes
// its heuristic's order (Qi et al. 2023, section 3): hill climbing over single moves.
// Each action (place by place across the ranks) is tried at other places in its program,
// nearest first, in each direction until it would pass an action it needs (moving
// earlier) or that needs it (moving later); the first move whose order replays better
// (ClearlyBetter) within the limit is kept. Passes repeat until one keeps nothing at the
// longest reach, or kRefineActions actions have been timed (each try counts all of its
// order's actions). Moves that deadlock through another rank stall the replay and are
// dropped.
Outcome RefineOrder(ListScheduler& lister, Outcome best, int limit) {
  const Outcome start = best;
  std::vector<std::vector<Action>> programs = best.programs;
  std::int64_t actions = 0;
  for (const std::vector<Action>& program : programs) actions += program.size();
  const std::int64_t max_replays = std::max<std::int64_t>(1, kRefineActions / actions);
  std::int64_t replays = 0;
  // Tries `programs` with the action at `from` of rank r moved to `to`; keeps it if better.
  auto try_move = [&](std::size_t r, std::size_t from, std::size_t to) {
    std::vector<Action>& program = programs[r];
    auto rotate = [&](std::size_t a, std::size_t b) {  // the action at a goes to b
      if (a < b) {
        std::rotate(program.begin() + a, program.begin() + a + 1, program.begin() + b + 1);
      } else {
        std::rotate(program.begin() + b, program.begin() + a, program.begin() + a + 1);
      }
    };
    rotate(from, to);
    ++replays;
    absl::StatusOr<Outcome> outcome =
        lister.Replay(programs, Bounds{.step_time = best.step_time, .peak = limit});
    if (outcome.ok() && !outcome->cut && outcome->peak <= limit &&
        ClearlyBetter(*outcome, best, /*by_flow=*/true)) {
      best = *std::move(outcome);
      return true;
    }
    rotate(to, from);
    return false;
  };
  std::size_t longest = 0;
  for (const std::vector<Action>& program : programs) longest = std::max(longest, program.size());
  // Short moves first, the reach doubling whenever a pass keeps nothing: most of what
  // helps is near, and the budget is better spent there than on far moves of every action.
  for (std::size_t reach = 1; replays < max_replays;) {
    bool kept = false;
    // Place by place across the ranks, so that a budget that runs out has tried every
    // rank's early actions rather than only the first ranks' programs.
    for (std::size_t i = 0; i < longest && replays < max_replays; ++i) {
      for (std::size_t r = 0; r < programs.size() && replays < max_replays; ++r) {
        const std::size_t n = programs[r].size();
        if (i >= n) continue;
        bool moved = false;
        for (std::size_t to = i; to > 0 && to + reach > i && !moved && replays < max_replays;
             --to) {
          if (Needs(programs[r][i], programs[r][to - 1])) break;
          moved = try_move(r, i, to - 1);
        }
        for (std::size_t to = i + 1; to < n && to <= i + reach && !moved && replays < max_replays;
             ++to) {
          if (Needs(programs[r][to], programs[r][i])) break;
          moved = try_move(r, i, to);
        }
        kept |= moved;
      }
    }
    if (!kept) {
      if (reach >= longest) break;
      reach *= 2;
    }
  }
  // Earlier F's and I's alone are no reason to change the order.
  return ClearlyBetter(best, start, /*by_flow=*/false) ? best : start;
}

// The repeated building block (Qi et al. 2024, "Pipeline Parallelism with Controllable
// Memory"): one micro-batch's passes laid out in time, each as early as its input allows
// (its producer's end plus the transfer) where it overlaps no other pass of the block on
// its rank modulo the period, the busiest rank's work per micro-batch; the block then
// repeats every period, and each rank's program is its passes in time order. So each
// rank's passes of one period fit together without collision, and the activations live
// no longer than the block's chain needs: the least memory at which the steady state has
// no bubble. The I's, on the critical path, take their places before the W's, which go
// into what is left. Where no gap fits a pass (uneven stages), it takes its earliest time
// anyway: only the order is kept, and the caller's replay times it.
class BlockBuilder {
 public:
  BlockBuilder(const Placement& placement, const CostModel& costs)
      : placement_(placement), costs_(costs) {
    std::vector<double> work(placement.num_ranks, 0);
    for (int s = 0; s < placement.num_stages(); ++s) {
      for (Op op : {Op::kF, Op::kI, Op::kW})
        work[placement.RankOf(s)] += costs.Duration({s, 0, op});
    }
    period_ = *std::max_element(work.begin(), work.end());
  }

  std::vector<std::vector<Action>> Programs(int num_microbatches) {
    const int stages = placement_.num_stages();
    const int p = placement_.num_ranks;
    taken_.assign(p, {});
    std::vector<std::vector<std::pair<double, Action>>> block(p);  // [rank]: (start, action)
    auto place = [&](const Action& a, double earliest) {
      const int r = placement_.RankOf(a.stage);
      const double start = Fit(r, earliest, costs_.Duration(a));
      block[r].push_back({start, a});
      return start + costs_.Duration(a);
    };
    std::vector<double> f_end(stages), i_end(stages);
    double ready = 0;
    for (int s = 0; s < stages; ++s) {
      if (s > 0) ready = f_end[s - 1] + Transfer({s, 0, Op::kF}, s - 1);
      f_end[s] = place({s, 0, Op::kF}, ready);
    }
    for (int s = stages - 1; s >= 0; --s) {
      ready = s + 1 < stages ? std::max(f_end[s], i_end[s + 1] + Transfer({s, 0, Op::kI}, s))
                             : f_end[s];
      i_end[s] = place({s, 0, Op::kI}, ready);
    }
    for (int s = stages - 1; s >= 0; --s) place({s, 0, Op::kW}, i_end[s]);
    std::vector<std::vector<Action>> programs(p);
    for (int r = 0; r < p; ++r) {
      std::vector<std::pair<double, Action>> timed;
      timed.reserve(block[r].size() * static_cast<std::size_t>(num_microbatches));
      for (int mb = 0; mb < num_microbatches; ++mb) {
        for (const auto& [t, a] : block[r])
          timed.push_back({t + mb * period_, {a.stage, mb, a.op}});
      }
      // Stable: passes that start together (zero-length ones) keep the block's order,
      // which follows the dependencies.
      std::stable_sort(timed.begin(), timed.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      programs[r].reserve(timed.size());
      for (const auto& [t, a] : timed) programs[r].push_back(a);
    }
    return programs;
  }

 private:
  double Transfer(const Action& consumer, int boundary) const {
    return TransferAcross(costs_, placement_, consumer, boundary);
  }
  // Whether [start, start + length) overlaps a pass taken on rank r, modulo the period.
  bool Collides(int r, double start, double length) const {
    if (period_ <= 0 || length <= 0) return false;
    const double a = std::fmod(start, period_);
    for (const auto& [s, len] : taken_[r]) {
      for (double shift : {-period_, 0.0, period_}) {
        const double lo = std::max(a, s + shift);
        const double hi = std::min(a + length, s + shift + len);
        if (hi - lo > kEpsilon * period_) return true;
      }
    }
    return false;
  }
  // The earliest start at or after `earliest` where a pass of `length` collides with
  // nothing on rank r (within one period of it), or `earliest` when none does; taken.
  double Fit(int r, double earliest, double length) {
    double start = earliest;
    if (Collides(r, earliest, length)) {
      // Right after each taken pass, within a period (a pass that wraps past the period's
      // end ends early in the next one: the shift -period).
      std::vector<double> candidates;
      const double base = earliest - std::fmod(earliest, period_);
      for (const auto& [s, len] : taken_[r]) {
        for (double shift : {-period_, 0.0, period_, 2 * period_}) {
          const double t = base + s + len + shift;
          if (t > earliest && t < earliest + period_) candidates.push_back(t);
        }
      }
      std::sort(candidates.begin(), candidates.end());
      for (double t : candidates) {
        if (!Collides(r, t, length)) {
          start = t;
          break;
        }
      }
    }
    if (period_ > 0) taken_[r].push_back({std::fmod(start, period_), length});
    return start;
  }

  static constexpr double kEpsilon = 1e-9;
  const Placement& placement_;
  const CostModel& costs_;
  double period_ = 0;
  std::vector<std::vector<std::pair<double, double>>> taken_;  // [rank]: (start mod period, length)
};

// The shape a search runs on: one chunk per rank on a loop (zb-1p, zb-2p) or zb-v's two in
// a V (zb-v-1p), the handcrafted order that is its first candidate, and the limit on live
// activations per rank (chunk activations when V = 2).
struct SearchShape {
  PlacementKind kind;
  int chunks;               // V: exactly this many, or any V >= 2 (default 2) when 0
  GeneratorFn handcrafted;  // when `chunks` is 0 it may refuse the shape (then not a candidate)
  // The limit for P ranks and V chunks, called once CheckParams has bounded both (so that
  // P = INT_MAX is the generators' "at most 65536 ranks", not an overflow).
  int (*limit)(int num_ranks, int num_chunks);
  // Another fixed order of the shape, a candidate where it generates and fits the limit
  // (dualpipe-v for the V searches: it holds one more chunk activation than zb-v, so it
  // competes under --max-activations). Its B's run as I then W.
  GeneratorFn also = nullptr;
};

absl::StatusOr<Schedule> SearchZeroBubble(std::string_view name, const GeneratorParams& params,
                                          const SearchShape& shape) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams(
                                            name, params, shape.chunks == 0 ? 2 : shape.chunks));
  if (shape.chunks == 0 && chunks < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        Absl(name), " needs V >= 2 chunks per rank (got V=", chunks,
        "); use --virtual=2 or more, or zb-1p for a searched schedule with one chunk"));
  }
  if (shape.chunks > 0) {
    PS_RETURN_IF_ERROR(generators_internal::RequireChunks(
        name, chunks, shape.chunks,
        shape.chunks == 1 ? ", or zb-v-1p for a searched schedule with two chunks"
                          : ", or zb-1p for a searched schedule with one chunk"));
  }
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  const CostModel unit;
  const CostModel& costs = params.costs != nullptr ? *params.costs : unit;
  // The parser and the --cost-* flags refuse costs the search cannot time; a library
  // caller may not have.
  if (absl::Status valid = CheckCostModel(costs); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot search a schedule for these costs: ", valid.message()));
  }
  // Per-stage entries for another shape would be read for the wrong stages.
  if (absl::Status fits = CheckCostsFit(costs, p, chunks); !fits.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot search ", Absl(name), " for these costs: ", fits.message()));
  }
  int own_limit = shape.limit(p, chunks);
  if (params.max_activations != 0) {
    // At least one stage's worth: a micro-batch keeps one activation on each chunk of a
    // rank it passes, and an entry reserves them all.
    constexpr int kMaxLimit = 1 << 16;  // stages' worth, as many as the generators' ranks
    if (!(params.max_activations >= 1 && params.max_activations <= kMaxLimit)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s cannot keep %g stages' worth of activations per rank: a micro-batch holds one "
          "on each of a rank's chunks; give a limit from 1 to %d, or 0 for %s's own",
          Absl(name), params.max_activations, kMaxLimit, Absl(name)));
    }
    own_limit = static_cast<int>(std::floor(params.max_activations * chunks + 1e-9));
  }
  const int limit = std::min(own_limit, chunks * m);

  Schedule schedule = generators_internal::EmptySchedule(name, shape.kind, p, chunks, m);
  ListScheduler lister(schedule.placement, m, costs);
  Outcome best;
  bool have_best = false;
  // What the next candidate must beat: the best so far, within the limit.
  auto bounds = [&] {
    return Bounds{.step_time = have_best ? best.step_time : std::numeric_limits<double>::infinity(),
                  .peak = limit};
  };
  auto offer = [&](absl::StatusOr<Outcome> candidate) -> absl::Status {
    PS_RETURN_IF_ERROR(candidate.status());
    if (candidate->cut || candidate->peak > limit) return absl::OkStatus();
    if (!have_best || candidate->BetterThan(best)) {
      best = *std::move(candidate);
      have_best = true;
    }
    return absl::OkStatus();
  };
  absl::StatusOr<Schedule> handcrafted =
      shape.handcrafted({.num_ranks = p, .num_microbatches = m, .num_chunks = chunks});
  if (handcrafted.ok()) {
    PS_RETURN_IF_ERROR(offer(lister.Replay(handcrafted->programs, bounds())));
  } else if (shape.chunks != 0) {
    return handcrafted.status();
  }
  if (shape.also != nullptr) {
    absl::StatusOr<Schedule> also =
        shape.also({.num_ranks = p, .num_microbatches = m, .num_chunks = chunks});
    if (also.ok()) {
      // Its B's run as I then W (the same work: the search's costs have B = I + W).
      PS_RETURN_IF_ERROR(offer(lister.Replay(SplitBackward(*std::move(also)).programs, bounds())));
    }
  }
  if (chunks > 1) {
    for (const CostModel* block_costs : {&unit, &costs}) {
      PS_RETURN_IF_ERROR(offer(
          lister.Replay(BlockBuilder(schedule.placement, *block_costs).Programs(m), bounds())));
    }
  }
  // zb-2p also tries 1F1B's peak: more forwards in flight fill more of the wait for the
  // first gradient, but also delay the gradients behind them. (zb-1p's and zb-v-1p's
  // limits are that peak already.)
  std::vector<int> limits = {limit};
  if (const int base = std::min(chunks * p, chunks * m); base < limit) limits.push_back(base);
  // The knobs that only several stages per rank have: their first value is the one-stage
  // case. (One spare place is enough for two stages per rank, not for more: a micro-batch
  // would hold it and need another for its next return.)
  const std::vector<bool> deep_firsts =
      chunks > 1 ? std::vector<bool>{true, false} : std::vector<bool>{true};
  const std::vector<bool> spare_onlys =
      chunks == 2 ? std::vector<bool>{false, true} : std::vector<bool>{false};
  for (int l : limits) {
    for (bool steady_cap : {false, true}) {
      for (double fill : {0.0, 0.5, 1.0}) {
        for (bool deep_first : deep_firsts) {
          for (bool spare_only : spare_onlys) {
            PS_RETURN_IF_ERROR(offer(lister.Run({.limit = l,
                                                 .steady_cap = steady_cap,
                                                 .fill = fill,
                                                 .deep_first = deep_first,
                                                 .spare_only = spare_only},
                                                bounds())));
          }
        }
      }
    }
  }
  if (!have_best) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Absl(name), " found no order within ", limit, " live activations per rank"));
  }
  if (params.refine) best = RefineOrder(lister, std::move(best), limit);
  schedule.programs = std::move(best.programs);
  return schedule;
}

}  // namespace

absl::StatusOr<Schedule> GenerateZb1p(const GeneratorParams& params) {
  return SearchZeroBubble("zb-1p", params,
                          {PlacementKind::kLoop, 1, &GenerateZbH1, [](int p, int) { return p; }});
}

absl::StatusOr<Schedule> GenerateZb2p(const GeneratorParams& params) {
  return SearchZeroBubble(
      "zb-2p", params, {PlacementKind::kLoop, 1, &GenerateZbH1, [](int p, int) { return 2 * p; }});
}

absl::StatusOr<Schedule> GenerateZbV1p(const GeneratorParams& params) {
  // 2P chunk activations: zb-v's peak, P stages' worth, as 1F1B's rank 0.
  return SearchZeroBubble(
      "zb-v-1p", params,
      {PlacementKind::kV, 2, &GenerateZbV, [](int p, int) { return 2 * p; }, &GenerateDualPipeV});
}

absl::StatusOr<Schedule> GenerateInterleavedZb1p(const GeneratorParams& params) {
  // V P chunk activations: P stages' worth, as 1F1B's rank 0. interleaved-zb, the first
  // candidate, needs M in whole rounds and then holds more where M is not a multiple of P.
  return SearchZeroBubble(
      "interleaved-zb-1p", params,
      {PlacementKind::kLoop, 0, &GenerateInterleavedZb, [](int p, int v) { return v * p; }});
}

absl::StatusOr<Schedule> GenerateZbVHalf(const GeneratorParams& params) {
  return SearchZeroBubble("zb-v-half", params,
                          {PlacementKind::kV, 2, &GenerateZbV,
                           [](int p, int) { return ZbVHalfLimit(p); }, &GenerateDualPipeV});
}

absl::StatusOr<Schedule> GenerateZbVMin(const GeneratorParams& params) {
  return SearchZeroBubble("zb-v-min", params,
                          {PlacementKind::kV, 2, &GenerateZbV,
                           [](int p, int) { return ZbVMinLimit(p); }, &GenerateDualPipeV});
}

absl::StatusOr<Schedule> RefineSchedule(const Schedule& schedule, const CostModel& costs) {
  PS_RETURN_IF_ERROR(Validate(schedule));
  if (absl::Status valid = CheckCostModel(costs); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot refine ", schedule.name, " for these costs: ", valid.message()));
  }
  for (std::size_t r = 0; r < schedule.programs.size(); ++r) {
    for (const Action& a : schedule.programs[r]) {
      if (a.op == Op::kF || a.op == Op::kI || a.op == Op::kW) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot refine ", schedule.name, ": rank ", r, " runs ", ToString(a),
          ", and the refinement moves only F, I and W actions; ",
          a.op == Op::kB ? "give a schedule whose backward is split into I and W "
                           "(scheduler::SplitBackward splits each B)"
                         : "refine the schedule before its transfers and all-reduces are "
                           "lowered into it"));
    }
  }
  ListScheduler lister(schedule.placement, schedule.num_microbatches, costs);
  PS_ASSIGN_OR_RETURN(Outcome own, lister.Replay(schedule.programs, Bounds{}));
  const int limit = own.peak;
  Schedule refined = schedule;
  refined.programs = RefineOrder(lister, std::move(own), limit).programs;
  return refined;
}

int ZbVHalfLimit(int num_ranks) { return 2 * ((num_ranks + 2) / 2); }
int ZbVMinLimit(int num_ranks) { return 2 * ((num_ranks + 4) / 3); }

}  // namespace pipesched::scheduler
