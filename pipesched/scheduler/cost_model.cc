// CostModel::Duration and the cost-model JSON parser. nlohmann/json stays private to
// this file: its exceptions are caught here and become InvalidArgument naming the key.
#include "pipesched/scheduler/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/json_util.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"

namespace pipesched::scheduler {

double CostModel::TransferInto(const Action& consumer, int boundary) const {
  if (!transfers.empty()) {
    auto it = transfers.find({consumer.stage, consumer.op, consumer.microbatch});
    if (it != transfers.end()) return it->second;
  }
  return Comm(boundary);
}

double CostModel::GapBefore(const Action& action) const {
  if (!gaps.empty()) {
    auto it = gaps.find({action.stage, action.op, action.microbatch});
    if (it != gaps.end()) return it->second;
  }
  return action_gap;
}

double CostModel::Duration(const Action& action) const {
  if (!actions.empty()) {
    auto it = actions.find({action.stage, action.op, action.microbatch});
    if (it != actions.end()) return it->second;
  }
  switch (action.op) {
    case Op::kF:
      return Stage(action.stage).f;
    case Op::kB:
      return Stage(action.stage).b;
    case Op::kI:
      return Stage(action.stage).i;
    case Op::kW:
      return Stage(action.stage).w;
    case Op::kAllReduce:
      return Stage(action.stage).allreduce;
    case Op::kSendF:  // stage -> stage+1
    case Op::kRecvB:
      return Comm(action.stage);
    case Op::kSendB:  // stage -> stage-1
    case Op::kRecvF:
      return Comm(action.stage - 1);
  }
  return 0;
}

namespace {

using nlohmann::json;

absl::Status KeyError(const std::string& key, const std::string& expected, const json& got) {
  return absl::InvalidArgumentError(
      absl::StrFormat("cost model: \"%s\" must be %s, got %s", key, expected, JsonForMessage(got)));
}

absl::StatusOr<double> NonNegativeNumber(const json& value, const std::string& key) {
  if (!value.is_number() || !(value.get<double>() >= 0) || value.get<double>() > kMaxCostTime) {
    return KeyError(key, absl::StrCat("a number in [0, ", kMaxCostTime, "]"), value);
  }
  return value.get<double>() + 0.0;  // -0 reads as 0
}

// Fills `costs` from a {"f": ..., "b": ..., ...} object; absent fields keep their value.
absl::Status ParseStageCosts(const json& object, const std::string& key, StageCosts& costs) {
  if (!object.is_object()) return KeyError(key, "an object like {\"f\": 1, \"b\": 2}", object);
  for (const auto& [field, value] : object.items()) {
    const std::string field_key = absl::StrCat(key, ".", field);
    if (field == "recompute") {
      if (!value.is_boolean()) return KeyError(field_key, "true or false", value);
      costs.recompute = value.get<bool>();
      continue;
    }
    std::int64_t* bytes = field == "activation_bytes"  ? &costs.activation_bytes
                          : field == "workspace_bytes" ? &costs.workspace_bytes
                          : field == "input_bytes"     ? &costs.input_bytes
                          : field == "static_bytes"    ? &costs.static_bytes
                          : field == "recompute_bytes" ? &costs.recompute_bytes
                                                       : nullptr;
    if (bytes != nullptr) {
      // An unsigned above INT64_MAX is neither below 0 nor within the bound as int64.
      if (!value.is_number_integer() ||
          (value.is_number_unsigned() && value.get<std::uint64_t>() > kMaxCostBytes) ||
          value.get<std::int64_t>() < 0 || value.get<std::int64_t>() > kMaxCostBytes) {
        return KeyError(field_key, absl::StrCat("an integer in [0, ", kMaxCostBytes, "] (2^50)"),
                        value);
      }
      *bytes = value.get<std::int64_t>();
      continue;
    }
    double* target = field == "f"           ? &costs.f
                     : field == "b"         ? &costs.b
                     : field == "i"         ? &costs.i
                     : field == "w"         ? &costs.w
                     : field == "allreduce" ? &costs.allreduce
                     : field == "zero_grad" ? &costs.zero_grad
                     : field == "optimizer" ? &costs.optimizer
                                            : nullptr;
    if (target == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cost model: unknown key %s (expected f, b, i, w, allreduce, zero_grad, optimizer, "
          "activation_bytes, workspace_bytes, input_bytes, static_bytes, recompute_bytes, "
          "recompute)",
          QuoteForMessage(field_key, 60)));
    }
    PS_ASSIGN_OR_RETURN(*target, NonNegativeNumber(value, field_key));
  }
  if (object.contains("recompute")) {
    if (!costs.recompute && costs.recompute_bytes > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cost model: %s has recompute_bytes %d but \"recompute\": false; rebuilt bytes come "
          "only with recomputation: give \"recompute\": true, or recompute_bytes 0",
          key, costs.recompute_bytes));
    }
  } else if (object.contains("recompute_bytes")) {
    // The entry's own byte count decides, not a flag inherited from the default: files
    // written before the key say recomputation by recompute_bytes > 0 alone.
    costs.recompute = costs.recompute_bytes > 0;
  }
  return absl::OkStatus();
}

