// A self-contained SVG picture of one or more Timelines, stacked top to bottom (e.g.
// "planned" above "measured"): one row per rank, other lanes as thinner sub-rows, boxes
// coloured by op and darker for later model chunks, micro-batch numbers inside boxes
// wide enough to hold them, idle time hatched, a time axis per timeline and a legend.
// No scripts, no external fonts or stylesheets: it opens in a browser and in a paper.
#pragma once

#include <string>
#include <vector>

#include "pipesched/trace/timeline.h"

namespace pipesched::trace {

struct SvgOptions {
  std::string title;     // drawn on top; empty: none
  std::string subtitle;  // a line under the title, e.g. makespan and bubble fraction
  int width = 1200;      // px, the whole picture; clamped to [320, 20000]
  int row_height = 24;   // px of a rank's compute row, clamped to [8, 200]; other lanes
                         // get 40% of it
  bool legend = true;
  // Timelines with the same time_unit share one time scale (so "planned" and "measured"
  // compare by length); otherwise each is scaled to the full width.
  bool shared_scale = true;
};

// Null entries are skipped. Text is XML-escaped. Never fails. Spans whose times are not
// finite are not drawn (their rows are), and declared ranks (num_ranks) from 1024 on are
// drawn only when a span uses them; the timeline's makespan line counts what was left out.
std::string ToSvg(const std::vector<const Timeline*>& timelines, const SvgOptions& options = {});

}  // namespace pipesched::trace
