// Looped BFS (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism"), as PyTorch's
// ScheduleLoopedBFS lays it out. Loop placement: rank r holds stages r, r+P, ...,
// r+(V-1)P. Each rank runs the forwards of all M micro-batches on its first chunk, then
// on its next chunk, ..., then the backwards chunk by chunk from the last, newest
// micro-batch first. Memory is GPipe's (V*M activations per rank); the point is that
// a whole chunk's gradients are ready at once, early, for data-parallel overlap.
//
// P=2, V=2, M=4 (rank 0 holds stages 0 and 2, rank 1 stages 1 and 3):
//   rank 0 | 0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0 0B3 0B2 0B1 0B0
//   rank 1 | 1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 3B3 3B2 3B1 3B0 1B3 1B2 1B1 1B0
#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateLoopedBfs(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int v, generators_internal::CheckParams("looped-bfs", params, 2));
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  Schedule schedule =
      generators_internal::EmptySchedule("looped-bfs", PlacementKind::kLoop, p, v, m);
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    for (int chunk = 0; chunk < v; ++chunk) {
      for (int mb = 0; mb < m; ++mb) program.push_back({chunk * p + r, mb, Op::kF});
    }
    for (int chunk = v - 1; chunk >= 0; --chunk) {
      for (int mb = m - 1; mb >= 0; --mb) program.push_back({chunk * p + r, mb, Op::kB});
    }
  }
  return schedule;
}

}  // namespace pipesched::scheduler