bool IsTimeUnit(const std::string& unit) {
  return unit == "unit" || unit == "ns" || unit == "us" || unit == "ms" || unit == "s";
}

absl::StatusOr<CostModel> ParseRoot(const json& root) {
  if (!root.is_object()) return KeyError("(top level)", "an object", root);
  CostModel model;
  // "default" first: the per-stage entries start from it whatever the key order.
  if (auto it = root.find("default"); it != root.end()) {
    PS_RETURN_IF_ERROR(ParseStageCosts(*it, "default", model.uniform));
  }
  for (const auto& [key, value] : root.items()) {
    if (key == "default") continue;
    if (key == "version") {
      if (!value.is_number_integer() || value.get<long long>() != 1) {
        return KeyError("version", "1 (the only version this build reads)", value);
      }
    } else if (key == "stages") {
      // An empty list would read as "not given" (uniform costs) for any P.
      if (!value.is_array() || value.empty()) {
        return KeyError("stages", "a non-empty array of per-stage objects", value);
      }
      for (std::size_t s = 0; s < value.size(); ++s) {
        StageCosts stage = model.uniform;
        PS_RETURN_IF_ERROR(ParseStageCosts(value[s], absl::StrCat("stages[", s, "]"), stage));
        model.stages.push_back(stage);
      }
    } else if (key == "comm") {
      // An empty list would read as "not given" (comm 0) for any P, as "stages" would.
      if (value.is_array() && value.empty()) {
        return KeyError("comm",
                        "a number (every boundary's transfer time) or a non-empty array of "
                        "per-boundary times",
                        value);
      }
      if (value.is_array()) {
        for (std::size_t b = 0; b < value.size(); ++b) {
          PS_ASSIGN_OR_RETURN(double t, NonNegativeNumber(value[b], absl::StrCat("comm[", b, "]")));
          model.comm.push_back(t);
        }
      } else {
        PS_ASSIGN_OR_RETURN(model.comm_uniform, NonNegativeNumber(value, "comm"));
      }
    } else if (key == "action_gap") {
      PS_ASSIGN_OR_RETURN(model.action_gap, NonNegativeNumber(value, "action_gap"));
    } else if (key == "time_unit") {
      if (!value.is_string() || !IsTimeUnit(value.get<std::string>())) {
        return KeyError("time_unit", "one of \"unit\", \"ns\", \"us\", \"ms\", \"s\"", value);
      }
      model.time_unit = value.get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cost model: unknown key %s (expected version, default, stages, comm, action_gap, "
          "time_unit)",
          QuoteForMessage(key, 60)));
    }
  }
  return model;
}

}  // namespace

