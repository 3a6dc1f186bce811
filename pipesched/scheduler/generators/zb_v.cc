// ZB-V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"), as PyTorch's
// ScheduleZBVZeroBubble lays it out. Exactly two chunks per rank in a V: rank r holds
// stage r (chunk 0, going down the ranks) and stage 2P-1-r (chunk 1, coming back
// up), so the last stage sits on rank 0 next to the first. Backward is split into I
// and W. Rank r warms up with 2(P-r)-1 forwards of chunk 0, then r pairs (chunk 1,
// chunk 0), then P-r rounds of F I W on chunk 1; the steady state alternates
// F I W on chunk 0 and F I W on chunk 1; the cool-down issues the remaining I's first
// and the W's last. The program is built for max(M, 2P-1) micro-batches and the
// extra ones are dropped, which keeps it complete and deadlock-free for any M >= 1.
// With T_F = T_I = T_W the steady state has no bubble, at 1F1B's peak memory.
//
// P=2, M=3 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2):
//   rank 0 | 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2
//   rank 1 | 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2
#include <algorithm>

#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateZbV(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams("zb-v", params, 2));
  PS_RETURN_IF_ERROR(generators_internal::RequireChunks(
      "zb-v", chunks, 2, " (the V shape needs two), or zb-h1 for one chunk"));

  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  const int n = std::max(m, 2 * p - 1);  // micro-batches the program is built for
  Schedule schedule = generators_internal::EmptySchedule("zb-v", PlacementKind::kV, p, 2, m);
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    const int down = r;            // chunk 0
    const int up = 2 * p - 1 - r;  // chunk 1
    int f0 = 0, f1 = 0, i0 = 0, i1 = 0;
    auto add = [&](int stage, int mb, Op op) {
      if (mb < m) program.push_back({stage, mb, op});
    };
    auto fiw_up = [&] {
      add(up, f1++, Op::kF);
      add(up, i1, Op::kI);
      add(up, i1++, Op::kW);
    };
    for (int k = 0; k < 2 * (p - r) - 1; ++k) add(down, f0++, Op::kF);
    for (int k = 0; k < r; ++k) {
      add(up, f1++, Op::kF);
      add(down, f0++, Op::kF);
    }
    for (int k = 0; k < p - r; ++k) fiw_up();
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(down, f0++, Op::kF);
      add(down, i0, Op::kI);
      add(down, i0++, Op::kW);
      fiw_up();
    }
    int w0 = i0, w1 = i1;
    for (int k = 0; k < r; ++k) {
      add(down, i0++, Op::kI);
      add(up, i1++, Op::kI);
    }
    for (int k = 0; k < p - r; ++k) {
      add(down, i0++, Op::kI);
      add(down, w0++, Op::kW);
    }
    while (w1 < i1) add(up, w1++, Op::kW);
    while (w0 < i0) add(down, w0++, Op::kW);
  }
  return schedule;
}

}  // namespace pipesched::scheduler
