#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "pipesched/base/strings.h"

namespace pipesched::cli {

void SayWrote(std::ostream& out, const std::string& path, std::string_view what) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return;
  out << "wrote " << path << (what.empty() ? "" : " ") << what << "\n";
}

namespace {

// The first line of `message` with its middle cut when it is longer than a terminal
// screen's worth (a value echoed from a 100 kB argument), at UTF-8 character boundaries;
// the lines after it (a validator's grid) as they are.
std::string CapFirstLine(std::string_view message) {
  constexpr std::size_t kMax = 1000, kHead = 700, kTail = 200;
  const std::size_t eol = std::min(message.find('\n'), message.size());
  if (eol <= kMax) return std::string(message);
  auto boundary = [&](std::size_t i) {  // back to the start of the character at i
    for (int k = 0; k < 3 && i > 0 && (static_cast<unsigned char>(message[i]) & 0xC0) == 0x80;
         ++k) {
      --i;  // at most 3: a UTF-8 character has up to 3 continuation bytes
    }
    return i;
  };
  const std::size_t head = boundary(kHead), tail = boundary(eol - kTail);
  return absl::StrCat(Absl(message.substr(0, head)), " [... ", tail - head, " bytes cut ...] ",
                      Absl(message.substr(tail)));
}

}  // namespace

namespace {
std::vector<std::pair<std::string, std::optional<std::string>>>& EnvironmentChanges() {
  static auto* changes = new std::vector<std::pair<std::string, std::optional<std::string>>>;
  return *changes;
}
}  // namespace

void RecordOwnEnvironmentChange(std::string name, std::optional<std::string> original) {
  EnvironmentChanges().emplace_back(std::move(name), std::move(original));
}

const std::vector<std::pair<std::string, std::optional<std::string>>>& OwnEnvironmentChanges() {
  return EnvironmentChanges();
}

int ReportError(const CommandContext& ctx, const absl::Status& status) {
  // One write: processes whose errors meet in one stream (mpirun's) do not cut each
  // other's lines.
  *ctx.err << absl::StrCat("pipesched: ", CapFirstLine(Std(status.message())), "\n") << std::flush;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

bool RejectArguments(const CommandContext& ctx, std::string_view command, int& exit_code,
                     bool takes_flags) {
  if (ctx.positional.empty()) return false;
  exit_code = ReportError(
      ctx, UnexpectedArgument(ctx.positional[0],
                              absl::StrCat(Absl(command), takes_flags ? " takes only --flags"
                                                                      : " takes no arguments")));
  return true;
}

absl::Status UnexpectedArgument(const std::string& arg, std::string_view what_works) {
  // "-nogrid": one dash short of a flag.
  if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-') {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", arg, "'; flags start with two dashes: -", arg));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected argument '", arg, "'; ", Absl(what_works)));
}

bool FlagGiven(const CommandContext& ctx, std::string_view name) {
  for (const std::string& f : ctx.flags_set) {
    if (f == name) return true;
  }
  return false;
}

namespace {

void PrintUsage(std::ostream& os) {
  os << "pipesched: pipeline-parallel schedules, simulation, training and bubble benchmarks\n\n"
        "usage: pipesched <command> [--flags]\n\ncommands:\n";
  for (const Command& c : AllCommands()) os << "  " << c.name << "\t" << c.summary << "\n";
  os << "\n'pipesched help <command>' shows a command's flags.\n";
}

void PrintCommandHelp(const Command& c, std::ostream& os) {
  os << "usage: pipesched " << c.usage << "\n\n" << c.summary << "\n";
}

}  // namespace

int RunMain(int argc, char** argv, std::ostream& out, std::ostream& err, bool out_is_terminal) {
  if (argc < 2) {
    PrintUsage(err);
    return kExitBadInput;
  }
  // A control byte in a flag or a path would break the one-line errors that echo it (and
  // reach the terminal raw): refused before anything reads it. Not in the arguments of a
  // program of the user's that `launch` starts (a multi-line `sh -c` script is theirs to
  // give): from its program on -- after launch's first "--", or its first argument that
  // is not a flag -- unless that program is `train`, whose flags are pipesched's.
  int checked = argc;
  if (std::string_view(argv[1]) == "launch") {
    for (int i = 2; i < argc; ++i) {
      const std::string_view arg = argv[i];
      const int program = arg == "--" ? i + 1 : (arg.empty() || arg[0] != '-') ? i : -1;
      if (program < 0) continue;
      if (program < argc && std::string_view(argv[program]) != "train") checked = program;
      break;
    }
  }
  for (int i = 1; i < checked; ++i) {
    const std::string_view arg = argv[i];
    if (const std::size_t at = FindControlByte(arg); at != std::string_view::npos) {
      CommandContext ctx{.out = &out, .err = &err, .out_is_terminal = out_is_terminal};
      return ReportError(
          ctx, absl::InvalidArgumentError(absl::StrCat(
                   "argument ", i, ", ", QuoteForMessage(arg, 60), ", holds the control byte ",
                   QuoteForMessage(arg.substr(at, 1)), " at byte ", at + 1,
                   "; flags and paths take none: retype the value, or rename the file")));
    }
  }
  std::string name = argv[1];
  if (name == "--version") name = "version";  // as other Unix tools spell it
  const bool help = name == "help" || name == "--help" || name == "-h";
  if (help && argc < 3) {
    PrintUsage(out);
    return kExitOk;
  }
  if (help) {
    name = argv[2];  // help <command>
    if (name == "help" || name == "--help" || name == "-h") {
      PrintUsage(out);
      return kExitOk;
    }
  }
  const Command* command = nullptr;
  for (const Command& c : AllCommands()) {
    if (c.name == name) command = &c;
  }
  CommandContext ctx{.out = &out, .err = &err, .out_is_terminal = out_is_terminal};
  if (command == nullptr) {
    std::string names;
    for (const Command& c : AllCommands())
      absl::StrAppend(&names, names.empty() ? "" : ", ", Absl(c.name));
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat("unknown command '", name,
                                                                    "'; commands are: ", names)));
  }
  if (help && argc > 3) {
    return ReportError(ctx,
                       absl::InvalidArgumentError(absl::StrCat("unexpected argument '", argv[3],
                                                               "'; help takes one command: "
                                                               "pipesched help ",
                                                               name)));
  }
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (help || a == "--help" || a == "-h") {
      PrintCommandHelp(*command, out);
      return kExitOk;
    }
    // launch's command line is the launched program's: its --help is not launch's.
    // (launch's own flags all take a value: "--rendezvous DIR" is one flag, not the
    // start of the command line.)
    if (command->runs_a_command) {
      if (a == "--" || a.rfind("--", 0) != 0) break;
      if (a.find('=') == std::string::npos && i + 1 < argc &&
          std::string_view(argv[i + 1]).rfind("--", 0) != 0) {
        ++i;
      }
    }
  }
  absl::StatusOr<ParsedArgs> parsed =
      ParseFlags(argc, argv, command->flags, command->runs_a_command);
  if (!parsed.ok()) return ReportError(ctx, parsed.status());
  ctx.positional = parsed->positional;
  ctx.flags_set = parsed->flags_set;
  return command->run(ctx);
}

}  // namespace pipesched::cli
