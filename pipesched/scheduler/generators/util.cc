// Parameter checks shared by the generators. The limits keep a typo such as
// --microbatches=1000000000 from allocating gigabytes: a clear error instead.
#include "pipesched/scheduler/generators/util.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"

namespace pipesched::scheduler::generators_internal {
namespace {

constexpr int kMaxRanks = kMaxGeneratorRanks;
constexpr int kMaxChunks = kMaxGeneratorChunks;
constexpr int kMaxMicrobatches = 1 << 20;
constexpr int64_t kMaxComputeActions = int64_t{1} << 24;

// Interleaved schedules' rounds: max(1, M / P) of them.
int NumRounds(int num_ranks, int num_microbatches) {
  return std::max(1, num_microbatches / num_ranks);
}

bool SplitsIntoRounds(int num_ranks, int num_microbatches) {
  return num_microbatches % NumRounds(num_ranks, num_microbatches) == 0;
}

}  // namespace

absl::StatusOr<int> CheckParams(std::string_view schedule, const GeneratorParams& params,
                                int default_chunks) {
  const std::string name(schedule);
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  if (p < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " needs at least one pipeline rank (got P=", p, "); use --stages=1 or more"));
  }
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " needs at least one micro-batch (got M=", m, "); use --microbatches=1 or more"));
  }
  if (params.num_chunks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " needs a non-negative number of chunks per rank (got V=", params.num_chunks,
        "); use --virtual=", default_chunks, " or 0 for the default"));
  }
  const int v = params.num_chunks == 0 ? default_chunks : params.num_chunks;
  if (p > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " supports at most ", kMaxRanks, " ranks (got P=", p, ")"));
  }
  if (v > kMaxChunks) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " supports at most ", kMaxChunks, " chunks per rank (got V=", v, ")"));
  }
  if (m > kMaxMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat(name, " supports at most ", kMaxMicrobatches,
                                                   " micro-batches (got M=", m, ")"));
  }
  // F plus B, or F plus I plus W: at most 3 per (stage, micro-batch).
  const int64_t actions = int64_t{3} * p * v * m;
  if (actions > kMaxComputeActions) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " would need up to ", actions, " actions for P=", p, ", V=", v, ", M=", m,
        "; the limit is ", kMaxComputeActions, ", so use fewer ranks, chunks or micro-batches"));
  }
  return v;
}

absl::Status RequireChunks(std::string_view schedule, int chunks, int required,
                           std::string_view hint) {
  if (chunks == required) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(Absl(schedule), " runs exactly ", required, required == 1 ? " chunk" : " chunks",
                   " per rank (got V=", chunks, "); use --virtual=", required, Absl(hint)));
}

int RoundSize(int num_ranks, int num_microbatches) {
  return num_microbatches / NumRounds(num_ranks, num_microbatches);
}

absl::StatusOr<int> CheckInterleavedParams(std::string_view schedule, const GeneratorParams& params,
                                           std::string_view one_chunk) {
  PS_ASSIGN_OR_RETURN(const int v, CheckParams(schedule, params, 2));
  if (v < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(schedule), " needs V >= 2 chunks per rank (got V=", v,
                     "); use --virtual=2 or more, or ", Absl(one_chunk), " for one chunk"));
  }
  const int p = params.num_ranks;
  const int m = params.num_microbatches;
  if (SplitsIntoRounds(p, m)) return v;
  int below = m - 1;
  while (below > 1 && !SplitsIntoRounds(p, below)) --below;
  int above = m + 1;
  while (!SplitsIntoRounds(p, above)) ++above;
  return absl::InvalidArgumentError(absl::StrCat(
      Absl(schedule),
      " needs M to be a multiple of its number of rounds max(1, M / P) = ", NumRounds(p, m),
      " (got M=", m, ", P=", p, "); use --microbatches=", below, " or --microbatches=", above));
}

Schedule EmptySchedule(std::string_view name, PlacementKind kind, int num_ranks, int num_chunks,
                       int num_microbatches) {
  Schedule schedule;
  schedule.name = std::string(name);
  schedule.placement.kind = kind;
  schedule.placement.num_ranks = num_ranks;
  schedule.placement.num_chunks = num_chunks;
  schedule.num_microbatches = num_microbatches;
  schedule.programs.resize(num_ranks);
  return schedule;
}

}  // namespace pipesched::scheduler::generators_internal
