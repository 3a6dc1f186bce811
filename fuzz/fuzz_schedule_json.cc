// libFuzzer target: pipesched schedule JSON -> ParseScheduleJson -> Validate -> Simulate
// with the file's own costs when it has them. Holds the library to: no crash; a valid
// schedule simulates; ToScheduleJson round-trips the programs, shape and costs' parse;
// a closed form offered for it (ClosedFormFor) is its simulated bubble fraction.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {
namespace {

void FuzzOne(std::string_view text) {
  absl::StatusOr<ScheduleFile> file = ParseScheduleJson(text);
  if (!file.ok()) return;
  const Schedule& schedule = file->schedule;
  const CostModel costs = file->costs.value_or(CostModel{});

  std::string json = ToScheduleJson(schedule, file->costs ? &costs : nullptr);
  absl::StatusOr<ScheduleFile> again = ParseScheduleJson(json);
  PS_FUZZ_CHECK(again.ok(), again.status());
  PS_FUZZ_CHECK(again->schedule.programs == schedule.programs, "programs differ");
  PS_FUZZ_CHECK(again->schedule.num_microbatches == schedule.num_microbatches, "M differs");
  PS_FUZZ_CHECK(again->schedule.placement == schedule.placement &&
                    again->schedule.num_ranks() == schedule.num_ranks() &&
                    again->schedule.num_chunks() == schedule.num_chunks(),
                "placement differs");
  PS_FUZZ_CHECK(again->costs.has_value() == file->costs.has_value(), "costs lost");

  if (schedule.NumActions() > fuzz::kMaxSimulatedActions) return;
  absl::Status valid = Validate(schedule);
  if (!valid.ok()) return;
  absl::StatusOr<SimResult> sim = Simulate(schedule, costs);
  PS_FUZZ_CHECK(sim.ok(), sim.status());
  PS_FUZZ_CHECK(std::isfinite(sim->step_time) && sim->step_time >= sim->makespan,
                "a step shorter than its makespan");
  // Wherever a closed form is offered (simulate and validate print it next to the
  // simulated fraction), it is the simulated fraction.
  if (const std::optional<double> formula = ClosedFormFor(schedule, costs)) {
    PS_FUZZ_CHECK(std::abs(*formula - sim->bubble_fraction) <= 1e-9,
                  "a closed form offered that is not the simulated bubble fraction");
  }
}

}  // namespace
}  // namespace pipesched::scheduler

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pipesched::scheduler::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
