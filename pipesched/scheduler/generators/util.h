// Helpers shared by the generator files: parameter checks with user-facing messages
// and the empty schedule they fill. Internal to scheduler/generators/.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler::generators_internal {

// Checks P >= 1, M >= 1, V >= 0 and a sane size, and returns V with 0 replaced by
// `default_chunks`. Messages start with `schedule` ("gpipe needs ...").
absl::StatusOr<int> CheckParams(std::string_view schedule, const GeneratorParams& params,
                                int default_chunks);

// InvalidArgument unless `chunks` == `required`; `hint` names an alternative.
absl::Status RequireChunks(std::string_view schedule, int chunks, int required,
                           std::string_view hint);

// Interleaved schedules (interleaved-1f1b, interleaved-zb) walk the chunks in rounds
// of R = M / max(1, M / P) micro-batches, so M must split into equal rounds: a multiple
// of max(1, M / P). CheckInterleavedParams checks that, V >= 2 (`one_chunk` names the
// schedule to use for one chunk) and CheckParams' limits, and returns V (default 2).
absl::StatusOr<int> CheckInterleavedParams(std::string_view schedule, const GeneratorParams& params,
                                           std::string_view one_chunk);
// R, for M that CheckInterleavedParams accepted.
int RoundSize(int num_ranks, int num_microbatches);

// A schedule with P empty programs.
Schedule EmptySchedule(std::string_view name, PlacementKind kind, int num_ranks, int num_chunks,
                       int num_microbatches);

}  // namespace pipesched::scheduler::generators_internal
