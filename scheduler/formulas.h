// Closed-form bubble formulas, one place. Notation (DESIGN.md):
//   P ranks, V chunks per rank, M micro-batches; T_F, T_B, T_I, T_W per-stage times.
//   bubble fraction = idle / (P x makespan)      (share of wall time)
//   bubble ratio    = idle / ideal compute        (relative to useful work)
//   GPipe, 1F1B:      fraction = (P-1) / (M+P-1)
//   interleaved 1F1B: ratio = (P-1) / (V*M)       (M divisible by P)
//   ZB-H1:            bubble time per rank = (P-1)(T_F + T_I - T_W)
#pragma once

#include <optional>
#include <string_view>

#include "scheduler/cost_model.h"

namespace pipesched::scheduler {

struct FormulaInputs {
  int num_ranks = 1;         // P
  int num_chunks = 1;        // V
  int num_microbatches = 1;  // M
  StageCosts costs;          // uniform per-stage costs
};

// Bubble fraction predicted by the schedule's closed form, or nullopt where none
// applies (unknown schedule, non-uniform regime the formula does not cover).
std::optional<double> ClosedFormBubbleFraction(std::string_view schedule,
                                               const FormulaInputs& in);

}  // namespace pipesched::scheduler
