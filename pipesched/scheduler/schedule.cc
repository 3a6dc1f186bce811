// Placement arithmetic, schedule queries and the rank x step grid that the validator
// and the CLI print. The grid is for people: columns line up, a marked cell is
// bracketed with an arrow under it, and wide programs are cut around the mark.
#include "pipesched/scheduler/schedule.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/hash.h"

namespace pipesched::scheduler {
namespace {

// Columns shown on each side of a marked step before a wide grid is cut with "...".
constexpr int kMarkContext = 10;
// Rows shown on each side of a marked rank before a tall grid is cut (a 100000-rank
// file made a 3 MB error message).
constexpr int kRowContext = 10;

}  // namespace

int Placement::RankOf(int stage) const {
  // P*V in int64: RankOf is also asked about shapes nothing has checked yet.
  if (num_ranks < 1 || stage < 0 || stage >= std::int64_t{num_ranks} * num_chunks) return -1;
  if (kind == PlacementKind::kExplicit) {
    return static_cast<std::size_t>(stage) < stage_ranks.size() ? stage_ranks[stage] : -1;
  }
  const int chunk = stage / num_ranks;
  const int offset = stage % num_ranks;
  if (kind == PlacementKind::kV && chunk % 2 == 1) return num_ranks - 1 - offset;
  return offset;
}

std::string Placement::KindName() const {
  switch (kind) {
    case PlacementKind::kLoop:
      return "loop";
    case PlacementKind::kV:
      return "v";
    case PlacementKind::kExplicit:
      return "explicit";
  }
  return "unknown";
}

std::string Placement::Describe() const {
  if (kind != PlacementKind::kExplicit) return KindName();
  constexpr std::size_t kShown = 32;
  std::string out = "explicit(";
  for (std::size_t s = 0; s < std::min(stage_ranks.size(), kShown); ++s) {
    absl::StrAppend(&out, s > 0 ? "," : "", stage_ranks[s]);
  }
  absl::StrAppend(&out, stage_ranks.size() > kShown ? ",...)" : ")");
  return out;
}

absl::Status CheckPlacement(const Placement& placement) {
  const int P = placement.num_ranks;
  const int V = placement.num_chunks;
  if (placement.kind != PlacementKind::kExplicit) {
    if (!placement.stage_ranks.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          placement.KindName(), " placement with ", placement.stage_ranks.size(),
          " explicit stage ranks; only an explicit placement lists them (leave them empty)"));
    }
    return absl::OkStatus();
  }
  const std::int64_t S = std::int64_t{P} * V;
  if (P < 1 || V < 1 || static_cast<std::int64_t>(placement.stage_ranks.size()) != S) {
    return absl::InvalidArgumentError(absl::StrCat(
        "explicit placement lists ", placement.stage_ranks.size(), " stage ranks for P x V = ", P,
        " x ", V, " = ", S, " stages; give one rank per virtual stage"));
  }
  std::vector<int> held(P, 0);
  for (std::size_t s = 0; s < placement.stage_ranks.size(); ++s) {
    const int r = placement.stage_ranks[s];
    if (r < 0 || r >= P) {
      return absl::InvalidArgumentError(absl::StrCat("explicit placement puts stage ", s,
                                                     " on rank ", r, "; ranks are 0..", P - 1));
    }
    if (++held[r] > V) {
      return absl::InvalidArgumentError(absl::StrCat("explicit placement puts stage ", s,
                                                     " on rank ", r, ", which holds V = ", V,
                                                     " stages already; every rank holds V stages"));
    }
  }
  // S entries, none on a rank more than V times: every rank holds exactly V.
  return absl::OkStatus();
}

Placement CanonicalPlacement(Placement placement) {
  if (placement.kind != PlacementKind::kExplicit || !CheckPlacement(placement).ok()) {
    return placement;
  }
  for (PlacementKind kind : {PlacementKind::kLoop, PlacementKind::kV}) {
    const Placement named{kind, placement.num_ranks, placement.num_chunks};
    bool same = true;
    for (int s = 0; same && s < placement.num_stages(); ++s) {
      same = named.RankOf(s) == placement.stage_ranks[s];
    }
    if (same) return named;
  }
  return placement;
}

std::size_t Schedule::NumActions() const {
  std::size_t n = 0;
  for (const auto& program : programs) n += program.size();
  return n;
}

std::uint64_t Schedule::OrderFingerprint() const {
  Fnv1a64 order;
  for (const std::vector<Action>& program : programs) {
    for (const Action& a : program) order.Add(ToString(a) + ";");
    order.Add("|");
  }
  return order.value();
}

