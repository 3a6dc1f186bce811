// Schedule files: PyTorch's pipelining CSV and pipesched's versioned JSON. Parsing is
// strict about shape (every token an action, every key known) and leaves semantic
// checks (completeness, order, deadlock) to Validate(). nlohmann/json stays private to
// this file; its exceptions are caught here.
#include "pipesched/scheduler/formats.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/file_util.h"
#include "pipesched/base/json_util.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"

namespace pipesched::scheduler {
namespace {

// C0 controls, DEL, and C1 controls (U+0080..U+009F, UTF-8 C2 80..C2 9F): bytes that
// move a terminal's cursor or change its state.
bool IsControlAt(std::string_view text, std::size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  return c < 0x20 || c == 0x7f ||
         (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
          static_cast<unsigned char>(text[i + 1]) <= 0x9F);
}

bool HasControlCharacter(std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (IsControlAt(text, i)) return true;
  }
  return false;
}

using nlohmann::json;

constexpr std::string_view kFormatName = "pipesched-schedule";
constexpr int kFormatVersion = 1;
// The largest "stages", "virtual" or "microbatches" a file may give.
constexpr long long kMaxCount = 1 << 24;
// A file name's length at most (a CSV's schedule is named by its file's stem, and
// written back as a JSON "name" that must load again).
constexpr std::size_t kMaxNameBytes = 255;

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool AllBlank(std::string_view text) { return std::all_of(text.begin(), text.end(), IsBlank); }

std::string_view StripBom(std::string_view text) {
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  return text.substr(0, kBom.size()) == kBom ? text.substr(kBom.size()) : text;
}

// Where an action came from, for error messages.
struct Located {
  Action action;
  int line = 0;    // 1-based
  int column = 0;  // 1-based, first byte of the token
};

// The first action, if any, that `placement` puts on another rank than its row.
const Located* FirstMisplaced(const std::vector<std::vector<Located>>& rows,
                              const Placement& placement) {
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (const Located& a : rows[r]) {
      if (placement.RankOf(a.action.stage) != static_cast<int>(r)) return &a;
    }
  }
  return nullptr;
}

std::string Where(const Located& a) {
  return absl::StrCat("\"", ToString(a.action), "\" (line ", a.line, ", column ", a.column,
                      ", rank ", a.line - 1, ")");
}

// The placement a file gives where neither loop nor v does: each stage on the rank (row)
// its actions sit on. Every stage must have actions, all on one rank, and every rank
// must hold num_stages / P of them.
absl::StatusOr<Placement> InferExplicitPlacement(const std::vector<std::vector<Located>>& rows,
                                                 int num_stages) {
  const int num_ranks = static_cast<int>(rows.size());
  const std::string what = absl::StrCat("cannot infer the placement of ", num_stages, " stages on ",
                                        num_ranks, " ranks: ");
  // Tables sized by the stage count, which a 14-byte file can make 10^8: first the
  // stages that do have actions (bounded by the file), and the first that has none.
  std::vector<int> present;
  for (const std::vector<Located>& row : rows) {
    for (const Located& a : row) present.push_back(a.action.stage);
  }
  std::sort(present.begin(), present.end());
  present.erase(std::unique(present.begin(), present.end()), present.end());
  if (static_cast<int>(present.size()) < num_stages) {
    int missing = 0;
    while (missing < static_cast<int>(present.size()) && present[missing] == missing) ++missing;
    return absl::InvalidArgumentError(absl::StrCat(
        what, "stage ", missing, " has no actions, so no rank is known to hold it (stages 0..",
        num_stages - 1, " each need their actions on one rank)"));
  }
  std::vector<const Located*> first(num_stages, nullptr);
  std::vector<int> stage_ranks(num_stages, -1);
  for (int r = 0; r < num_ranks; ++r) {
    for (const Located& a : rows[r]) {
      const int s = a.action.stage;
      if (stage_ranks[s] < 0) {
        stage_ranks[s] = r;
        first[s] = &a;
      } else if (stage_ranks[s] != r) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, "stage ", s, " has actions on two ranks, ", Where(*first[s]), " and ", Where(a),
            "; row r holds rank r's actions, and each stage's actions must all sit "
            "on the one rank that holds the stage"));
      }
    }
  }
  std::vector<std::vector<int>> held(num_ranks);
  for (int s = 0; s < num_stages; ++s) held[stage_ranks[s]].push_back(s);
  const int per_rank = num_stages / num_ranks;
  for (int r = 0; r < num_ranks; ++r) {
    if (static_cast<int>(held[r].size()) != per_rank) {
      constexpr std::size_t kNamed = 8;
      std::vector<int> named(held[r].begin(), held[r].begin() + std::min(held[r].size(), kNamed));
      return absl::InvalidArgumentError(absl::StrCat(
          what, "rank ", r, " (line ", r + 1, ") holds ", held[r].size(), " stages (",
          held[r].empty() ? "none" : absl::StrJoin(named, ", "),
          held[r].size() > kNamed ? ", ..." : "", ") where every rank must hold ", num_stages,
          " / ", num_ranks, " = ", per_rank, "; move stages so that each rank holds as many"));
    }
  }
  return Placement{PlacementKind::kExplicit, num_ranks, per_rank, std::move(stage_ranks)};
}

