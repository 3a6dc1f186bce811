// Closed-form bubble formulas, one place. Notation (DESIGN.md):
//   P ranks, V chunks per rank, M micro-batches; T_F, T_B, T_I, T_W the time of one
//   F, B, I, W of one virtual stage (all stages equal: the formulas assume uniform
//   costs, no transfer time and no exposed all-reduce).
//   bubble fraction = idle / (P x makespan)                  (share of wall time)
//   bubble ratio    = idle / ideal compute = f / (1 - f)     (relative to useful work)
//   GPipe, 1F1B:      fraction = (P-1) / (M+P-1)             any T_F, T_B
//   interleaved 1F1B: ratio = (P-1) / (V*M)                  M divisible by P
//                     so fraction = (P-1) / (V*M + P-1)
//   ZB-H1:            bubble time per rank = (P-1)(T_F + T_I - T_W)
//                     makespan = M (T_F + T_I + T_W) + that
//                     so fraction = bubble time / makespan
//                     exact when P = 1, or T_W = 0, or M >= P and T_W <= min(T_F, T_I);
//                     no closed form otherwise (the simulated bubble is larger)
//   interleaved ZB:   the same with per-chunk costs: bubble time per rank
//                     (P-1)(T_F + T_I - T_W), makespan V*M (T_F + T_I + T_W) + that,
//                     when P = 1, or M >= P and T_W <= min(T_F, T_I) (M splitting
//                     into equal rounds, as the generator requires)
// The simulator reproduces these exactly for the registry's generators with uniform
// costs; tests/scheduler/formulas_pinning_test.cc pins one to the other.
#pragma once

#include <optional>
#include <string_view>

#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

struct FormulaInputs {
  int num_ranks = 1;         // P
  int num_chunks = 1;        // V
  int num_microbatches = 1;  // M
  StageCosts costs;          // uniform per-stage costs
};

// Bubble fraction predicted by the schedule's closed form, or nullopt where none
// applies (unknown schedule, non-uniform regime the formula does not cover, P, V or M
// below 1, costs.allreduce > 0, a time in `costs` that is negative or not finite).
// Known schedules: "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "interleaved-zb".
std::optional<double> ClosedFormBubbleFraction(std::string_view schedule, const FormulaInputs& in);

// The same prediction as a bubble ratio (idle / ideal compute), nullopt where the
// fraction is.
std::optional<double> ClosedFormBubbleRatio(std::string_view schedule, const FormulaInputs& in);

// The closed-form bubble fraction for `schedule` simulated with `costs`:
// nullopt unless the costs are uniform, transfers free and there is no action gap, or
// when the schedule has no closed form for them, or when its compute order is not the
// one its name's generator gives for its shape (a file named zb-h1.csv holding GPipe's
// order has no closed form: the name does not make it zb-h1).
std::optional<double> ClosedFormFor(const Schedule& schedule, const CostModel& costs);

// Whether `schedule`'s compute order (F, B, I, W per rank; transfers and all-reduces
// aside) and placement are those its name's generator gives for its P, V and M: where a
// named closed form can apply to it at all. False for a name no generator has.
bool RunsItsNamesOrder(const Schedule& schedule);

}  // namespace pipesched::scheduler
