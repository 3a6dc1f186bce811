// A planner-only consumer of pipesched: generate schedules, validate them, simulate them
// under a cost model, compare with the closed-form bubble, and draw an SVG. Pure C++: it
// links pipesched::scheduler and pipesched::trace, no device runtime.
//
// Usage: planner_example [out.svg]   (default: planner.svg)
// Prints one line per schedule (P = 4, M = 8, backward twice the forward) and writes the
// simulated timelines of all of them, stacked, to the SVG.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipesched/base/file_util.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/trace/svg.h"
#include "pipesched/trace/timeline.h"
#include "pipesched/version.h"

namespace {

namespace sched = pipesched::scheduler;

absl::Status Run(const std::string& svg_path) {
  constexpr int kRanks = 4, kMicrobatches = 8;
  sched::CostModel costs;
  costs.uniform = {.f = 1, .b = 2, .i = 1, .w = 1};

  std::vector<sched::SimResult> results;
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}) {
    absl::StatusOr<sched::Schedule> schedule =
        sched::GenerateSchedule(name, {.num_ranks = kRanks, .num_microbatches = kMicrobatches});
    if (!schedule.ok()) return schedule.status();
    // Generators are correct by construction; a schedule read from a file is not.
    if (absl::Status s = sched::Validate(*schedule); !s.ok()) return s;
    absl::StatusOr<sched::SimResult> sim = sched::Simulate(*schedule, costs);
    if (!sim.ok()) return sim.status();

    const std::optional<double> closed =
        sched::ClosedFormBubbleFraction(name, {.num_ranks = kRanks,
                                               .num_chunks = schedule->num_chunks(),
                                               .num_microbatches = kMicrobatches,
                                               .costs = costs.uniform});
    char closed_text[32] = "n/a";
    if (closed) std::snprintf(closed_text, sizeof(closed_text), "%.3f", *closed);
    std::printf("%-17s P=%d V=%d M=%d  makespan %6.1f  bubble %.3f  closed form %s\n", name,
                schedule->num_ranks(), schedule->num_chunks(), schedule->num_microbatches,
                sim->makespan, sim->bubble_fraction, closed_text);
    sim->timeline.name = absl::StrCat(name, " P=", kRanks, " M=", kMicrobatches, " (simulated)");
    results.push_back(std::move(sim).value());
  }

  std::vector<const pipesched::trace::Timeline*> timelines;
  for (const sched::SimResult& r : results) timelines.push_back(&r.timeline);
  pipesched::trace::SvgOptions options;
  options.title = "pipesched planner example: P=4, M=8";
  const std::string svg = pipesched::trace::ToSvg(timelines, options);
  if (absl::Status s = pipesched::WriteFileAtomic(svg_path, svg); !s.ok()) return s;
  std::printf("wrote %s (%zu bytes)\n", svg_path.c_str(), svg.size());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("pipesched %s planner example\n", pipesched::VersionString());
  const absl::Status status = Run(argc > 1 ? argv[1] : "planner.svg");
  if (!status.ok()) {
    std::fprintf(stderr, "planner_example: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
