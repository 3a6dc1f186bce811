// Schedule files: PyTorch's pipelining CSV (one row per rank, comma-separated actions,
// empty cells are idle steps and are dropped) and pipesched's versioned JSON, which
// also carries P, V, M, placement and optional costs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

// Infers P (rows), the number of stages and V = stages / P, the placement (loop or v,
// whichever matches where each stage's actions sit, loop when both do; explicit, each
// stage on the row its actions sit on, when neither does) and M. Accepts
// "\r\n" line ends, a UTF-8 BOM, spaces around cells and trailing blank lines; the name
// is left empty. A cell "(0F3;5B1)OVERLAP_F_B" (PyTorch's ScheduleDualPipeV pairs) is
// read as its compute actions in that order: pipesched issues them one after the other.
// A quoted cell ("0F0") is read as the text inside. FSDP's "<stage>UNSHARD" and
// "<stage>RESHARD", which PyTorch's compute_comms dump writes for every multi-stage
// schedule, are skipped: pipesched does not shard parameters.
// InvalidArgument with the line and column of a bad token ("line 2, column 5: bad action
// ..."), or naming what cannot be inferred; an empty text, a row without actions, a
// stage count that is not a multiple of P, a stage with actions on two rows or none, and
// rows holding different numbers of stages are errors. Completeness and order are Validate()'s job.
absl::StatusOr<Schedule> ParsePytorchCsv(std::string_view text);
// Inverse of ParsePytorchCsv: one line per rank, '\n' terminated, the actions only (no
// empty cells for idle steps), ALLREDUCE as PyTorch's "<stage>REDUCE_GRAD". A file
// written by PyTorch comes back with the same actions in the same order on every rank,
// but not byte for byte: its "\r\n" line ends, empty cells, FSDP markers and quotes are
// not kept, and overlapped pairs come back as their two actions. `schedule` must be valid
// (Validate()): a negative stage or micro-batch, or an Op outside the enum, is written as it is
// ("-5F0", "0?0") and the text does not parse back.
std::string ToPytorchCsv(const Schedule& schedule);

struct ScheduleFile {
  Schedule schedule;
  std::optional<CostModel> costs;
};

// {"format": "pipesched-schedule", "version": 1, "name": ..., "stages": P,
//  "virtual": V, "microbatches": M, "placement": "loop"|"v"|[rank of each virtual stage],
//  "programs": [["0F0", "0F1", ...], ...], "costs": {cost-model JSON, optional}}
// "virtual" defaults to 1 and "placement" to "loop"; an array must pass CheckPlacement
// (P x V entries, each rank V times). InvalidArgument naming the key
// ("programs[1][3]") for unknown keys, wrong types, a bad action, a "programs" row count
// other than "stages", "stages" x "virtual" above 2^24, or a "version" other than 1; the
// parser's position for bad JSON.
absl::StatusOr<ScheduleFile> ParseScheduleJson(std::string_view text);
// Inverse of ParseScheduleJson: the JSON above, with "costs" when `costs` is not null.
// Never fails. `schedule` must be valid (Validate()), or the file may not load back (as
// ToPytorchCsv), and `costs` within CheckCostModel()'s ranges (a NaN is written as null).
std::string ToScheduleJson(const Schedule& schedule, const CostModel* costs = nullptr);

// A cost-model file (ParseCostModelJson's format, scheduler/cost_model.h) that simulates
// the same as `costs`: the default and per-stage costs, the per-boundary list (or the
// uniform transfer time when there is no list; comm_uniform is not written next to a
// list, which overrides it on every boundary), the action gap. Per-action overrides
// (CostModel::actions, transfers, gaps) are not part of the format.
std::string ToCostModelJson(const CostModel& costs);

// Reads a file and detects its format (JSON when the first non-blank byte is '{',
// CSV otherwise). Errors start with the path: NotFound / PermissionDenied from reading
// it, InvalidArgument from the parsers above. An unnamed schedule takes the file's name
// without directory and extension. The schedule is not validated: call Validate().
absl::StatusOr<ScheduleFile> LoadScheduleFile(const std::string& path);

}  // namespace pipesched::scheduler
