// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with each backward
// split into I (gradient w.r.t. the stage input, on the critical path) and W (gradient
// w.r.t. the weights, free to move). Rank r runs its first r steady-state I's without
// their W and issues those W's later, where 1F1B would wait: I's travel up the pipeline
// sooner and the deferred W's fill the tail. Warm-up is 1F1B's; an activation lives
// until its W, so rank r's r deferred W's lift every rank to min(P, M) live
// activations: 1F1B's peak on rank 0, nowhere above it. With T_F = T_I = T_W the
// bubble per rank is (P-1)(T_F + T_I - T_W), a third of 1F1B's (P-1)(T_F + T_B). Same
// order as PyTorch's zero-bubble programs with one chunk per rank.
//
// P=4, M=6 (stage = rank):
//   rank 0 | 0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5
//   rank 1 | 1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1I4 1W3 1I5 1W4 1W5
//   rank 2 | 2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2I5 2W3 2W4 2W5
//   rank 3 | 3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3W3 3W4 3W5
#include <algorithm>

#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateZbH1(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams("zb-h1", params, 1));
  PS_RETURN_IF_ERROR(generators_internal::RequireChunks(
      "zb-h1", chunks, 1, ", or zb-v for a zero-bubble schedule with two chunks"));

  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  Schedule schedule = generators_internal::EmptySchedule("zb-h1", PlacementKind::kLoop, p, 1, m);
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    const int warmup = std::min(p - 1 - r, m);
    const int deferred = r;  // W's rank r holds back
    int next_f = 0;
    int next_i = 0;
    int next_w = 0;
    auto input_then_maybe_weight = [&] {
      program.push_back({r, next_i++, Op::kI});
      if (next_i - next_w > deferred) program.push_back({r, next_w++, Op::kW});
    };
    while (next_f < warmup) program.push_back({r, next_f++, Op::kF});
    while (next_f < m) {
      program.push_back({r, next_f++, Op::kF});
      input_then_maybe_weight();
    }
    while (next_i < m) input_then_maybe_weight();
    while (next_w < m) program.push_back({r, next_w++, Op::kW});
  }
  return schedule;
}

}  // namespace pipesched::scheduler
