// 1F1B (PipeDream-flush, Narayanan et al. 2019): rank r runs min(P-1-r, M) warm-up
// forwards, then alternates one forward and one backward, then drains the remaining
// backwards. Same bubble as GPipe, (P-1)/(M+P-1) of wall time, but rank r holds at
// most min(P-r, M) live activations instead of M.
//
// P=4, M=8 (stage = rank):
//   rank 0 | 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7
//   rank 1 | 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7
//   rank 2 | 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7
//   rank 3 | 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7
#include <algorithm>

#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateOneFOneB(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams("1f1b", params, 1));
  PS_RETURN_IF_ERROR(generators_internal::RequireChunks("1f1b", chunks, 1,
                                                        ", or interleaved-1f1b for more chunks"));

  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  Schedule schedule = generators_internal::EmptySchedule("1f1b", PlacementKind::kLoop, p, 1, m);
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    const int warmup = std::min(p - 1 - r, m);
    int next_f = 0;
    int next_b = 0;
    while (next_f < warmup) program.push_back({r, next_f++, Op::kF});
    while (next_f < m) {
      program.push_back({r, next_f++, Op::kF});
      program.push_back({r, next_b++, Op::kB});
    }
    while (next_b < m) program.push_back({r, next_b++, Op::kB});
  }
  return schedule;
}

}  // namespace pipesched::scheduler
