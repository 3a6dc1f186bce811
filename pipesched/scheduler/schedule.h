// A Schedule: one ordered program of actions per rank, plus the placement of
// virtual stages on ranks and the shape (P ranks, V chunks per rank, M micro-batches).
// Schedules are plain data: generators make them, files load them, the validator
// checks them, the simulator and the executor run them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipesched/scheduler/action.h"

namespace pipesched::scheduler {

enum class PlacementKind {
  kLoop,      // virtual stage s on rank s mod P (Megatron / PyTorch interleaving)
  kV,         // chunk c on rank s mod P when c is even, P-1-(s mod P) when odd (ZB-V, DualPipeV)
  kExplicit,  // stage s on rank stage_ranks[s]: any other mapping (a PyTorch file's, a user's)
};

struct Placement {
  PlacementKind kind = PlacementKind::kLoop;
  int num_ranks = 1;   // P
  int num_chunks = 1;  // V: virtual stages per rank
  // kExplicit only: the rank of each virtual stage, P*V entries, each rank named V times
  // (CheckPlacement). Empty for loop and v.
  std::vector<int> stage_ranks;

  // P*V in int: only for a shape that has been checked (Validate(), a generator, a parsed
  // file), where it is at most 2^24; check an unvalidated schedule first.
  int num_stages() const { return num_ranks * num_chunks; }
  // Rank that holds virtual stage `stage` (in [0, P*V)); -1 for a stage out of range.
  int RankOf(int stage) const;
  // "loop", "v" or "explicit".
  std::string KindName() const;
  // KindName(), with the ranks for an explicit placement: "explicit(0,0,1,1)"; more than 32
  // stages end in ",...".
  std::string Describe() const;

  bool operator==(const Placement&) const = default;
};

// OK when every virtual stage has a rank: for kExplicit, stage_ranks has P*V entries in
// [0, P) and names each rank V times (every rank holds V chunks, as loop and v give);
// otherwise InvalidArgument naming the first entry that is off and what would do.
absl::Status CheckPlacement(const Placement& placement);

// `placement`, or loop or v placement when an explicit one puts every stage where that
// does (loop first), so that equal placements compare equal (operator==).
Placement CanonicalPlacement(Placement placement);

struct Schedule {
  std::string name;  // generator name or file name
  Placement placement;
  int num_microbatches = 0;                   // M
  std::vector<std::vector<Action>> programs;  // programs[rank], in issue order

  int num_ranks() const { return placement.num_ranks; }
  int num_chunks() const { return placement.num_chunks; }
  int num_stages() const { return placement.num_stages(); }
  std::size_t NumActions() const;
  // A hash of every rank's program, action by action (not the name, placement or M):
  // for processes that check they run one order (a searched or loaded schedule may
  // differ where its name does not).
  std::uint64_t OrderFingerprint() const;
  // True when any backward is split into I and W.
  bool SplitsBackward() const;
};

// The rank x step grid of the programs, one column per program position:
//   rank 0 | 0F0 0F1 0B0 ...
// When `mark_rank` >= 0 the action at (mark_rank, mark_step) is bracketed and an
// arrow line points at it. Wide programs are cut to the steps around the mark; more than
// 21 ranks are cut to the 10 on each side of the marked rank (the first 21 unmarked),
// with a "... N ranks not shown" line where rows are left out.
std::string RenderProgramGrid(const Schedule& schedule, int mark_rank = -1, int mark_step = -1);

}  // namespace pipesched::scheduler
