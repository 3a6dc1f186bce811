// Schedule files: PyTorch's pipelining CSV (one row per rank, comma-separated actions,
// empty cells are idle steps and are dropped) and pipesched's versioned JSON, which
// also carries P, V, M, placement and optional costs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "scheduler/cost_model.h"
#include "scheduler/schedule.h"

namespace pipesched::scheduler {

// Infers P (rows), the number of stages and V = stages / P, the placement (loop or v,
// whichever matches where each stage's actions sit) and M. InvalidArgument with the
// line and column of a bad token, or naming what cannot be inferred.
absl::StatusOr<Schedule> ParsePytorchCsv(std::string_view text);
// Inverse of ParsePytorchCsv: one line per rank, '\n' terminated. Compute-only files
// written by PyTorch round-trip byte for byte.
std::string ToPytorchCsv(const Schedule& schedule);

struct ScheduleFile {
  Schedule schedule;
  std::optional<CostModel> costs;
};

// {"format": "pipesched-schedule", "version": 1, "name": ..., "stages": P,
//  "virtual": V, "microbatches": M, "placement": "loop"|"v",
//  "programs": [["0F0", "0F1", ...], ...], "costs": {cost-model JSON, optional}}
absl::StatusOr<ScheduleFile> ParseScheduleJson(std::string_view text);
std::string ToScheduleJson(const Schedule& schedule, const CostModel* costs = nullptr);

// Reads a file and detects its format (JSON when the first non-blank byte is '{',
// CSV otherwise). Errors start with the path.
absl::StatusOr<ScheduleFile> LoadScheduleFile(const std::string& path);

}  // namespace pipesched::scheduler
