// A Timeline is what both the simulator and the executor produce: spans of work on
// (rank, lane) rows with start/end times. Every exporter in trace/ draws one or more
// Timelines. trace/ knows nothing of schedules or devices: ops are plain labels.
#pragma once

#include <string>
#include <vector>

namespace pipesched::trace {

// Conventional lanes within a rank. Exporters draw any lane number; these are names.
inline constexpr int kComputeLane = 0;
inline constexpr int kSendLane = 1;
inline constexpr int kRecvLane = 2;
inline constexpr int kCommLane = 3;  // data-parallel collectives

struct Span {
  int rank = 0;  // device row
  int lane = kComputeLane;
  int stage = -1;       // virtual stage (model chunk), -1 when not applicable
  int microbatch = -1;  // -1 when not applicable (e.g. ALLREDUCE)
  std::string op;       // "F", "B", "I", "W", "SEND_F", "RECV_B", "ALLREDUCE", ...
  double start = 0;
  double end = 0;
};

// A dependency arrow between two spans (indices into Timeline::spans), drawn as a
// flow in Chrome traces; typically cross-rank F(s-1,m) -> F(s,m).
struct Flow {
  int from = 0;
  int to = 0;
};

struct Timeline {
  std::string name;                // e.g. "1f1b P=4 M=8 (simulated)"
  std::string time_unit = "unit";  // "unit" for simulated unit costs, "us" for measured
  int num_ranks = 0;
  // Rows of several replicas of one pipeline (the executor's timeline with D > 1: row =
  // replica * ranks_per_replica + rank), which the exporters name "replica d rank r"
  // (RowName); 0: every row is a rank of its own ("rank r").
  int ranks_per_replica = 0;
  std::vector<Span> spans;
  std::vector<Flow> flows;

  double Makespan() const {
    double m = 0;
    for (const Span& s : spans) m = s.end > m ? s.end : m;
    return m;
  }
};

// What the exporters call row `row` (Span::rank): "rank 3", or "replica 1 rank 0" where
// the rows are several replicas' (Timeline::ranks_per_replica).
inline std::string RowName(const Timeline& timeline, int row) {
  const int per = timeline.ranks_per_replica;
  if (per > 0 && timeline.num_ranks > per && row >= 0) {
    return "replica " + std::to_string(row / per) + " rank " + std::to_string(row % per);
  }
  return "rank " + std::to_string(row);
}

// What a drawing calls the timeline's length: "step time" when it has a step's phases
// (WithStepPhases: its length is the whole step's, not the schedule's makespan),
// "makespan" otherwise.
inline const char* LengthLabel(const Timeline& timeline) {
  for (const Span& s : timeline.spans) {
    if (s.op == "ZERO_GRAD" || s.op == "OPTIMIZER") return "step time";
  }
  return "makespan";
}

// `timeline` with `phases` (spans outside the schedule's actions: a step's "ZERO_GRAD"s,
// which start before the first action, and "OPTIMIZER"s after the last) appended, every
// span shifted so that the earliest starts at 0, and ", whole step" added to its name:
// a picture of the whole step. Flows keep their indices. Without phases, `timeline` as
// it is. For drawing only: its makespan is the step's, and trace::ComputeBubbleStats of
// it counts the phases as work.
inline Timeline WithStepPhases(Timeline timeline, const std::vector<Span>& phases) {
  if (phases.empty()) return timeline;
  timeline.name += ", whole step";
  timeline.spans.insert(timeline.spans.end(), phases.begin(), phases.end());
  double origin = timeline.spans.front().start;
  for (const Span& s : timeline.spans) origin = s.start < origin ? s.start : origin;
  for (Span& s : timeline.spans) {
    s.start -= origin;
    s.end -= origin;
  }
  return timeline;
}

}  // namespace pipesched::trace