// "<stage>UNSHARD" or "<stage>RESHARD", PyTorch's FSDP actions, which take no micro-batch.
bool IsFsdpMarker(std::string_view cell) {
  std::size_t digits = 0;
  while (digits < cell.size() && cell[digits] >= '0' && cell[digits] <= '9') ++digits;
  const std::string_view op = cell.substr(digits);
  return digits > 0 && (op == "UNSHARD" || op == "RESHARD");
}

// One CSV cell's actions, starting at 1-based `column`: a single action ("2F0"), or
// PyTorch's overlapped pair "(0F3;5B1)OVERLAP_F_B" (ScheduleDualPipeV writes a forward and
// a full backward that it issues together), read as its sub-actions in order; nothing
// for an FSDP marker. The error names the sub-action's own column.
absl::Status ParseCell(std::string_view cell, int line, int column, std::vector<Located>* row) {
  auto located_error = [&](int at, const auto& message) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ", column ", at, ": ", std::string(message)));
  };
  std::size_t end = cell.size();
  while (end > 0 && IsBlank(cell[end - 1])) --end;
  cell = cell.substr(0, end);
  // A quoted cell ("0F0"), as a CSV writer that quotes every field writes it: PyTorch's
  // loader (Python's csv module) reads it as the text inside.
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') {
    cell = cell.substr(1, cell.size() - 2);
    ++column;
  } else if (!cell.empty() && (cell.front() == '"' || cell.back() == '"')) {
    // Half a quoted cell: the line was cut at a comma inside quotes ("0F0,0B0"), which
    // this reader does not keep together (a cell holds one action).
    return located_error(column, absl::StrCat("bad action ", QuoteForMessage(cell),
                                              ": a quote is not closed within its cell; a "
                                              "comma inside quotes is not read, so write one "
                                              "action per cell (0F0,0B0)"));
  }
  // FSDP's markers (parameter all-gather and release): PyTorch's compute_comms dump
  // writes them for every schedule with several stages per rank, FSDP or not. pipesched
  // does not shard parameters, so they carry no work here and are skipped.
  if (IsFsdpMarker(cell)) return absl::OkStatus();
  if (cell.empty() || cell.front() != '(') {
    absl::StatusOr<Action> action = ParseAction(cell);
    if (!action.ok()) return located_error(column, action.status().message());
    row->push_back({*action, line, column});
    return absl::OkStatus();
  }
  constexpr std::string_view kOverlap = "OVERLAP_F_B";
  const std::size_t close = cell.find(')');
  if (close == std::string_view::npos || cell.substr(close + 1) != kOverlap) {
    return located_error(
        column, absl::StrCat("bad action ", QuoteForMessage(cell),
                             ": a cell that starts with '(' must be PyTorch's overlapped pair "
                             "such as \"(0F3;5B1)OVERLAP_F_B\""));
  }
  const std::string_view inner = cell.substr(1, close - 1);
  const std::size_t first = row->size();
  for (std::size_t begin = 0; begin <= inner.size();) {
    std::size_t stop = inner.find(';', begin);
    if (stop == std::string_view::npos) stop = inner.size();
    const std::string_view token = inner.substr(begin, stop - begin);
    std::size_t lead = 0;
    while (lead < token.size() && IsBlank(token[lead])) ++lead;
    const int at = column + 1 + static_cast<int>(begin + lead);
    absl::StatusOr<Action> action = ParseAction(token);
    if (!action.ok()) return located_error(at, action.status().message());
    if (!IsCompute(action->op)) {
      return located_error(at,
                           absl::StrCat("\"", ToString(*action), "\" in ", QuoteForMessage(cell),
                                        ": an overlapped pair holds compute actions (F, B, "
                                        "I, W) only"));
    }
    row->push_back({*action, line, at});
    begin = stop + 1;
  }
  if (row->size() - first < 2) {
    return located_error(column, absl::StrCat(QuoteForMessage(cell),
                                              " overlaps fewer than two actions; write the "
                                              "action alone, or pair a forward with a backward "
                                              "such as \"(0F3;5B1)OVERLAP_F_B\""));
  }
  // What PyTorch writes (and the name says): one forward with one backward.
  const std::size_t forwards =
      std::count_if(row->begin() + static_cast<std::ptrdiff_t>(first), row->end(),
                    [](const Located& l) { return l.action.op == Op::kF; });
  if (row->size() - first > 2 || forwards != 1) {
    std::vector<std::string> names;
    for (std::size_t k = first; k < row->size(); ++k) names.push_back(ToString((*row)[k].action));
    return located_error(
        column,
        absl::StrCat(QuoteForMessage(cell), " overlaps ", absl::StrJoin(names, " with "),
                     "; an overlapped pair is one forward (F) with one backward (B, I or W), such "
                     "as \"(0F3;5B1)OVERLAP_F_B\": write the others as cells of their own"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Schedule> ParsePytorchCsv(std::string_view input) {
  const std::string_view text = StripBom(input);
  if (AllBlank(text)) {
    return absl::InvalidArgumentError(
        "the CSV schedule is empty; expected one row of actions per rank, like "
        "\"0F0,0F1,0B0,0B1\"");
  }

  // Lines: '\n' or "\r\n" terminated; trailing blank lines are dropped.
  std::vector<std::string_view> lines;
  for (std::size_t begin = 0; begin <= text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    begin = end + 1;
  }
  while (!lines.empty() && AllBlank(lines.back())) lines.pop_back();

  std::vector<std::vector<Located>> rows;
  int max_stage = -1;
  int max_microbatch = -1;
  for (std::size_t l = 0; l < lines.size(); ++l) {
    const std::string_view line = lines[l];
    const int line_number = static_cast<int>(l) + 1;
    std::vector<Located>& row = rows.emplace_back();
    for (std::size_t begin = 0; begin <= line.size();) {
      std::size_t end = line.find(',', begin);
      if (end == std::string_view::npos) end = line.size();
      std::string_view cell = line.substr(begin, end - begin);
      std::size_t lead = 0;
      while (lead < cell.size() && IsBlank(cell[lead])) ++lead;
      if (lead < cell.size()) {  // empty cells are idle steps
        const int column = static_cast<int>(begin + lead) + 1;
        const std::size_t first = row.size();
        PS_RETURN_IF_ERROR(ParseCell(cell.substr(lead), line_number, column, &row));
        for (std::size_t k = first; k < row.size(); ++k) {
          max_stage = std::max(max_stage, row[k].action.stage);
          max_microbatch = std::max(max_microbatch, row[k].action.microbatch);
        }
      }
      begin = end + 1;
    }
    if (row.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, " (rank ", l,
                       ") has no actions; every rank needs a row of "
                       "actions (drop blank lines, or give the rank its stages' work)"));
    }
  }

  const int num_ranks = static_cast<int>(rows.size());
  const int num_stages = max_stage + 1;
  if (num_stages % num_ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "found stages 0..", max_stage, " (", num_stages, " stages) on ", num_ranks,
        " ranks (rows); the number of stages must be a multiple of the number of ranks"));
  }
  if (max_microbatch < 0) {
    return absl::InvalidArgumentError(
        "no action names a micro-batch; cannot infer the number of micro-batches");
  }

  Schedule schedule;
  schedule.num_microbatches = max_microbatch + 1;
  Placement loop{PlacementKind::kLoop, num_ranks, num_stages / num_ranks};
  Placement v{PlacementKind::kV, num_ranks, num_stages / num_ranks};
  if (FirstMisplaced(rows, loop) == nullptr) {
    schedule.placement = loop;
  } else if (FirstMisplaced(rows, v) == nullptr) {
    schedule.placement = v;
  } else {
    PS_ASSIGN_OR_RETURN(schedule.placement, InferExplicitPlacement(rows, num_stages));
  }
  schedule.programs.resize(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    schedule.programs[r].reserve(rows[r].size());
    for (const Located& a : rows[r]) schedule.programs[r].push_back(a.action);
  }
  return schedule;
}

