// Abseil flags shared by the commands. Parsing is ours (ParseFlags below), so that a
// bad flag is one line and exit code 2 rather than Abseil's exit 1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"

ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(int32_t, stages);
ABSL_DECLARE_FLAG(int32_t, microbatches);
ABSL_DECLARE_FLAG(int32_t, virtual);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(double, cost_f);
ABSL_DECLARE_FLAG(double, cost_b);
ABSL_DECLARE_FLAG(double, cost_i);
ABSL_DECLARE_FLAG(double, cost_w);
ABSL_DECLARE_FLAG(double, cost_comm);
ABSL_DECLARE_FLAG(double, cost_action_gap);
ABSL_DECLARE_FLAG(double, cost_allreduce);
ABSL_DECLARE_FLAG(double, cost_zero_grad);
ABSL_DECLARE_FLAG(double, cost_optimizer);
ABSL_DECLARE_FLAG(int64_t, activation_bytes);
ABSL_DECLARE_FLAG(int64_t, workspace_bytes);
ABSL_DECLARE_FLAG(int64_t, input_bytes);
ABSL_DECLARE_FLAG(int64_t, static_bytes);
ABSL_DECLARE_FLAG(std::string, costs);
ABSL_DECLARE_FLAG(std::string, trace);
ABSL_DECLARE_FLAG(std::string, svg);
ABSL_DECLARE_FLAG(std::string, csv);
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(std::string, schedule_json);
ABSL_DECLARE_FLAG(bool, grid);
ABSL_DECLARE_FLAG(std::string, color);

namespace pipesched::cli {

struct ParsedArgs {
  std::string command;
  std::vector<std::string> positional;
  std::vector<std::string> flags_set;  // canonical names (underscores) of flags given
};

// argv[1] is the command; the rest are --name=value, --name value, --bool, --nobool,
// or positional arguments. Flag names accept '-' or '_' ("--cost-f" = "--cost_f").
// An entry "name=registered" of `allowed_for_command` reads --name into the flag
// `registered` (a command's own type for a shared name, e.g. bench's list --stages).
// InvalidArgument naming the flag for unknown flags, flags the command does not take,
// and values that do not parse.
// argv[0] is the program and argv[1] the command; parsing starts at argv[2].
// `command_follows` (launch): the first argument that is not a flag, and everything after
// it, are positional (a command line of its own), as is everything after "--".
absl::StatusOr<ParsedArgs> ParseFlags(int argc, char** argv,
                                      const std::vector<std::string_view>& allowed_for_command,
                                      bool command_follows = false);

// "12", "-3", "+40": an optional sign and digits only (whatever their size).
bool IsIntegerLiteral(std::string_view text);

}  // namespace pipesched::cli

ABSL_DECLARE_FLAG(int32_t, replicas);
ABSL_DECLARE_FLAG(int32_t, microbatch_size);
ABSL_DECLARE_FLAG(int32_t, layers);
ABSL_DECLARE_FLAG(int32_t, hidden);
ABSL_DECLARE_FLAG(int32_t, inputs);
ABSL_DECLARE_FLAG(int32_t, classes);
ABSL_DECLARE_FLAG(std::string, partition);
ABSL_DECLARE_FLAG(int32_t, steps);
ABSL_DECLARE_FLAG(int32_t, search_steps);
ABSL_DECLARE_FLAG(double, max_activations);
ABSL_DECLARE_FLAG(bool, refine);
ABSL_DECLARE_FLAG(bool, recompute);
ABSL_DECLARE_FLAG(std::string, recompute_stages);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(double, momentum);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(int32_t, devices);
ABSL_DECLARE_FLAG(std::string, device_memory);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, init);
ABSL_DECLARE_FLAG(std::string, save);
ABSL_DECLARE_FLAG(std::string, schedules);
ABSL_DECLARE_FLAG(std::string, bench_stages);
ABSL_DECLARE_FLAG(std::string, bench_microbatches);
ABSL_DECLARE_FLAG(int32_t, warmup);
ABSL_DECLARE_FLAG(std::string, md);
ABSL_DECLARE_FLAG(std::string, traces);
ABSL_DECLARE_FLAG(std::string, slow_stage);
