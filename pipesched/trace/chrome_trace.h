// Chrome / Perfetto trace export: the JSON Trace Event Format that chrome://tracing and
// ui.perfetto.dev load. One process per (timeline, rank), one thread per lane, one
// complete ("X") event per span and a flow arrow ("s" -> "f") per Timeline::flows entry.
// It draws; it does not validate: spans are written as they are, except that a span
// whose times are not finite numbers of microseconds (NaN, inf, or overflowing on the
// conversion) is left out with its flows, since JSON would write null, and declared ranks
// (num_ranks) from 1024 on get a process only when a span uses them. The trace's
// "otherData" counts what was left out ("timeline <i> left out").
#pragma once

#include <string>
#include <vector>

#include "pipesched/trace/timeline.h"

namespace pipesched::trace {

// Times are written in microseconds, as the format requires. A timeline whose
// time_unit is "us" is written as is ("ns", "ms" and "s" are converted); any other unit
// (the simulator's "unit") is scaled 1 unit = 1000 us, and the trace's "otherData"
// says so. Processes are named "<timeline name>: rank <r>" and sorted timeline-major,
// so "planned" and "measured" timelines sit one above the other. Null entries are
// skipped. Never fails; write the result with WriteFileAtomic (base/file_util.h).
std::string ToChromeTrace(const std::vector<const Timeline*>& timelines);

// Microseconds per time unit of `time_unit` as written by ToChromeTrace.
double MicrosecondsPerUnit(const std::string& time_unit);

}  // namespace pipesched::trace
