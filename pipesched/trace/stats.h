// Bubble statistics of any Timeline (simulated or measured), with the notation of
// DESIGN.md: per row, busy = time covered by its compute-lane spans; the makespan runs
// from the earliest span start to the latest span end of the rows considered.
#pragma once

#include <vector>

#include "pipesched/trace/timeline.h"

namespace pipesched::trace {

struct RowStats {
  double busy = 0;  // sum of compute-lane span durations
  double idle = 0;  // makespan - busy
};

struct BubbleStats {
  double start = 0;     // earliest span start
  double makespan = 0;  // latest end - start
  // Rows [0, min(rows considered, 65536)); the totals below count every row considered.
  std::vector<RowStats> rows;
  double bubble_fraction = 0;  // total idle / (rows x makespan)
  double bubble_ratio = 0;     // total idle / total busy
};

// Statistics over rows [0, num_rows) of `timeline` (num_rows <= 0: all rows). Spans of
// other lanes count towards the makespan but not towards busy time. Spans whose start or
// end is not finite are not counted at all.
BubbleStats ComputeBubbleStats(const Timeline& timeline, int num_rows = 0);

}  // namespace pipesched::trace
