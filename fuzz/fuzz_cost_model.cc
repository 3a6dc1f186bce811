// libFuzzer target: cost-model JSON -> ParseCostModelJson -> Simulate of 1f1b (P=4, M=8)
// and interleaved-1f1b (P=2, V=2, M=4) with it. Holds the library to: no crash, and
// simulating a valid generated schedule succeeds under any cost model the parser accepts
// and CheckCostsFit finds fitting (what the command line checks before it simulates).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "scheduler/cost_model.h"
#include "scheduler/registry.h"
#include "scheduler/simulator.h"

namespace pipesched::scheduler {
namespace {

const std::vector<Schedule>& Schedules() {
  static const std::vector<Schedule>* schedules = [] {
    auto* out = new std::vector<Schedule>;
    for (auto [name, params] : {std::pair{"1f1b", GeneratorParams{4, 8, 0}},
                                std::pair{"interleaved-1f1b", GeneratorParams{2, 4, 2}}}) {
      absl::StatusOr<Schedule> s = GenerateSchedule(name, params);
      PS_FUZZ_CHECK(s.ok(), s.status());
      out->push_back(*std::move(s));
    }
    return out;
  }();
  return *schedules;
}

void FuzzOne(std::string_view text) {
  absl::StatusOr<CostModel> costs = ParseCostModelJson(text);
  if (!costs.ok()) return;
  for (const Schedule& schedule : Schedules()) {
    const bool fits = CheckCostsFit(*costs, schedule.num_ranks(), schedule.num_chunks()).ok();
    absl::StatusOr<SimResult> sim = Simulate(schedule, *costs);
    if (!fits) continue;  // it may be refused, and must not crash
    PS_FUZZ_CHECK(sim.ok(), sim.status());
    PS_FUZZ_CHECK(!(sim->makespan < 0), "negative makespan");
    PS_FUZZ_CHECK(std::isfinite(sim->step_time) && sim->step_time >= sim->makespan,
                  "a step shorter than its makespan");
  }
}

}  // namespace
}  // namespace pipesched::scheduler

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pipesched::scheduler::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
