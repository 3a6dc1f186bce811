// DualPipeV: DeepSeek's DualPipe (DeepSeek-V3 technical report, 2024) cut in half, as
// DeepSeek's dualpipev and PyTorch's ScheduleDualPipeV lay it out. Two chunks per rank
// in a V, like zb-v: rank r holds stage r (chunk 0, going down the ranks) and stage
// 2P-1-r (chunk 1, coming back up). Each chunk runs its micro-batches in order. Rank r
// runs eight phases:
//   1. 2(P-1-r) forwards of chunk 0;
//   2. r+1 pairs: forward chunk 0, forward chunk 1;
//   3. P-1-r rounds of I on chunk 1, the oldest deferred W, forward chunk 1;
//   4. M-2P+r+1 rounds of four: forward chunk 0 with backward chunk 1, then forward
//      chunk 1 with backward chunk 0 (full B);
//   5. P-1-r rounds: backward chunk 1, then forward chunk 1 with backward chunk 0;
//   6. r+1 rounds of backward chunk 1, backward chunk 0. The later half are I's
//      (deferred W's): from round floor((r+1)/2), from its chunk-0 backward when r is
//      even and from its chunk-1 backward when r is odd;
//   7. P-1-r rounds of the oldest deferred W, then I on chunk 0;
//   8. the r+1 deferred W's left.
// Deferred W's run oldest first. DualPipe issues each "forward with backward" pair
// together, so that one's communication (expert all-to-all in DeepSeek's MoE) hides
// under the other's compute; pipesched issues the forward, then the backward, on the
// same stream, and PyTorch's CSV writes the pair as (aFm;bBn)OVERLAP_F_B, which the
// loader reads as those two actions in that order. Needs M >= 2P (DeepSeek's and
// PyTorch's bound).
//
// P=2, M=4 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2):
//   rank 0 | 0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3
//   rank 1 | 1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/generators/util.h"

namespace pipesched::scheduler {

absl::StatusOr<Schedule> GenerateDualPipeV(const GeneratorParams& params) {
  PS_ASSIGN_OR_RETURN(const int chunks, generators_internal::CheckParams("dualpipe-v", params, 2));
  PS_RETURN_IF_ERROR(generators_internal::RequireChunks(
      "dualpipe-v", chunks, 2, " (the V shape needs two), or zb-h1 for one chunk"));
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  if (m < 2 * p) {
    return absl::InvalidArgumentError(
        absl::StrCat("dualpipe-v needs M >= 2P = ", 2 * p, " micro-batches (got M=", m, ", P=", p,
                     "); use --microbatches=", 2 * p, " or more, or zb-v, which takes any M"));
  }

  Schedule schedule = generators_internal::EmptySchedule("dualpipe-v", PlacementKind::kV, p, 2, m);
  for (int r = 0; r < p; ++r) {
    auto& program = schedule.programs[r];
    const int stage[2] = {r, 2 * p - 1 - r};  // chunk 0 down, chunk 1 up
    int next_f[2] = {0, 0};
    int next_b[2] = {0, 0};
    std::deque<std::pair<int, int>> deferred;  // (stage, micro-batch) of I's awaiting W
    auto forward = [&](int chunk) { program.push_back({stage[chunk], next_f[chunk]++, Op::kF}); };
    auto backward = [&](int chunk, bool split) {
      const int mb = next_b[chunk]++;
      program.push_back({stage[chunk], mb, split ? Op::kI : Op::kB});
      if (split) deferred.emplace_back(stage[chunk], mb);
    };
    auto weight = [&] {
      program.push_back({deferred.front().first, deferred.front().second, Op::kW});
      deferred.pop_front();
    };

    const int tail = p - 1 - r;  // phases 3, 5 and 7 run this many rounds
    for (int k = 0; k < 2 * tail; ++k) forward(0);
    for (int k = 0; k <= r; ++k) {
      forward(0);
      forward(1);
    }
    for (int k = 0; k < tail; ++k) {
      backward(1, /*split=*/true);
      weight();
      forward(1);
    }
    for (int k = 0; k < m - 2 * p + r + 1; ++k) {
      forward(0);
      backward(1, /*split=*/false);
      forward(1);
      backward(0, /*split=*/false);
    }
    for (int k = 0; k < tail; ++k) {
      backward(1, /*split=*/false);
      forward(1);
      backward(0, /*split=*/false);
    }
    const int rounds = r + 1;
    for (int k = 0; k < rounds; ++k) {
      const int half = rounds / 2;
      backward(1, /*split=*/k > half || (k == half && r % 2 == 1));
      backward(0, /*split=*/k >= half);
    }
    for (int k = 0; k < tail; ++k) {
      weight();
      backward(0, /*split=*/true);
    }
    while (!deferred.empty()) weight();
  }
  return schedule;
}

}  // namespace pipesched::scheduler