std::string ToPytorchCsv(const Schedule& schedule) {
  std::string out;
  for (const std::vector<Action>& program : schedule.programs) {
    for (std::size_t i = 0; i < program.size(); ++i) {
      if (i > 0) out.push_back(',');
      // PyTorch's name for it: its _Action.from_str knows no ALLREDUCE.
      out += program[i].op == Op::kAllReduce ? absl::StrCat(program[i].stage, "REDUCE_GRAD")
                                             : ToString(program[i]);
    }
    out.push_back('\n');
  }
  return out;
}

namespace {

// Fields that older builds do not know are written only by models that use them (on
// every entry then, since absent fields of a stage take the default's), so that those
// builds read the rest: input_bytes, static_bytes, recompute_bytes, the per-step
// zero_grad and optimizer, and "recompute" (only where a stage recomputes with nothing
// rebuilt: recompute_bytes > 0 says it otherwise).
struct OptionalFields {
  bool input = false;
  bool step = false;
  bool static_state = false;
  bool recompute = false;
  bool recompute_flag = false;
};

json StageCostsJson(const StageCosts& c, OptionalFields with) {
  json out{{"f", c.f},
           {"b", c.b},
           {"i", c.i},
           {"w", c.w},
           {"allreduce", c.allreduce},
           {"activation_bytes", c.activation_bytes},
           {"workspace_bytes", c.workspace_bytes}};
  if (with.input) out["input_bytes"] = c.input_bytes;
  if (with.static_state) out["static_bytes"] = c.static_bytes;
  if (with.recompute) out["recompute_bytes"] = c.recompute_bytes;
  if (with.recompute_flag) out["recompute"] = c.recomputes();
  if (with.step) {
    out["zero_grad"] = c.zero_grad;
    out["optimizer"] = c.optimizer;
  }
  return out;
}

// The cost-model JSON that ParseCostModelJson reads back to the same CostModel.
json CostModelJson(const CostModel& costs) {
  OptionalFields with;
  auto note = [&with](const StageCosts& s) {
    with.input |= s.input_bytes != 0;
    with.static_state |= s.static_bytes != 0;
    with.recompute |= s.recompute_bytes != 0;
    with.recompute_flag |= s.recompute && s.recompute_bytes == 0;
    with.step |= s.zero_grad != 0 || s.optimizer != 0;
  };
  note(costs.uniform);
  for (const StageCosts& s : costs.stages) note(s);
  json out = {{"version", 1}, {"default", StageCostsJson(costs.uniform, with)}};
  if (!costs.stages.empty()) {
    json stages = json::array();
    for (const StageCosts& s : costs.stages) stages.push_back(StageCostsJson(s, with));
    out["stages"] = std::move(stages);
  }
  if (!costs.comm.empty()) {
    out["comm"] = costs.comm;
  } else {
    out["comm"] = costs.comm_uniform;
  }
  // Only when set, so that builds predating it read the rest.
  if (costs.action_gap != 0) out["action_gap"] = costs.action_gap;
  if (costs.time_unit != "unit") out["time_unit"] = costs.time_unit;
  return out;
}

absl::Status JsonError(std::string_view key, std::string_view expected, const json& got) {
  return absl::InvalidArgumentError(absl::StrCat("schedule JSON: key \"", Absl(key), "\" must be ",
                                                 Absl(expected), ", got ", JsonForMessage(got)));
}

absl::StatusOr<int> PositiveInt(const json& root, const char* key) {
  if (!root.contains(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule JSON: missing key \"", key, "\" (a positive integer)"));
  }
  const json& value = root.at(key);
  if (!value.is_number_integer() || value.get<long long>() < 1 ||
      value.get<long long>() > kMaxCount) {
    return JsonError(key, absl::StrCat("an integer in [1, ", kMaxCount, "]"), value);
  }
  return static_cast<int>(value.get<long long>());
}

