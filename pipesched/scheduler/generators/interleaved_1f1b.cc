// Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM), as PyTorch's
// ScheduleInterleaved1F1B lays it out. Each rank holds V model chunks, loop placement:
// rank r runs virtual stages r, r+P, ..., r+(V-1)P. Micro-batches go through the
// chunks in rounds of R = M / max(1, M / P) micro-batches: R forwards of chunk 0,
// R of chunk 1, ..., and backwards from the last chunk down in the same rounds. Rank r
// warms up with (V-1)R + 2(P-1-r) forwards (at most V*M), then alternates one
// forward and one backward, then drains. The bubble shrinks to (P-1)/(V*M) of the
// ideal compute, for V times more (smaller) transfers.
//
// M need not be a multiple of P, but it must split into equal rounds: M a multiple of
// max(1, M / P) (so any M <= P, or M = 10 for P = 4, but not M = 9 for P = 4).
//
// P=2, V=2, M=4 (rank 0 holds stages 0 and 2, rank 1 stages 1 and 3):
//   rank 0 | 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
//   rank 1 | 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
#include <algorithm>
#include <vector>

#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateInterleaved1F1B(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int v, generators_internal::CheckInterleavedParams(
                                       "interleaved-1f1b", params, "the 1f1b schedule"));
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  const int per_round = generators_internal::RoundSize(p, m);

  Schedule schedule =
      generators_internal::EmptySchedule("interleaved-1f1b", PlacementKind::kLoop, p, v, m);
  const int total = v * m;  // forwards (and backwards) per rank
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    const int warmup = std::min((v - 1) * per_round + 2 * (p - 1 - r), total);
    // The k-th forward of this rank runs chunk (k / R) mod V; the k-th backward chunk
    // V-1 - (k / R) mod V. Micro-batches count up per stage.
    std::vector<int> next_f(v, 0);
    std::vector<int> next_b(v, 0);
    auto forward = [&](int k) {
      const int chunk = (k / per_round) % v;
      program.push_back({chunk * p + r, next_f[chunk]++, Op::kF});
    };
    auto backward = [&](int k) {
      const int chunk = v - 1 - (k / per_round) % v;
      program.push_back({chunk * p + r, next_b[chunk]++, Op::kB});
    };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = warmup; k < total; ++k) {
      forward(k);
      backward(k - warmup);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return schedule;
}

}  // namespace pipesched::scheduler