bool Schedule::SplitsBackward() const {
  for (const auto& program : programs) {
    for (const Action& action : program) {
      if (action.op == Op::kI || action.op == Op::kW) return true;
    }
  }
  return false;
}

std::string RenderProgramGrid(const Schedule& schedule, int mark_rank, int mark_step) {
  const int num_rows = static_cast<int>(schedule.programs.size());
  // A mark past the end of its program points "after the last action": any step beyond
  // that draws the same, without an arrow line as long as the step number.
  if (mark_rank >= 0 && mark_rank < num_rows) {
    mark_step = std::min<std::int64_t>(
        mark_step, static_cast<std::int64_t>(schedule.programs[mark_rank].size()));
  }
  const bool marked = mark_rank >= 0 && mark_rank < num_rows && mark_step >= 0;

  // Visible rows [row_first, row_last): all, or those around the marked rank.
  int row_first = 0;
  int row_last = num_rows;
  if (num_rows > 2 * kRowContext + 1) {
    const int center = marked ? mark_rank : kRowContext;
    row_first = std::clamp(center - kRowContext, 0, num_rows - (2 * kRowContext + 1));
    row_last = row_first + 2 * kRowContext + 1;
  }

  int num_steps = 0;
  std::size_t width = 1;  // widest token
  std::vector<std::vector<std::string>> tokens(num_rows);
  for (int r = row_first; r < row_last; ++r) {
    for (const Action& action : schedule.programs[r]) {
      tokens[r].push_back(ToString(action));
      width = std::max(width, tokens[r].back().size());
    }
    num_steps = std::max(num_steps, static_cast<int>(tokens[r].size()));
  }

  // Visible step window [first, last); cut only around a mark.
  int first = 0;
  int last = num_steps;
  if (marked && num_steps > 2 * kMarkContext + 1) {
    first = std::max(0, mark_step - kMarkContext);
    last = std::min(num_steps, mark_step + kMarkContext + 1);
    if (mark_step >= num_steps) first = std::max(0, num_steps - 2 * kMarkContext);
  }
  const bool cut_left = first > 0;
  const bool cut_right = last < num_steps;

  // Cell k starts at column `prefix + k * stride + gap`; the gap before it holds '['
  // and the column after its token holds ']' when it is the marked cell.
  const std::size_t gap = marked ? 2 : 1;
  const std::size_t stride = width + gap;
  const std::string ellipsis = "...";
  std::size_t label_width = 0;
  for (int r = row_first; r < row_last; ++r) {
    label_width = std::max(label_width, absl::StrCat("rank ", r).size());
  }
  const std::size_t bar = label_width + 2;  // "rank 0 |"
  const std::size_t cells_start = bar + (cut_left ? 1 + ellipsis.size() : 0);

  auto column_of = [&](int step) { return cells_start + (step - first) * stride + gap; };

  std::string out;
  auto rows_not_shown = [&](int n, const char* where) {
    absl::StrAppend(&out, std::string(label_width, ' '), " | ... ", n,
                    n == 1 ? " rank " : " ranks ", where, " not shown\n");
  };
  if (row_first > 0) rows_not_shown(row_first, "above");
  for (int r = row_first; r < row_last; ++r) {
    std::string label = absl::StrCat("rank ", r);
    label.resize(label_width, ' ');
    std::string line = absl::StrCat(label, " |");
    if (cut_left) line += " " + ellipsis;
    const int row_steps = static_cast<int>(tokens[r].size());
    for (int k = first; k < std::min(last, row_steps); ++k) {
      const std::size_t col = column_of(k);
      const std::string& token = tokens[r][k];
      if (line.size() < col + token.size() + 1) line.resize(col + token.size() + 1, ' ');
      line.replace(col, token.size(), token);
      if (marked && r == mark_rank && k == mark_step) {
        line[col - 1] = '[';
        line[col + token.size()] = ']';
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (cut_right && row_steps > last) line += " " + ellipsis;
    out += line;
    out += '\n';
  }
  if (row_last < num_rows) rows_not_shown(num_rows - row_last, "below");

  if (marked) {
    const int row_steps = static_cast<int>(tokens[mark_rank].size());
    const std::size_t col = column_of(mark_step);
    const std::size_t len = mark_step < row_steps ? tokens[mark_rank][mark_step].size() : 1;
    std::string arrow(bar, ' ');
    arrow[bar - 1] = '|';
    arrow.resize(col, ' ');
    arrow += std::string(len, '^');
    absl::StrAppend(&arrow, " rank ", mark_rank, ", step ", mark_step);
    if (mark_step >= row_steps) absl::StrAppend(&arrow, " (after the last action)");
    out += arrow;
    out += '\n';
  }
  return out;
}

}  // namespace pipesched::scheduler
