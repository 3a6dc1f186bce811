// A small hand-made Timeline shared by the exporter tests: 2 ranks, unit time,
//   rank 0 | F0 F1 ...... B0    B1    AR
//     send |   SF SF
//   rank 1 | .. F0 B0    F1 B1    ........
// with flows F0(r0) -> F0(r1) and F1(r0) -> F1(r1).
#pragma once

#include "pipesched/trace/timeline.h"

namespace pipesched::trace::testing {

inline Timeline TwoRankTimeline() {
  Timeline t;
  t.name = "simulated";
  t.time_unit = "unit";
  t.num_ranks = 2;
  t.spans = {
      {0, kComputeLane, 0, 0, "F", 0, 1},             // 0
      {0, kComputeLane, 0, 1, "F", 1, 2},             // 1
      {0, kSendLane, 0, 0, "SEND_F", 1, 1.5},         // 2
      {0, kSendLane, 0, 1, "SEND_F", 2, 2.5},         // 3
      {1, kComputeLane, 1, 0, "F", 1.5, 2.5},         // 4
      {1, kComputeLane, 1, 0, "B", 2.5, 4.5},         // 5
      {1, kComputeLane, 1, 1, "F", 4.5, 5.5},         // 6
      {1, kComputeLane, 1, 1, "B", 5.5, 7.5},         // 7
      {0, kComputeLane, 0, 0, "B", 4.5, 6.5},         // 8
      {0, kComputeLane, 0, 1, "B", 7.5, 9.5},         // 9
      {0, kCommLane, 0, -1, "ALLREDUCE", 9.5, 10.5},  // 10
  };
  t.flows = {{0, 4}, {1, 6}};
  return t;
}

}  // namespace pipesched::trace::testing