absl::StatusOr<ScheduleFile> ParseScheduleJsonOrThrow(std::string_view text) {
  absl::StatusOr<json> parsed = ParseJson(text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule JSON is malformed: ", parsed.status().message()));
  }
  const json& root = *parsed;
  if (!root.is_object()) return JsonError("(top level)", "an object {...}", root);
  static constexpr const char* kKeys[] = {"format",    "version",  "name",
                                          "stages",    "virtual",  "microbatches",
                                          "placement", "programs", "costs"};
  for (const auto& item : root.items()) {
    // A named reference, not a structured binding: clang 14 cannot capture one in a lambda.
    const std::string& key = item.key();
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) ==
        std::end(kKeys)) {
      return absl::InvalidArgumentError(absl::StrCat("schedule JSON: unknown key ",
                                                     QuoteForMessage(key, 60), " (expected ",
                                                     absl::StrJoin(kKeys, ", "), ")"));
    }
  }
  if (!root.contains("format") || root["format"] != kFormatName) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule JSON: key \"format\" must be \"", Absl(kFormatName), "\", got ",
        root.contains("format") ? JsonForMessage(root["format"]) : "nothing",
        root.contains("default") || root.contains("comm") ? " (is this a cost-model file?)" : ""));
  }
  if (!root.contains("version") || !root["version"].is_number_integer() ||
      root["version"].get<long long>() != kFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule JSON: unsupported \"version\" ",
                     root.contains("version") ? JsonForMessage(root["version"]) : "(missing)",
                     "; this build reads version ", kFormatVersion));
  }

  ScheduleFile file;
  Schedule& schedule = file.schedule;
  if (root.contains("name")) {
    const json& name = root["name"];
    // The name is echoed in every message and header: one short line.
    if (!name.is_string() || name.get_ref<const std::string&>().size() > kMaxNameBytes ||
        HasControlCharacter(name.get_ref<const std::string&>())) {
      return JsonError(
          "name",
          absl::StrCat("a string of at most ", kMaxNameBytes, " bytes without control characters"),
          name);
    }
    schedule.name = name.get<std::string>();
  }
  PS_ASSIGN_OR_RETURN(schedule.placement.num_ranks, PositiveInt(root, "stages"));
  schedule.placement.num_chunks = 1;
  if (root.contains("virtual")) {
    PS_ASSIGN_OR_RETURN(schedule.placement.num_chunks, PositiveInt(root, "virtual"));
  }
  // Each within its bound, the product need not be: 256 x 2^24 stages would overflow int.
  if (const long long stages =
          static_cast<long long>(schedule.placement.num_ranks) * schedule.placement.num_chunks;
      stages > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule JSON: \"stages\" x \"virtual\" = ", schedule.placement.num_ranks, " x ",
        schedule.placement.num_chunks, " = ", stages, " virtual stages, more than the ", kMaxCount,
        " a file may give; give fewer ranks or chunks per rank"));
  }
  PS_ASSIGN_OR_RETURN(schedule.num_microbatches, PositiveInt(root, "microbatches"));
  if (root.contains("placement")) {
    const json& p = root["placement"];
    if (p == "loop") {
      schedule.placement.kind = PlacementKind::kLoop;
    } else if (p == "v") {
      schedule.placement.kind = PlacementKind::kV;
    } else if (p.is_array()) {
      schedule.placement.kind = PlacementKind::kExplicit;
      schedule.placement.stage_ranks.reserve(p.size());
      for (std::size_t s = 0; s < p.size(); ++s) {
        if (!p[s].is_number_integer() || p[s].get<long long>() < 0 ||
            p[s].get<long long>() >= schedule.placement.num_ranks) {
          return JsonError(
              absl::StrCat("placement[", s, "]"),
              absl::StrCat("an integer rank in [0, ", schedule.placement.num_ranks - 1, "]"), p[s]);
        }
        schedule.placement.stage_ranks.push_back(p[s].get<int>());
      }
      if (absl::Status placed = CheckPlacement(schedule.placement); !placed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule JSON: \"placement\": ", placed.message()));
      }
      // A list that is loop or v placement is that placement, as a CSV file's would be.
      schedule.placement = CanonicalPlacement(std::move(schedule.placement));
    } else {
      return JsonError(
          "placement",
          "\"loop\", \"v\" or an array of each virtual stage's rank, like [0, 1, 1, 0]", p);
    }
  }

  if (!root.contains("programs")) {
    return absl::InvalidArgumentError(
        "schedule JSON: missing key \"programs\" (one array of actions per rank, like "
        "[[\"0F0\", \"0B0\"], [\"1F0\", \"1B0\"]])");
  }
  const json& programs = root["programs"];
  if (!programs.is_array()) return JsonError("programs", "an array of arrays", programs);
  if (static_cast<int>(programs.size()) != schedule.num_ranks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule JSON: \"programs\" has ", programs.size(), " rows but \"stages\" is ",
        schedule.num_ranks(), "; give one array of actions per rank"));
  }
  schedule.programs.resize(programs.size());
  for (std::size_t r = 0; r < programs.size(); ++r) {
    const std::string key = absl::StrCat("programs[", r, "]");
    if (!programs[r].is_array()) return JsonError(key, "an array of action strings", programs[r]);
    for (std::size_t i = 0; i < programs[r].size(); ++i) {
      const json& token = programs[r][i];
      const std::string item = absl::StrCat(key, "[", i, "]");
      if (!token.is_string()) return JsonError(item, "an action string like \"0F0\"", token);
      absl::StatusOr<Action> action = ParseAction(token.get<std::string>());
      if (!action.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule JSON: key \"", item, "\": ", action.status().message()));
      }
      schedule.programs[r].push_back(*action);
    }
  }

  if (root.contains("costs")) {
    absl::StatusOr<CostModel> costs = ParseCostModelJson(root["costs"].dump());
    if (!costs.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule JSON: key \"costs\": ", costs.status().message()));
    }
    file.costs = *std::move(costs);
  }
  return file;
}

