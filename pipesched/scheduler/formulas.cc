// The closed-form bubble predictions of formulas.h: one small function per schedule and
// one table that names them.
#include "pipesched/scheduler/formulas.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/registry.h"

namespace pipesched::scheduler {
namespace {

// GPipe and 1F1B: the pipeline fills for P-1 slots of T_F and drains for P-1 slots of
// T_B, so the makespan is (M+P-1)(T_F+T_B) against M(T_F+T_B) of work per rank.
std::optional<double> FillDrain(const FormulaInputs& in) {
  if (in.num_chunks != 1 || in.costs.f + in.costs.b <= 0) return std::nullopt;
  const double p = in.num_ranks;
  const double m = in.num_microbatches;
  return (p - 1) / (m + p - 1);
}

// Interleaved 1F1B (Megatron): the fill and drain shrink by V; the ratio is (P-1)/(V*M)
// of ideal compute. Megatron states it for M a multiple of P; the simulator shows it
// exact for every M >= P that splits into equal rounds (M a multiple of M / P, as the
// generator requires: M = 5, 6, 7 at P = 4), and for P = 1. With M < P the warm-up has
// fewer micro-batches than ranks and leaves more (FormulasPinningTest pins both).
std::optional<double> Interleaved(const FormulaInputs& in) {
  const int p = in.num_ranks;
  const int m = in.num_microbatches;
  const bool rounds_fill = m >= p && m % std::max(1, m / p) == 0;
  if ((p > 1 && !rounds_fill) || in.costs.f + in.costs.b <= 0) return std::nullopt;
  const double ratio =
      (in.num_ranks - 1.0) / (static_cast<double>(in.num_chunks) * in.num_microbatches);
  return ratio / (1 + ratio);
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): W fills part of the drain, so
// each rank idles (P-1)(T_F + T_I - T_W) besides its M(T_F + T_I + T_W) of work.
// That holds only when W can hide: rank 0 waits (P-1) T_I for its first I to come back
// down the pipeline, and rank P-1 starts (P-1) T_F late, so the makespan is at least
// M(T_F+T_I+T_W) + (P-1) max(T_F, T_I), more than the closed form once T_W > min(T_F,
// T_I); and with M < P there is no steady state for the deferred W's to fill. Sweeping
// the simulator (tests/scheduler/formulas_pinning_test.cc) shows the closed form exact
// precisely when P = 1, or T_W = 0 (1F1B with B = I), or M >= P and T_W <= min(T_F, T_I).
// Interleaved ZB is the same pipeline over V chunks per rank with per-chunk costs: V*M
// of each op per rank, the same (P-1)(T_F + T_I - T_W) idle, when P = 1 or M >= P and
// T_W <= min(T_F, T_I) (and M splits into equal rounds, as the generator requires).
// Both forms: (P-1)(T_F + T_I - T_W) idle per rank over V*M (T_F + T_I + T_W) of work.
std::optional<double> ZeroBubble(const FormulaInputs& in) {
  const StageCosts& c = in.costs;
  const double bubble = (in.num_ranks - 1.0) * (c.f + c.i - c.w);
  const double makespan =
      static_cast<double>(in.num_chunks) * in.num_microbatches * (c.f + c.i + c.w) + bubble;
  if (makespan <= 0) return std::nullopt;
  return bubble / makespan;
}

bool WeightsHide(const FormulaInputs& in) {
  const StageCosts& c = in.costs;
  return in.num_microbatches >= in.num_ranks && c.w <= c.f && c.w <= c.i;
}

std::optional<double> ZeroBubbleH1(const FormulaInputs& in) {
  if (in.num_chunks != 1) return std::nullopt;
  if (in.num_ranks > 1 && in.costs.w != 0 && !WeightsHide(in)) return std::nullopt;
  return ZeroBubble(in);
}

// With T_W = 0 and M < P, interleaving's own fill and drain leave gaps (as for
// interleaved-1f1b, whose form needs M >= P), so only the general condition.
std::optional<double> InterleavedZeroBubble(const FormulaInputs& in) {
  const int rounds = std::max(1, in.num_microbatches / in.num_ranks);
  if (in.num_chunks < 2 || in.num_microbatches % rounds != 0) return std::nullopt;
  if (in.num_ranks > 1 && !WeightsHide(in)) return std::nullopt;
  return ZeroBubble(in);
}

struct Formula {
  std::string_view schedule;
  std::optional<double> (*fraction)(const FormulaInputs&);
};

constexpr std::array<Formula, 5> kFormulas = {{
    {"gpipe", FillDrain},
    {"1f1b", FillDrain},
    {"interleaved-1f1b", Interleaved},
    {"zb-h1", ZeroBubbleH1},
    {"interleaved-zb", InterleavedZeroBubble},
}};

}  // namespace

std::optional<double> ClosedFormBubbleFraction(std::string_view schedule, const FormulaInputs& in) {
  if (in.num_ranks < 1 || in.num_chunks < 1 || in.num_microbatches < 1 || in.costs.allreduce > 0) {
    return std::nullopt;
  }
  // Only for times the simulator would run, also those a formula does not read.
  const StageCosts& c = in.costs;
  for (double t : {c.f, c.b, c.i, c.w, c.allreduce, c.zero_grad, c.optimizer}) {
    if (!(std::isfinite(t) && t >= 0)) return std::nullopt;
  }
  for (const Formula& formula : kFormulas) {
    if (formula.schedule != schedule) continue;
    std::optional<double> fraction = formula.fraction(in);
    if (fraction.has_value()) *fraction += 0.0;  // no "-0": (P-1) ... = 0 * negative at P = 1
    return fraction;
  }
  return std::nullopt;
}

std::optional<double> ClosedFormBubbleRatio(std::string_view schedule, const FormulaInputs& in) {
  const std::optional<double> fraction = ClosedFormBubbleFraction(schedule, in);
  if (!fraction.has_value() || *fraction >= 1) return std::nullopt;
  return *fraction / (1 - *fraction);
}

std::optional<double> ClosedFormFor(const Schedule& schedule, const CostModel& costs) {
  // Closed forms assume uniform stages, free transfers and no gap between actions.
  if (!costs.stages.empty() || !costs.comm.empty() || costs.comm_uniform != 0 ||
      costs.action_gap != 0) {
    return std::nullopt;
  }
  std::optional<double> formula =
      ClosedFormBubbleFraction(schedule.name, {.num_ranks = schedule.num_ranks(),
                                               .num_chunks = schedule.num_chunks(),
                                               .num_microbatches = schedule.num_microbatches,
                                               .costs = costs.uniform});
  // The name is only a name: a file called zb-h1.csv may hold GPipe's order. The formula
  // is the named generator's, so it holds only where the schedule runs that very order.
  if (!formula.has_value() || !RunsItsNamesOrder(schedule)) return std::nullopt;
  return formula;
}

bool RunsItsNamesOrder(const Schedule& schedule) {
  absl::StatusOr<Schedule> named =
      GenerateSchedule(schedule.name, {.num_ranks = schedule.num_ranks(),
                                       .num_microbatches = schedule.num_microbatches,
                                       .num_chunks = schedule.num_chunks()});
  if (!named.ok() || named->placement != CanonicalPlacement(schedule.placement) ||
      named->programs.size() != schedule.programs.size()) {
    return false;
  }
  // Transfers and all-reduces a file spells out take no time in a closed form (free
  // transfers, no all-reduce): the compute order decides.
  auto compute_only = [](const std::vector<Action>& program) {
    std::vector<Action> out;
    for (const Action& a : program) {
      if (IsCompute(a.op)) out.push_back(a);
    }
    return out;
  };
  for (std::size_t r = 0; r < schedule.programs.size(); ++r) {
    if (compute_only(schedule.programs[r]) != compute_only(named->programs[r])) return false;
  }
  return true;
}

}  // namespace pipesched::scheduler
