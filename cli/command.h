// The pipesched program's commands. Each command is one file defining a Run function
// and one line in the table in commands.cc. Commands return an exit code: 0 success,
// 2 bad input (one line on stderr naming the problem and what would work), 1 failure
// at run time.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace pipesched::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

struct CommandContext {
  std::vector<std::string> positional;  // arguments that are not --flags
  std::vector<std::string> flags_set;   // canonical names (underscores) of flags given
  std::ostream* out;
  std::ostream* err;
  bool out_is_terminal = false;
};

using CommandFn = int (*)(const CommandContext&);

struct Command {
  std::string_view name;
  std::string_view usage;    // "simulate --schedule=NAME --stages=P --microbatches=M [...]"
  std::string_view summary;  // one line
  std::vector<std::string_view> flags;  // flag names the command reads
  CommandFn run;
  // Everything from the first argument that is not a flag on is a command line of its
  // own (positional, not parsed, not searched for --help): `launch ... -- train ...`.
  bool runs_a_command = false;
};

const std::vector<Command>& AllCommands();

// Prints "pipesched: <message>" on one line (newlines in the status message are kept
// after the first line, e.g. a validator grid) and returns the exit code for `status`:
// kExitBadInput for InvalidArgument / NotFound / FailedPrecondition / OutOfRange /
// PermissionDenied, kExitFailure otherwise.
int ReportError(const CommandContext& ctx, const absl::Status& status);

// For a command that takes only --flags: when arguments that are not flags were given,
// reports "unexpected argument 'x'; <command> takes only --flags" and returns true. A
// command that takes no flags either (`takes_flags` false) says "takes no arguments".
bool RejectArguments(const CommandContext& ctx, std::string_view command, int& exit_code,
                     bool takes_flags = true);
// InvalidArgument "unexpected argument 'ARG'; WHAT_WORKS", or, for an argument with one
// dash ("-nogrid"), the same pointing at the two-dash flag.
absl::Status UnexpectedArgument(const std::string& arg, std::string_view what_works);

// "wrote PATH" (and " WHAT" when given) on its own line, for an output that is a file;
// nothing for one that is not a regular file (--json=/dev/stdout, a pipe), so that what
// was written there is all that reaches it.
void SayWrote(std::ostream& out, const std::string& path, std::string_view what = "");

// True when the user gave the flag (canonical name with underscores).
bool FlagGiven(const CommandContext& ctx, std::string_view name);

// Environment variables the pipesched program set for itself before RunMain (main.cc:
// OPENBLAS_NUM_THREADS, CUDA_DEVICE_MAX_CONNECTIONS), each with the value it had before
// (nullopt: unset), so that `launch` gives the programs it starts the environment it was
// started with.
void RecordOwnEnvironmentChange(std::string name, std::optional<std::string> original);
const std::vector<std::pair<std::string, std::optional<std::string>>>& OwnEnvironmentChanges();

// The main entry, separate from main() so tests can drive it in-process.
int RunMain(int argc, char** argv, std::ostream& out, std::ostream& err, bool out_is_terminal);

}  // namespace pipesched::cli
