// Shared by the planner commands (simulate, validate) and the training commands: the
// schedule and cost model the flags describe, and the files the output flags ask for.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/command.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/trace/timeline.h"

namespace pipesched::cli {

// Limits on --stages, --virtual and --microbatches that keep the planner inside memory
// (~100 bytes per action in the simulator); simulate, validate and compare share them.
inline constexpr int kMaxRanks = 4096;
inline constexpr int kMaxChunks = 64;
inline constexpr int kMaxMicrobatches = 1 << 20;

// --schedule/--stages/--microbatches/--virtual, or --from=FILE. Range errors name the
// flag and the accepted range. A schedule searched for its costs (ScheduleInfo::uses_costs)
// is searched for `costs` (unit costs when null), once; costs that do not fit its shape
// are refused first, prefixed with `costs_source` (the --costs file) when given.
absl::StatusOr<scheduler::ScheduleFile> ScheduleFromFlags(
    const CommandContext& ctx, const scheduler::CostModel* costs = nullptr,
    const std::string& costs_source = "");

// --max-activations: 0 (each searched schedule's own limit) or 1 to 65536 stages' worth.
// InvalidArgument when --schedule's value is no generator's name but looks like a file
// (a '/', or a .csv or .json end): it says to give the file as --from.
absl::Status CheckScheduleNameIsNotAFile(const std::string& name);

absl::StatusOr<double> MaxActivationsFromFlags();
// Whether --search-steps was given with a search to run (not 0: "keep the unit-cost
// order" is what an order that is not searched does anyway).
bool SearchStepsGiven(const CommandContext& ctx);

// InvalidArgument when a flag for the searched schedules (--max-activations, --refine,
// and --search-steps where `search_steps_given`) is given for `schedule` (one schedule a
// command runs as it is) and `schedule` is not searched (its order is fixed by its name)
// or comes from a file (`from_file`). With `refines_any_order` (simulate, which refines
// any order with a split backward through scheduler::RefineSchedule) --refine is not
// checked.
absl::Status CheckSearchFlagsApply(std::string_view schedule, bool from_file,
                                   bool refines_any_order = false, bool search_steps_given = false);

// A line on stderr before a search that will take a while (`what`, e.g. "zb-v-min's
// order", searched over more than a few million actions: tens of seconds to minutes), so
// that a long run is not taken for a hang. Nothing for smaller searches.
void NoteLongSearch(const CommandContext& ctx, std::string_view what, std::int64_t actions);

// The same for work that simulates `actions` actions `simulations` times over
// (--recompute-stages=auto trying stage sets): a note on stderr when it may take seconds.
void NoteLongSimulations(const CommandContext& ctx, std::string_view what, std::int64_t simulations,
                         std::int64_t actions);

// How many searches fitting a searched order to --device-memory may take at most, for an
// order holding up to `peak_chunk_activations` per rank (SearchWithinMemory bisects the
// limit, twice at worst, and may try one stage's worth last), counting the first.
int MaxMemoryFitSearches(std::int64_t peak_chunk_activations);

// `text` for a Markdown table's cell: '|' escaped (it would end the cell), line breaks as
// spaces (they would end the row).
std::string MarkdownCell(std::string_view text);

// compare's and bench's --schedules=a,b,... (or "all", the registry's order): every name
// known, none empty or twice; with --max-activations, --refine or (`search_steps_given`)
// --search-steps, at least one of them searched.
// InvalidArgument naming the problem and the known schedules otherwise.
absl::StatusOr<std::vector<std::string>> SchedulesFromFlag(const std::string& text,
                                                           bool search_steps_given = false);

// A comma-separated list of distinct integers given as --`flag`=`text` ("2,4");
// InvalidArgument naming the flag for a part that is not an integer or one given twice.
absl::StatusOr<std::vector<int>> IntList(std::string_view flag, const std::string& text);

// --costs=FILE as the base (or the "costs" of the schedule file `file`, read from
// `file_path`), then the --cost-* and --activation-bytes flags the user gave override it
// uniformly. Per-stage and per-boundary lists must fit the schedule (CheckCostsFit); the
// error names the file they came from.
absl::StatusOr<scheduler::CostModel> CostsFromFlags(const CommandContext& ctx,
                                                    const scheduler::ScheduleFile& file,
                                                    std::string_view file_path);
// CostsFromFlags's checks of costs already read (UncheckedCostsFromFlags, with its
// `source`) against `file`'s schedule: for a caller that read them before the schedule
// existed, since --costs may be a pipe that reads once.
absl::StatusOr<scheduler::CostModel> CheckCostsForSchedule(const CommandContext& ctx,
                                                           scheduler::CostModel costs,
                                                           const std::string& source,
                                                           const scheduler::ScheduleFile& file);
// The same without the fit check, for a caller with its own rules (compare): `source`
// receives where per-stage lists came from ("" when from no file), for its errors.
// Both apply --recompute (scheduler::WithRecompute) last.
absl::StatusOr<scheduler::CostModel> UncheckedCostsFromFlags(const CommandContext& ctx,
                                                             const scheduler::ScheduleFile& file,
                                                             std::string_view file_path,
                                                             std::string* source);

// How --recompute-stages=auto chose (scheduler::RecomputeFit::exhaustive): "of every set
// that fits, the shortest step" or "chosen greedily, not proven the shortest step".
std::string RecomputeSearchText(bool exhaustive);

// Whether no rank of `sim` did any work (every action took 0 time): its idle time is no
// bubble, and its bubble ratio would divide by 0; simulate and compare refuse it.
bool NoRankWorks(const scheduler::SimResult& sim);

// Prints the statistics table of a simulation, with the closed form where one applies.
void PrintSimulation(const CommandContext& ctx, const scheduler::Schedule& schedule,
                     const scheduler::CostModel& costs, const scheduler::SimResult& sim);

// Writes --trace, --svg, --csv, --schedule-json as requested, each line "wrote PATH".
absl::Status WriteScheduleOutputs(const CommandContext& ctx, const scheduler::Schedule& schedule,
                                  const scheduler::CostModel& costs,
                                  const std::vector<const trace::Timeline*>& timelines,
                                  const std::string& svg_title);

// What --recompute-stages=auto chose (scheduler::RecomputeFit), for simulate --json's
// "recompute_plan": the stages, and the step and per-rank activation peaks it compared,
// simulated before --refine.
struct RecomputeChoice {
  std::vector<int> stages;
  double step_time_without = 0;
  double step_time_with = 0;
  std::vector<std::int64_t> peak_bytes_without;  // per rank
  std::vector<std::int64_t> peak_bytes_with;
  bool exhaustive = false;
};

// The --json statistics document; "recompute_plan" is `auto_choice`, null without one.
std::string SimulationJson(const scheduler::Schedule& schedule, const scheduler::CostModel& costs,
                           const scheduler::SimResult& sim,
                           const RecomputeChoice* auto_choice = nullptr);

}  // namespace pipesched::cli
