#include "trace/stats.h"

#include <algorithm>
#include <limits>

namespace pipesched::trace {

BubbleStats ComputeBubbleStats(const Timeline& timeline, int num_rows) {
  BubbleStats stats;
  int rows = num_rows > 0 ? std::min(num_rows, timeline.num_ranks) : timeline.num_ranks;
  if (rows <= 0) return stats;
  stats.rows.resize(rows);
  double start = std::numeric_limits<double>::infinity();
  double end = -std::numeric_limits<double>::infinity();
  for (const Span& s : timeline.spans) {
    if (s.rank < 0 || s.rank >= rows) continue;
    start = std::min(start, s.start);
    end = std::max(end, s.end);
    if (s.lane == kComputeLane) stats.rows[s.rank].busy += s.end - s.start;
  }
  if (end < start) return stats;  // no spans
  stats.start = start;
  stats.makespan = end - start;
  double idle = 0, busy = 0;
  for (RowStats& r : stats.rows) {
    r.idle = std::max(0.0, stats.makespan - r.busy);
    idle += r.idle;
    busy += r.busy;
  }
  if (stats.makespan > 0) stats.bubble_fraction = idle / (rows * stats.makespan);
  if (busy > 0) stats.bubble_ratio = idle / busy;
  return stats;
}

}  // namespace pipesched::trace
