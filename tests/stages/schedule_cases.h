// The configurations the executor tests sweep: every schedule x P in {1,2,4} x V in {1,2}
// x D in {1,2} x M in {1,4,8} that the schedule's generator accepts. Schedules searched
// for their costs (zb-1p, zb-2p and the zb-v-* ones) are searched for SearchCosts(P x V),
// so that they run orders of their own rather than the ones unit costs give (zb-h1's,
// zb-v's).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/registry.h"

namespace pipesched::stages::testing {

struct ScheduleCase {
  std::string schedule;
  int p, v, d, m;
  std::string Name() const {
    return schedule + " P=" + std::to_string(p) + " V=" + std::to_string(v) +
           " D=" + std::to_string(d) + " M=" + std::to_string(m);
  }
};

// Uneven stages, cheap W's and transfers that cost: one entry per virtual stage, four
// kinds of stage in turn.
inline scheduler::CostModel SearchCosts(int num_stages) {
  static constexpr scheduler::StageCosts kKinds[] = {{.f = 1.0, .b = 1.5, .i = 1.0, .w = 0.5},
                                                     {.f = 1.3, .b = 1.6, .i = 0.7, .w = 0.9},
                                                     {.f = 0.8, .b = 1.5, .i = 1.2, .w = 0.3},
                                                     {.f = 1.5, .b = 2.0, .i = 1.4, .w = 0.6}};
  scheduler::CostModel costs;
  for (int s = 0; s < num_stages; ++s) costs.stages.push_back(kKinds[s % 4]);
  costs.comm_uniform = 0.2;
  return costs;
}

// The case's schedule: the registry's, searched for SearchCosts() where it uses costs.
inline absl::StatusOr<scheduler::Schedule> GenerateCase(const ScheduleCase& c) {
  const scheduler::CostModel costs = SearchCosts(c.p * c.v);
  return scheduler::GenerateSchedule(
      c.schedule, {.num_ranks = c.p, .num_microbatches = c.m, .num_chunks = c.v, .costs = &costs});
}

inline std::vector<ScheduleCase> AllScheduleCases() {
  std::vector<ScheduleCase> cases;
  for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
    for (int p : {1, 2, 4}) {
      for (int v : {1, 2}) {
        for (int d : {1, 2}) {
          for (int m : {1, 4, 8}) {
            ScheduleCase c{std::string(info.name), p, v, d, m};
            auto s = GenerateCase(c);
            if (!s.ok() || s->num_chunks() != v) continue;
            cases.push_back(std::move(c));
          }
        }
      }
    }
  }
  return cases;
}

}  // namespace pipesched::stages::testing
