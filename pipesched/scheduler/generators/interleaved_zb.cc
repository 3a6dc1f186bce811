// Interleaved zero bubble: interleaved 1F1B with each backward split into I (gradient
// w.r.t. the chunk's input, on the critical path) and W (gradient w.r.t. its weights,
// free to move), laid out as PyTorch's ScheduleInterleavedZeroBubble orders each rank.
// V chunks per rank, loop placement (rank r runs virtual stages r, r+P, ...), the same
// rounds of R = M / max(1, M / P) micro-batches as interleaved-1f1b. Because an I is
// about half a B, the input gradient comes back up the pipeline sooner, so rank r warms
// up with (V-1)R + (P-1-r) forwards rather than (V-1)R + 2(P-1-r); in the steady state
// it runs F then I and, like ZB-H1, holds back its first r W's, which fill the drain.
// A chunk activation lives until its W, so every rank peaks at min((V-1)R + P, V*M)
// live chunk activations (interleaved-1f1b: up to (V-1)R + 2P - 1 on rank 0). With
// T_F = T_I = T_W per chunk each rank idles (P-1)(T_F + T_I - T_W), as in ZB-H1 but with
// chunk-sized costs: 1/V of ZB-H1's bubble (scheduler/formulas.h has the conditions).
//
// P=2, V=2, M=4 (rank 0 holds stages 0 and 2, rank 1 stages 1 and 3):
//   rank 0 | 0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0   (first 12 actions)
//   rank 1 | 1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1
//   rank 0 | 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3   (last 12)
//   rank 1 | 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3
#include <algorithm>
#include <deque>
#include <vector>

#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateInterleavedZb(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(
      const int v, generators_internal::CheckInterleavedParams("interleaved-zb", params, "zb-h1"));
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  const int per_round = generators_internal::RoundSize(p, m);

  Schedule schedule =
      generators_internal::EmptySchedule("interleaved-zb", PlacementKind::kLoop, p, v, m);
  const int total = v * m;  // forwards (and I's, and W's) per rank
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    const int warmup = std::min((v - 1) * per_round + (p - 1 - r), total);
    const int deferred = r;  // W's rank r holds back, as in zb-h1
    // The k-th forward of this rank runs chunk (k / R) mod V, the k-th I chunk
    // V-1 - (k / R) mod V; W's follow the I's in order. Micro-batches count up per stage.
    std::vector<int> next_f(v, 0);
    std::vector<int> next_i(v, 0);
    std::deque<Action> pending_w;
    auto forward = [&](int k) {
      const int chunk = (k / per_round) % v;
      program.push_back({chunk * p + r, next_f[chunk]++, Op::kF});
    };
    auto weight = [&] {
      program.push_back(pending_w.front());
      pending_w.pop_front();
    };
    auto input_then_maybe_weight = [&](int k) {
      const int chunk = v - 1 - (k / per_round) % v;
      const Action input{chunk * p + r, next_i[chunk]++, Op::kI};
      program.push_back(input);
      pending_w.push_back({input.stage, input.microbatch, Op::kW});
      if (k >= deferred) weight();
    };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = warmup; k < total; ++k) {
      forward(k);
      input_then_maybe_weight(k - warmup);
    }
    for (int k = total - warmup; k < total; ++k) input_then_maybe_weight(k);
    while (!pending_w.empty()) weight();
  }
  return schedule;
}

}  // namespace pipesched::scheduler
