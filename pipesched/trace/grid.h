// Terminal grid of a Timeline: one row per rank (and one per other non-empty lane),
// time flowing left to right in fixed-width columns, each span labelled with its op and
// micro-batch ("F0", "B3", "SF2", "AR"), and its stage first ("2F0") where a rank runs
// several stages (interleaved, V schedules), idle time as '.', a time axis and a legend.
// For reading a schedule at a glance in a terminal; the SVG is for pictures.
#pragma once

#include <string>

#include "pipesched/trace/timeline.h"

namespace pipesched::trace {

struct GridOptions {
  // Total width in columns, row labels included. The time scale is chosen so that every
  // span's label fits when possible, then shrunk to this width; a span narrower than its
  // label shows its stage and op without the micro-batch number ("2F"), or its op alone
  // (cut to the span's width).
  // Clamped to [1, 10000]; the time columns are at least 10 wide whatever it is.
  int max_width = 120;
  // ANSI colour per op (the CLI sets it when stdout is a terminal).
  bool color = false;
  // The timeline's name and the time scale above the grid.
  bool header = true;
  // Time axis and legend below the grid.
  bool axis = true;
  bool legend = true;
};

// Every line ends with '\n'. An empty timeline renders its header and empty rank rows.
// Declared ranks (num_ranks) from 1024 on get a row only when a span uses them; one line
// under the rows counts those left out.
std::string RenderTimelineGrid(const Timeline& timeline, const GridOptions& options = {});

}  // namespace pipesched::trace
