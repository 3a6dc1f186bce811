// GPipe (Huang et al. 2019): every rank runs all M forwards, then all M backwards.
// Simplest schedule and the most memory: M live activations on every rank. Its
// bubble is (P-1)/(M+P-1) of wall time, the same as 1F1B's.
//
// P=4, M=8 (stage = rank):
//   rank 0 | 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0B0 0B1 0B2 0B3 0B4 0B5 0B6 0B7
//   rank 1 | 1F0 1F1 1F2 1F3 1F4 1F5 1F6 1F7 1B0 1B1 1B2 1B3 1B4 1B5 1B6 1B7
//   rank 2 | 2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 2B0 2B1 2B2 2B3 2B4 2B5 2B6 2B7
//   rank 3 | 3F0 3F1 3F2 3F3 3F4 3F5 3F6 3F7 3B0 3B1 3B2 3B3 3B4 3B5 3B6 3B7
#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateGPipe(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams("gpipe", params, 1));
  PS_RETURN_IF_ERROR(generators_internal::RequireChunks(
      "gpipe", chunks, 1, ", or interleaved-1f1b / looped-bfs for more chunks"));

  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  Schedule schedule = generators_internal::EmptySchedule("gpipe", PlacementKind::kLoop, p, 1, m);
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    for (int mb = 0; mb < m; ++mb) program.push_back({r, mb, Op::kF});
    for (int mb = 0; mb < m; ++mb) program.push_back({r, mb, Op::kB});
  }
  return schedule;
}

}  // namespace pipesched::scheduler