// "a.b/c.csv" -> "c": the schedule's name when the file gives none. Control characters
// (a file name may hold any byte but '/') become '?', as a JSON "name" may have none: the
// name is printed in headers and written into pictures and JSON.
std::string Stem(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  const std::size_t dot = base.find_last_of('.');
  if (dot != std::string::npos && dot > 0) base.resize(dot);
  std::string out;
  for (std::size_t i = 0; i < base.size(); ++i) {
    if (!IsControlAt(base, i)) {
      out.push_back(base[i]);
      continue;
    }
    out.push_back('?');
    if (static_cast<unsigned char>(base[i]) == 0xC2) ++i;  // a C1 control's second byte
  }
  return out;
}

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<ScheduleFile> ParseScheduleJson(std::string_view text) {
  try {
    return ParseScheduleJsonOrThrow(text);
  } catch (const json::exception& e) {
    // Only reachable through a type mismatch the checks above missed.
    return absl::InvalidArgumentError(absl::StrCat("schedule JSON: ", e.what()));
  }
}

std::string ToCostModelJson(const CostModel& costs) {
  return CostModelJson(costs).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string ToScheduleJson(const Schedule& schedule, const CostModel* costs) {
  // Hand-laid-out so that each rank's program is one line; values go through nlohmann
  // for escaping.
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": \"", Absl(kFormatName), "\",\n");
  absl::StrAppend(&out, "  \"version\": ", kFormatVersion, ",\n");
  absl::StrAppend(&out, "  \"name\": ",
                  json(schedule.name).dump(-1, ' ', false, json::error_handler_t::replace), ",\n");
  absl::StrAppend(&out, "  \"stages\": ", schedule.num_ranks(), ",\n");
  absl::StrAppend(&out, "  \"virtual\": ", schedule.num_chunks(), ",\n");
  absl::StrAppend(&out, "  \"microbatches\": ", schedule.num_microbatches, ",\n");
  if (schedule.placement.kind == PlacementKind::kExplicit) {
    absl::StrAppend(&out, "  \"placement\": [", absl::StrJoin(schedule.placement.stage_ranks, ", "),
                    "],\n");
  } else {
    absl::StrAppend(&out, "  \"placement\": \"", schedule.placement.KindName(), "\",\n");
  }
  absl::StrAppend(&out, "  \"programs\": [");
  for (std::size_t r = 0; r < schedule.programs.size(); ++r) {
    absl::StrAppend(&out, r == 0 ? "\n    [" : ",\n    [");
    const std::vector<Action>& program = schedule.programs[r];
    for (std::size_t i = 0; i < program.size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "\"" : ", \"", ToString(program[i]), "\"");
    }
    absl::StrAppend(&out, "]");
  }
  absl::StrAppend(&out, schedule.programs.empty() ? "]" : "\n  ]");
  if (costs != nullptr) {
    std::string costs_text =
        CostModelJson(*costs).dump(2, ' ', false, json::error_handler_t::replace);
    // Indent the nested object by two spaces.
    std::string indented;
    for (char c : costs_text) {
      indented.push_back(c);
      if (c == '\n') indented += "  ";
    }
    absl::StrAppend(&out, ",\n  \"costs\": ", indented);
  }
  absl::StrAppend(&out, "\n}\n");
  return out;
}

