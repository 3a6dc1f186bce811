// `pipesched simulate` and `pipesched validate`: the planner on the command line.
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/planning.h"
#include "scheduler/simulator.h"
#include "scheduler/validate.h"
#include "trace/grid.h"

namespace pipesched::cli {
namespace {

bool UseColor(const CommandContext& ctx) {
  std::string c = absl::GetFlag(FLAGS_color);
  return c == "always" || (c == "auto" && ctx.out_is_terminal);
}

absl::Status CheckColorFlag() {
  std::string c = absl::GetFlag(FLAGS_color);
  if (c != "auto" && c != "always" && c != "never") {
    return absl::InvalidArgumentError(
        absl::StrCat("--color=", c, " is not one of auto, always, never"));
  }
  return absl::OkStatus();
}

// Validates, simulates, prints and writes the outputs of one schedule.
absl::Status SimulateAndReport(const CommandContext& ctx, const scheduler::Schedule& schedule,
                               const scheduler::CostModel& costs) {
  PS_RETURN_IF_ERROR(scheduler::Validate(schedule));
  PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(schedule, costs));
  if (absl::GetFlag(FLAGS_grid)) {
    trace::GridOptions options;
    options.color = UseColor(ctx);
    *ctx.out << trace::RenderTimelineGrid(sim.timeline, options);
  }
  PrintSimulation(ctx, schedule, costs, sim);
  std::string title =
      absl::StrFormat("%s  P=%d V=%d M=%d  bubble %.1f%%", schedule.name, schedule.num_ranks(),
                      schedule.num_chunks(), schedule.num_microbatches, 100 * sim.bubble_fraction);
  PS_RETURN_IF_ERROR(WriteScheduleOutputs(ctx, schedule, costs, {&sim.timeline}, title));
  if (std::string p = absl::GetFlag(FLAGS_json); !p.empty()) {
    PS_RETURN_IF_ERROR(WriteFileAtomic(p, SimulationJson(schedule, costs, sim)));
    *ctx.out << "wrote " << p << "\n";
  }
  return absl::OkStatus();
}

// No output of simulate or validate is the schedule file, the cost file or another
// output (each would be replaced by what the command writes).
absl::Status CheckOutputsDistinct(std::vector<FlagPath> inputs) {
  inputs.push_back({"--costs", absl::GetFlag(FLAGS_costs)});
  return CheckFilesDistinct(inputs, {{"--trace", absl::GetFlag(FLAGS_trace)},
                                     {"--svg", absl::GetFlag(FLAGS_svg)},
                                     {"--csv", absl::GetFlag(FLAGS_csv)},
                                     {"--schedule-json", absl::GetFlag(FLAGS_schedule_json)},
                                     {"--json", absl::GetFlag(FLAGS_json)}});
}

}  // namespace

int RunSimulate(const CommandContext& ctx) {
  if (!ctx.positional.empty()) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "unexpected argument '", ctx.positional[0],
                                "'; to simulate a file use --from=", ctx.positional[0])));
  }
  if (absl::Status s = CheckColorFlag(); !s.ok()) return ReportError(ctx, s);
  if (absl::Status s = CheckOutputsDistinct({{"--from", absl::GetFlag(FLAGS_from)}}); !s.ok()) {
    return ReportError(ctx, s);
  }
  absl::StatusOr<scheduler::ScheduleFile> file = ScheduleFromFlags(ctx);
  if (!file.ok()) return ReportError(ctx, file.status());
  absl::StatusOr<scheduler::CostModel> costs =
      CostsFromFlags(ctx, *file, absl::GetFlag(FLAGS_from));
  if (!costs.ok()) return ReportError(ctx, costs.status());
  absl::Status s = SimulateAndReport(ctx, file->schedule, *costs);
  return s.ok() ? kExitOk : ReportError(ctx, s);
}

int RunValidate(const CommandContext& ctx) {
  if (ctx.positional.size() != 1) {
    return ReportError(ctx, absl::InvalidArgumentError(
                                "validate takes one schedule file: pipesched validate FILE"));
  }
  if (absl::Status s = CheckColorFlag(); !s.ok()) return ReportError(ctx, s);
  const std::string& path = ctx.positional[0];
  if (absl::Status s = CheckOutputsDistinct({{"FILE", path}}); !s.ok()) return ReportError(ctx, s);
  absl::StatusOr<scheduler::ScheduleFile> file = scheduler::LoadScheduleFile(path);
  if (!file.ok()) return ReportError(ctx, file.status());
  absl::StatusOr<scheduler::CostModel> costs = CostsFromFlags(ctx, *file, path);
  if (!costs.ok()) return ReportError(ctx, costs.status());
  if (absl::Status v = scheduler::Validate(file->schedule); !v.ok()) {
    *ctx.out << path << ": INVALID\n";
    return ReportError(ctx, absl::Status(v.code(), absl::StrCat(path, ": ", v.message())));
  }
  *ctx.out << path << ": valid\n";
  absl::Status s = SimulateAndReport(ctx, file->schedule, *costs);
  return s.ok() ? kExitOk : ReportError(ctx, s);
}

}  // namespace pipesched::cli
