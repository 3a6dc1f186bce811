// Hand-written schedules for the validator and simulator tests: one string per rank,
// actions in PyTorch's text form separated by spaces ("0F0 0F1 0B0 0B1").
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipesched/scheduler/action.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler::testing {

inline Schedule HandSchedule(int num_ranks, int num_chunks, int num_microbatches,
                             const std::vector<std::string>& rows,
                             PlacementKind kind = PlacementKind::kLoop) {
  Schedule schedule;
  schedule.name = "hand";
  schedule.placement = Placement{.kind = kind, .num_ranks = num_ranks, .num_chunks = num_chunks};
  schedule.num_microbatches = num_microbatches;
  for (const std::string& row : rows) {
    std::vector<Action>& program = schedule.programs.emplace_back();
    std::istringstream tokens(row);
    for (std::string token; tokens >> token;) {
      absl::StatusOr<Action> action = ParseAction(token);
      EXPECT_TRUE(action.ok()) << action.status();
      if (action.ok()) program.push_back(*action);
    }
  }
  return schedule;
}

}  // namespace pipesched::scheduler::testing
