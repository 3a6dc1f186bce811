// libFuzzer target: PyTorch pipelining CSV -> ParsePytorchCsv -> Validate -> Simulate.
// Holds the library to: parsing, validating and simulating never crash; a valid schedule
// simulates (Simulate fails only where Validate does); ToPytorchCsv round-trips.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {
namespace {

void FuzzOne(std::string_view text) {
  absl::StatusOr<Schedule> schedule = ParsePytorchCsv(text);
  if (!schedule.ok()) return;

  std::string csv = ToPytorchCsv(*schedule);
  absl::StatusOr<Schedule> again = ParsePytorchCsv(csv);
  PS_FUZZ_CHECK(again.ok(), again.status());
  PS_FUZZ_CHECK(again->programs == schedule->programs, "programs differ after ToPytorchCsv");
  PS_FUZZ_CHECK(again->placement == schedule->placement, "placement differs after ToPytorchCsv");

  if (schedule->NumActions() > fuzz::kMaxSimulatedActions) return;
  absl::Status valid = Validate(*schedule);
  if (!valid.ok()) return;
  absl::StatusOr<SimResult> sim = Simulate(*schedule, CostModel{});
  PS_FUZZ_CHECK(sim.ok(), sim.status());
  PS_FUZZ_CHECK(sim->makespan >= 0, "negative makespan");
}

}  // namespace
}  // namespace pipesched::scheduler

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pipesched::scheduler::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