absl::StatusOr<ScheduleFile> LoadScheduleFile(const std::string& path) {
  PS_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  const std::string_view body = StripBom(text);
  const std::size_t first = body.find_first_not_of(" \t\r\n");
  absl::StatusOr<ScheduleFile> file;
  const bool json_name = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (first != std::string_view::npos && body[first] == '{') {
    file = ParseScheduleJson(body);
  } else if (first == std::string_view::npos && json_name) {
    file = absl::InvalidArgumentError(
        "the file is empty; a pipesched JSON schedule is an object {\"format\": "
        "\"pipesched-schedule\", \"version\": 1, ...} (docs/schedules.md)");
  } else if (first != std::string_view::npos && body[first] == '[') {
    file = absl::InvalidArgumentError(
        "the file starts with '[', but a pipesched JSON schedule is an object {\"format\": "
        "\"pipesched-schedule\", ...} and a PyTorch CSV has one row of actions per rank");
  } else {
    absl::StatusOr<Schedule> schedule = ParsePytorchCsv(body);
    if (schedule.ok()) {
      file = ScheduleFile{*std::move(schedule), std::nullopt};
    } else {
      file = schedule.status();
    }
  }
  if (!file.ok()) return WithPath(path, file.status());
  if (file->schedule.name.empty()) file->schedule.name = Stem(path);
  return file;
}

}  // namespace pipesched::scheduler