absl::Status CheckCostsFit(const CostModel& costs, int num_ranks, int num_chunks) {
  const std::int64_t stages = std::int64_t{num_ranks} * num_chunks;
  const std::string shape = absl::StrFormat("P=%d x V=%d", num_ranks, num_chunks);
  if (!costs.stages.empty() && static_cast<std::int64_t>(costs.stages.size()) != stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cost model: \"stages\" has %d %s but the schedule has %d virtual stages (%s); "
        "give one entry per virtual stage, or leave \"stages\" out for uniform costs",
        costs.stages.size(), costs.stages.size() == 1 ? "entry" : "entries", stages, shape));
  }
  if (!costs.comm.empty() && static_cast<std::int64_t>(costs.comm.size()) != stages - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cost model: \"comm\" has %d %s but the schedule has %d stage boundaries (%d "
        "virtual stages, %s); give one per boundary s -> s+1, or one number for all",
        costs.comm.size(), costs.comm.size() == 1 ? "entry" : "entries", stages - 1, stages,
        shape));
  }
  // Said before anything runs, as the file's fault.
  if (absl::Status input = CheckInputBytes(costs, stages); !input.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cost model: ", input.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckCostModel(const CostModel& costs) {
  if (!IsTimeUnit(costs.time_unit)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the costs' time unit is %s; give \"unit\", \"ns\", \"us\", \"ms\" or \"s\"",
        QuoteForMessage(costs.time_unit, 20)));
  }
  // A negative time overlaps two pieces of work on one lane (a bubble fraction above 1),
  // one above the bound makes makespans nothing can draw, a NaN would vanish in a max.
  auto time = [](const std::string& what, double t) -> absl::Status {
    if (t >= 0 && t <= kMaxCostTime) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is %g, not a valid time; give a number in [0, %g]", what, t, kMaxCostTime));
  };
  // A negative byte count lowers the simulated peak.
  auto bytes = [](const std::string& what, std::int64_t n) -> absl::Status {
    if (n >= 0 && n <= kMaxCostBytes) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is %d, not a valid byte count; give an integer in [0, %d] (2^50)", what,
                        n, kMaxCostBytes));
  };
  for (int s = -1; s < static_cast<int>(costs.stages.size()); ++s) {
    const StageCosts& c = s < 0 ? costs.uniform : costs.stages[s];
    const std::string stage = s < 0 ? "the default" : absl::StrCat("stage ", s, "'s");
    for (const auto& [name, t] :
         {std::pair{"f", c.f}, std::pair{"b", c.b}, std::pair{"i", c.i}, std::pair{"w", c.w},
          std::pair{"allreduce", c.allreduce}, std::pair{"zero_grad", c.zero_grad},
          std::pair{"optimizer", c.optimizer}}) {
      PS_RETURN_IF_ERROR(time(absl::StrCat(stage, " ", name), t));
    }
    for (const auto& [name, n] :
         {std::pair{"activation_bytes", c.activation_bytes},
          std::pair{"workspace_bytes", c.workspace_bytes}, std::pair{"input_bytes", c.input_bytes},
          std::pair{"static_bytes", c.static_bytes},
          std::pair{"recompute_bytes", c.recompute_bytes}}) {
      PS_RETURN_IF_ERROR(bytes(absl::StrCat(stage, " ", name), n));
    }
  }
  PS_RETURN_IF_ERROR(time("the transfer time comm_uniform", costs.comm_uniform));
  for (std::size_t k = 0; k < costs.comm.size(); ++k) {
    PS_RETURN_IF_ERROR(
        time(absl::StrCat("the transfer time comm[", k, "] (boundary ", k, " -> ", k + 1, ")"),
             costs.comm[k]));
  }
  PS_RETURN_IF_ERROR(time("the action gap", costs.action_gap));
  using Overrides = std::map<std::tuple<int, Op, int>, double>;
  for (const auto& [overrides, what] :
       {std::pair<const Overrides*, const char*>{&costs.actions, "the duration of"},
        std::pair<const Overrides*, const char*>{&costs.transfers, "the transfer time into"},
        std::pair<const Overrides*, const char*>{&costs.gaps, "the gap before"}}) {
    for (const auto& [key, t] : *overrides) {
      const auto& [stage, op, microbatch] = key;
      PS_RETURN_IF_ERROR(
          time(absl::StrCat(what, " ",
                            ToString(Action{.stage = stage, .microbatch = microbatch, .op = op})),
               t));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInputBytes(const CostModel& costs, std::int64_t num_stages) {
  for (std::int64_t s = 1; s < num_stages; ++s) {
    const StageCosts& c = costs.Stage(static_cast<int>(s));
    if (c.input_bytes > c.activation_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stage %d: input_bytes %d exceeds activation_bytes %d; the received input is part of "
          "a micro-batch's activations: give input_bytes <= activation_bytes",
          s, c.input_bytes, c.activation_bytes));
    }
  }
  return absl::OkStatus();
}

