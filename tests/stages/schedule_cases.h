// The configurations the executor tests sweep: every schedule x P in {1,2,4} x V in {1,2}
// x D in {1,2} x M in {1,4,8} that the schedule's generator accepts.
#pragma once

#include <string>
#include <vector>

#include "scheduler/registry.h"

namespace pipesched::stages::testing {

struct ScheduleCase {
  std::string schedule;
  int p, v, d, m;
  std::string Name() const {
    return schedule + " P=" + std::to_string(p) + " V=" + std::to_string(v) +
           " D=" + std::to_string(d) + " M=" + std::to_string(m);
  }
};

inline std::vector<ScheduleCase> AllScheduleCases() {
  std::vector<ScheduleCase> cases;
  for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
    for (int p : {1, 2, 4}) {
      for (int v : {1, 2}) {
        for (int d : {1, 2}) {
          for (int m : {1, 4, 8}) {
            auto s = scheduler::GenerateSchedule(
                info.name, {.num_ranks = p, .num_microbatches = m, .num_chunks = v});
            if (!s.ok() || s->num_chunks() != v) continue;
            cases.push_back({std::string(info.name), p, v, d, m});
          }
        }
      }
    }
  }
  return cases;
}

}  // namespace pipesched::stages::testing
