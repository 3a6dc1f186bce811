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
  std::vector<Span> spans;
  std::vector<Flow> flows;

  double Makespan() const {
    double m = 0;
    for (const Span& s : spans) m = s.end > m ? s.end : m;
    return m;
  }
};

}  // namespace pipesched::trace
