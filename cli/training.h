// Shared by `pipesched train` and `pipesched bench`: the TrainerConfig the flags
// describe, with range checks that name the flag.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/command.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/stages/bubble_analysis.h"
#include "pipesched/stages/executor.h"
#include "pipesched/stages/recompute_plan.h"
#include "pipesched/stages/trainer.h"

namespace pipesched::cli {

// The most --layers (hidden blocks) a run takes.
inline constexpr int kMaxLayers = model::MlpConfig::kMaxLayers;

// The spread simulation (stages::SpreadBubble): with 200 draws its result moves by
// 0.05-0.07 pp (standard deviation over seeds) for 1f1b, interleaved-1f1b and zb-v at
// P=2, M=16 on the bench's model, and costs 3-8 ms per configuration.
inline constexpr int kSpreadDraws = 200;
inline constexpr std::uint64_t kSpreadSeed = 1;

// The draws for `schedule`: kSpreadDraws, fewer (at least 20) where that would simulate
// more than 4 million actions in all (1F1B at P=64, M=1024 takes 30), so that a big
// pipeline's report does not wait minutes for it.
inline int SpreadDraws(const scheduler::Schedule& schedule) {
  const std::int64_t actions = std::max<std::int64_t>(schedule.NumActions(), 1);
  return static_cast<int>(std::clamp<std::int64_t>(4'000'000 / actions, 20, kSpreadDraws));
}

// For `launch -- train ...`: the checks train makes before it joins the job and creates
// its trainer -- its flags parse, their ranges and combinations, the files it reads
// (--from) and writes (process 0's outputs), and stages::Trainer::CheckConfig -- made in
// the launcher on `command` ("train" and its flags, with the process flags launch adds),
// so that a mistake is one line before any process starts rather than one per process.
// It parses `command` into the program's flags and leaves them so (absl::FlagSaver's
// restore logs every flag it restores): the caller reads its own flags first.
absl::Status CheckTrainCommandLine(const std::vector<std::string>& command);

// The same for `launch -- bench ...`: bench's flags parse, the job's flags
// (CheckJobFlags) and the sweep's (its lists, ranges and --from files). The output
// paths are process 0's to check, once it has joined (a failure there stops the others).
absl::Status CheckBenchCommandLine(const std::vector<std::string>& command);

// Everything but the schedule name, P, V and M (bench sweeps those).
absl::StatusOr<stages::TrainerConfig> TrainerConfigFromFlags(const CommandContext& ctx);

// A schedule file (--from) that the built-in MLP can run: loaded, valid (the validator's
// first line, and how to see the rest) and with at most kMaxLayers + 1 chunks; errors
// name the path.
absl::StatusOr<scheduler::Schedule> LoadTrainableSchedule(const std::string& path);

// The trainer's measured plan on this machine: MeasuredCosts() with each boundary's
// effective hand-off latency and the stream's gap between actions from `idle` (one step's
// stages::AnalyzeIdle), as `train --save-costs` writes it.
absl::StatusOr<scheduler::CostModel> HandoffCosts(const stages::Trainer& trainer,
                                                  const stages::IdleAnalysis& idle);

// --recompute-stages=auto, then the trainer: stages::PlanRecompute(*config) (refused,
// InvalidArgument, for a schedule whose order a search with search_steps > 0 would replace
// afterwards; `command`, "train" or "bench", decides which fixes the message offers), its
// stages in config->recompute_stages and the plan in *plan, then CreateTrainer. The plan
// holds the machine's memory to what the process could take when it was made; when that
// has shrunk by the time the trainer checks again (ResourceExhausted), it plans once more
// against the new figure, and a second refusal says it followed auto's choice.
absl::StatusOr<std::unique_ptr<stages::Trainer>> CreateTrainerRecomputingToFit(
    stages::TrainerConfig* config, int search_steps, std::string_view command,
    stages::RecomputePlan* plan, std::string* note);

// The virtual stages of `executor` that recompute their activations, ascending.
std::vector<int> RecomputingStages(const stages::Executor& executor);

// --recompute-stages=auto's line (no newline): the stages chosen, and what each memory's
// ranks plan to hold (and held without, where that differs) of what it has.
std::string RecomputePlanLine(const stages::RecomputePlan& plan);

// --search-steps, 0 to 100.
absl::StatusOr<int> SearchStepsFromFlags();

// The trainer for `*config`. For a schedule searched for its costs (zb-1p, zb-2p, zb-v-1p,
// interleaved-zb-1p, zb-v-half, zb-v-min) named by `config->schedule`, it first trains
// `search_steps` steps of its unit-cost order (zb-h1's for zb-1p and zb-2p) on a trainer of its own
// and runs the order searched for the costs measured there -- the median action times with the last
// step's hand-off latencies and stream gap, as `train --save-costs` writes them -- and
// leaves that order in `config->schedule_override`, so that a trainer made from `*config`
// later (bench's step with exact memory accounting) runs the same order. When the searched
// order's activations do not fit the devices' memory it runs the unit-cost order instead.
// `note` gets one line per decision (with both orders' makespans planned for the measured
// costs); errors of the measuring steps say that they come from them. Any other schedule,
// a schedule_override or search_steps = 0: Trainer::Create(*config), no note, `*config`
// unchanged.
absl::StatusOr<std::unique_ptr<stages::Trainer>> CreateTrainer(stages::TrainerConfig* config,
                                                               int search_steps, std::string* note);

}  // namespace pipesched::cli
