#include "pipesched/trace/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace pipesched::trace {
namespace {

// Rows listed in BubbleStats::rows at most (the generators' rank limit): a timeline that
// declares 2^31 ranks must not cost 32 GB. The totals count every row.
constexpr int kMaxListedRows = 65536;

}  // namespace

BubbleStats ComputeBubbleStats(const Timeline& timeline, int num_rows) {
  BubbleStats stats;
  const int rows = num_rows > 0 ? std::min(num_rows, timeline.num_ranks) : timeline.num_ranks;
  if (rows <= 0) return stats;
  const int listed = std::min(rows, kMaxListedRows);
  stats.rows.resize(listed);
  std::map<int, double> busy_beyond;  // compute time of rows past the listed ones
  double start = std::numeric_limits<double>::infinity();
  double end = -std::numeric_limits<double>::infinity();
  for (const Span& s : timeline.spans) {
    if (s.rank < 0 || s.rank >= rows) continue;
    // A time that is not finite would make every total NaN: such spans are not counted.
    if (!std::isfinite(s.start) || !std::isfinite(s.end)) continue;
    start = std::min(start, s.start);
    end = std::max(end, s.end);
    if (s.lane != kComputeLane) continue;
    if (s.rank < listed) {
      stats.rows[s.rank].busy += s.end - s.start;
    } else {
      busy_beyond[s.rank] += s.end - s.start;
    }
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
  for (const auto& [rank, row_busy] : busy_beyond) {
    idle += std::max(0.0, stats.makespan - row_busy);
    busy += row_busy;
  }
  // The unlisted rows without compute spans: idle all along.
  idle +=
      static_cast<double>(rows - listed - static_cast<int>(busy_beyond.size())) * stats.makespan;
  if (stats.makespan > 0 && std::isfinite(stats.makespan)) {
    stats.bubble_fraction = idle / (static_cast<double>(rows) * stats.makespan);
  }
  if (busy > 0 && std::isfinite(idle)) stats.bubble_ratio = idle / busy;
  return stats;
}

}  // namespace pipesched::trace
