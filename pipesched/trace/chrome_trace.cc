// Trace Event Format writer. Reference: "Trace Event Format" (Google doc linked from
// chromium's catapult): "X" complete events carry ts and dur in microseconds; "M"
// metadata events name processes and threads; flow events "s" (start) and "f" (finish)
// with the same cat/name/id draw an arrow; "s" binds to the slice enclosing its ts and
// "f" with "bp": "e" binds to the slice enclosing its ts too (not the next one).
#include "pipesched/trace/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pipesched/trace/op_style.h"

namespace pipesched::trace {
namespace {

using nlohmann::json;

// One abstract simulator unit is drawn as a millisecond: long enough to read in the
// viewer's default zoom, and the "ms" ruler then reads in units.
constexpr double kAbstractUnitUs = 1000;

// A lane's first row is the thread with the lane's number; its further rows (LaneRows)
// are threads numbered past every lane in use, in sort order after the lane's first.
constexpr long long kRowTidStride = 1 << 20;
long long Tid(int lane, int row) { return lane + kRowTidStride * row; }
long long SortIndex(int lane, int row) { return static_cast<long long>(lane) * 4096 + row; }

std::string LaneName(int lane) {
  switch (lane) {
    case kComputeLane:
      return "compute";
    case kSendLane:
      return "send";
    case kRecvLane:
      return "recv";
    case kCommLane:
      return "collectives";
    default:
      return absl::StrCat("lane ", lane);
  }
}

// "2F3" (the schedule's action text), "2ALLREDUCE", or the bare op without a stage.
std::string EventName(const Span& span) {
  std::string name = span.stage >= 0 ? absl::StrCat(span.stage, span.op) : span.op;
  if (span.microbatch >= 0) absl::StrAppend(&name, span.microbatch);
  return name;
}

std::string Category(const std::string& op) {
  if (op == "F" || op == "B" || op == "I" || op == "W") return "compute";
  if (op == "ZERO_GRAD" || op == "OPTIMIZER") return "step";
  return "comm";
}

bool IsPhysicalUnit(const std::string& unit) {
  return unit == "us" || unit == "ns" || unit == "ms" || unit == "s";
}

}  // namespace

double MicrosecondsPerUnit(const std::string& time_unit) {
  if (time_unit == "us") return 1;
  if (time_unit == "ns") return 1e-3;
  if (time_unit == "ms") return 1e3;
  if (time_unit == "s") return 1e6;
  return kAbstractUnitUs;
}

namespace {

std::string TimelineLabel(const Timeline& timeline, int index) {
  return timeline.name.empty() ? absl::StrCat("timeline ", index) : timeline.name;
}

// The trace's "otherData": each timeline's name and unit, and what was left out of it
// (ranks without spans beyond the drawn ones, spans whose times are not finite).
json OtherData(const std::vector<const Timeline*>& timelines) {
  json other = json::object();
  int timeline_index = 0;
  for (const Timeline* timeline : timelines) {
    if (timeline == nullptr) continue;
    const double scale = MicrosecondsPerUnit(timeline->time_unit);
    const std::string label = TimelineLabel(*timeline, timeline_index);
    other[absl::StrCat("timeline ", timeline_index)] =
        IsPhysicalUnit(timeline->time_unit)
            ? absl::StrCat(label, " (time in ", timeline->time_unit, ")")
            : absl::StrCat(label, " (abstract time: 1 ", timeline->time_unit, " = ",
                           kAbstractUnitUs, " us)");
    long long not_finite = 0;
    for (const Span& span : timeline->spans) {
      const double start = span.start * scale, end = span.end * scale;
      if (!std::isfinite(start) || !std::isfinite(end) || !std::isfinite(end - start)) {
        ++not_finite;
      }
    }
    std::string left_out;
    if (const long long empty = internal::EmptyRanksNotDrawn(*timeline); empty > 0) {
      absl::StrAppend(&left_out, empty, " ranks without spans");
    }
    if (not_finite > 0) {
      absl::StrAppend(&left_out, left_out.empty() ? "" : "; ", not_finite,
                      " spans whose times are not finite numbers of microseconds");
    }
    if (!left_out.empty()) other[absl::StrCat("timeline ", timeline_index, " left out")] = left_out;
    ++timeline_index;
  }
  return other;
}

}  // namespace

std::string ToChromeTrace(const std::vector<const Timeline*>& timelines) {
  // One event per line: diffable, and still one JSON document. Each event is written out
  // as soon as it is made, behind the head: a tree of every event would take some 4 KB an
  // action (a GiB for 262k), and, with memory running out, its destructor's own
  // allocation would abort the program instead of reporting it.
  std::string events = absl::StrCat(
      "{\"displayTimeUnit\": \"ms\",\n\"otherData\": ",
      OtherData(timelines).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      ",\n\"traceEvents\": [\n");
  bool first_event = true;
  auto emit = [&events, &first_event](const json& event) {
    absl::StrAppend(&events, first_event ? "" : ",\n",
                    event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    first_event = false;
  };
  int next_pid = 1;
  long long next_flow_id = 1;
  int timeline_index = 0;
  for (const Timeline* timeline : timelines) {
    if (timeline == nullptr) continue;
    const double scale = MicrosecondsPerUnit(timeline->time_unit);
    const std::string label = TimelineLabel(*timeline, timeline_index);

    // Ranks: all of [0, num_ranks) plus any a span names beyond it, but declared ranks
    // without spans only up to kMaxEmptyRanksDrawn.
    const int num_ranks = std::min(timeline->num_ranks, internal::kMaxEmptyRanksDrawn);
    // Threads: a lane each, and a thread more for each span that overlaps the lane's
    // others (LaneRows): viewers draw a thread's slices as a stack, and two that overlap
    // without nesting are drawn over each other.
    const std::vector<int> lane_row = internal::LaneRows(*timeline);
    std::map<int, std::set<std::pair<int, int>>> lanes_of_rank;
    for (int r = 0; r < num_ranks; ++r) lanes_of_rank[r].insert({kComputeLane, 0});
    for (std::size_t i = 0; i < timeline->spans.size(); ++i) {
      lanes_of_rank[timeline->spans[i].rank].insert({timeline->spans[i].lane, lane_row[i]});
    }

    std::map<int, int> pid_of_rank;
    for (const auto& [rank, lanes] : lanes_of_rank) {
      const int pid = next_pid++;
      pid_of_rank[rank] = pid;
      emit(json({{"name", "process_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", 0},
                 {"args", {{"name", absl::StrCat(label, ": ", RowName(*timeline, rank))}}}}));
      emit(json({{"name", "process_sort_index"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", 0},
                 {"args", {{"sort_index", pid}}}}));
      for (const auto& [lane, row] : lanes) {
        const std::string name =
            row == 0 ? LaneName(lane) : absl::StrCat(LaneName(lane), " (", row + 1, ")");
        emit(json({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"tid", Tid(lane, row)},
                   {"args", {{"name", name}}}}));
        emit(json({{"name", "thread_sort_index"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"tid", Tid(lane, row)},
                   {"args", {{"sort_index", SortIndex(lane, row)}}}}));
      }
    }

    // A time that is not a finite number of microseconds would be written as null, which
    // the viewers refuse: such spans (and their flows) are left out (counted in OtherData).
    auto times_us = [&](const Span& span, double* start, double* end) {
      *start = span.start * scale;
      *end = span.end * scale;
      return std::isfinite(*start) && std::isfinite(*end) && std::isfinite(*end - *start);
    };
    for (std::size_t i = 0; i < timeline->spans.size(); ++i) {
      const Span& span = timeline->spans[i];
      double start_us = 0, end_us = 0;
      if (!times_us(span, &start_us, &end_us)) continue;
      json args = {{"op", span.op}};
      if (span.stage >= 0) args["stage"] = span.stage;
      if (span.microbatch >= 0) args["microbatch"] = span.microbatch;
      emit(json({{"name", EventName(span)},
                 {"cat", Category(span.op)},
                 {"ph", "X"},
                 {"pid", pid_of_rank[span.rank]},
                 {"tid", Tid(span.lane, lane_row[i])},
                 {"ts", start_us},
                 {"dur", std::max(0.0, end_us - start_us)},
                 {"args", std::move(args)}}));
    }

    const int num_spans = static_cast<int>(timeline->spans.size());
    for (const Flow& flow : timeline->flows) {
      if (flow.from < 0 || flow.from >= num_spans || flow.to < 0 || flow.to >= num_spans) {
        continue;
      }
      const Span& from = timeline->spans[flow.from];
      const Span& to = timeline->spans[flow.to];
      double from_start = 0, from_end = 0, to_start = 0, to_end = 0;
      if (!times_us(from, &from_start, &from_end) || !times_us(to, &to_start, &to_end)) continue;
      // The start sits just inside the end of its slice so that the arrow leaves where
      // the producer finishes; the finish sits on the consumer's start (inclusive).
      from_end = std::max(from_start, from_end);
      const double start_ts =
          std::max(from_start, from_end - std::min(0.001, (from_end - from_start) / 2));
      const long long id = next_flow_id++;
      emit(json({{"name", "dependency"},
                 {"cat", "flow"},
                 {"ph", "s"},
                 {"id", id},
                 {"pid", pid_of_rank[from.rank]},
                 {"tid", Tid(from.lane, lane_row[flow.from])},
                 {"ts", start_ts}}));
      emit(json({{"name", "dependency"},
                 {"cat", "flow"},
                 {"ph", "f"},
                 {"bp", "e"},
                 {"id", id},
                 {"pid", pid_of_rank[to.rank]},
                 {"tid", Tid(to.lane, lane_row[flow.to])},
                 {"ts", to_start}}));
    }
    ++timeline_index;
  }
  absl::StrAppend(&events, first_event ? "" : "\n", "]}\n");
  return events;
}

}  // namespace pipesched::trace