namespace {

// One stage's costs with recomputation (WithRecompute); `stage` names it in errors, which
// end with `advice` for costs that recompute already.
absl::Status RecomputeStage(StageCosts& c, const std::string& stage, std::string_view advice) {
  if (c.recomputes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s costs recompute already (%s, its B and I include the second forward); %s", stage,
        c.recompute_bytes > 0
            ? absl::StrFormat("recompute_bytes %d: measured with recomputation", c.recompute_bytes)
            : std::string("\"recompute\": true"),
        advice));
  }
  if (c.b + c.f > kMaxCostTime || c.i + c.f > kMaxCostTime) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s B or I with recomputation's second forward (B %g + F %g, I %g + F %g) passes the "
        "longest time a cost may take, %g; give shorter times",
        stage, c.b, c.f, c.i, c.f, kMaxCostTime));
  }
  // The received input stays (it is part of activation_bytes; CheckInputBytes).
  const std::int64_t kept = std::min(c.input_bytes, c.activation_bytes);
  c.recompute_bytes = c.activation_bytes - kept;
  c.activation_bytes = kept;
  c.recompute = true;
  c.b += c.f;
  c.i += c.f;
  return absl::OkStatus();
}

std::string StageName(int s) { return absl::StrCat("stage ", s, "'s"); }

absl::Status RefuseReplay(const CostModel& costs) {
  if (costs.actions.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "cannot add activation recomputation to a replayed step's per-action durations: they "
      "are what the run measured; give per-stage costs");
}

}  // namespace

absl::StatusOr<CostModel> WithRecompute(const CostModel& costs) {
  PS_RETURN_IF_ERROR(RefuseReplay(costs));
  CostModel out = costs;
  // The default is used only by stages beyond the list: left as it is when there is one
  // and it recomputes already.
  if (out.stages.empty() || !out.uniform.recomputes()) {
    PS_RETURN_IF_ERROR(RecomputeStage(out.uniform, "the default", "leave out --recompute"));
  }
  for (std::size_t s = 0; s < out.stages.size(); ++s) {
    PS_RETURN_IF_ERROR(
        RecomputeStage(out.stages[s], StageName(static_cast<int>(s)), "leave out --recompute"));
  }
  return out;
}

absl::StatusOr<CostModel> WithRecomputeOn(const CostModel& costs, const std::vector<int>& stages,
                                          int num_stages) {
  PS_RETURN_IF_ERROR(RefuseReplay(costs));
  if (!costs.stages.empty() && static_cast<int>(costs.stages.size()) != num_stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cost model: \"stages\" has %d entries, the schedule %d stages",
                        costs.stages.size(), num_stages));
  }
  CostModel out = costs;
  if (out.stages.empty()) out.stages.assign(num_stages, out.uniform);
  std::vector<bool> listed(num_stages, false);
  for (int s : stages) {
    if (s < 0 || s >= num_stages) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot recompute stage %d: the schedule has stages 0 to %d (P x V)", s, num_stages - 1));
    }
    if (listed[s]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stage %d is listed twice for recomputation", s));
    }
    listed[s] = true;
    PS_RETURN_IF_ERROR(
        RecomputeStage(out.stages[s], StageName(s),
                       absl::StrCat("leave stage ", s, " out of --recompute-stages")));
  }
  return out;
}

absl::StatusOr<CostModel> ParseCostModelJson(std::string_view text) {
  absl::StatusOr<json> root = ParseJson(text);
  if (!root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost model: not valid JSON: ", root.status().message()));
  }
  try {
    return ParseRoot(*root);
  } catch (const json::exception& e) {  // e.g. an integer too large for its field
    return absl::InvalidArgumentError(absl::StrCat("cost model: ", e.what()));
  }
}

}  // namespace pipesched::scheduler
