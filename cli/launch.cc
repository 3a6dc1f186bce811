// `pipesched launch`: starts the processes of a job on this host, each told its rank and
// the rendezvous directory, relays their output, and when one fails stops the others
// (after --grace seconds, for those that did not stop by themselves) and removes the
// rendezvous directory. For `train` it passes --processes, --process-rank, --rendezvous
// and --rendezvous-timeout; any other program reads the same from its environment
// (comm::CreateBootstrapFromEnvironment). docs/training.md, "Several processes".
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/bootstrap.h"

ABSL_DECLARE_FLAG(int32_t, processes);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(double, rendezvous_timeout);

ABSL_FLAG(std::string, output, "first",
          "launch: whose output is shown: 'first' = process 0's standard output as it is and "
          "every process's errors, each line after \"[RANK] \"; 'all' = every line of every "
          "process after \"[RANK] \"");
ABSL_FLAG(double, grace, 10,
          "launch: seconds the other processes get to end by themselves once one has failed "
          "(a failure that reaches them through the rendezvous stops them at once), before "
          "they are sent SIGTERM (and SIGKILL 5 s later)");

extern char** environ;

namespace pipesched::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The signal that asked the launcher to stop (SIGINT, SIGTERM, SIGHUP), else 0.
volatile std::sig_atomic_t g_stop_signal = 0;
void OnStopSignal(int signal) { g_stop_signal = signal; }

// Installs the stop handlers for its lifetime (the launcher forwards the signal to its
// processes and cleans up instead of dying at once), then restores what was there.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction action = {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &saved_[i]);
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &saved_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> saved_{};
};

// One output stream of one process, read through a pipe and relayed line by line.
struct Relay {
  int fd = -1;
  int rank = 0;
  bool is_err = false;
  bool shown = true;
  bool prefixed = true;
  std::string partial;  // the start of a line whose end has not arrived
};

struct Process {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
};

std::string DescribeExit(int rank, int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = strsignal(sig);
    return absl::StrCat("process ", rank, " was killed by signal ", sig,
                        name != nullptr ? absl::StrCat(" (", name, ")") : "");
  }
  return absl::StrCat("process ", rank, " exited with code ", WEXITSTATUS(wait_status));
}

int ExitCodeOf(int wait_status) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return WEXITSTATUS(wait_status);
}

bool Failed(int wait_status) { return !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0; }

// The path of this program, for `launch -- train`.
absl::StatusOr<std::string> ThisProgram() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot find this program's path (/proc/self/exe): ", ec.message()));
  }
  return self.string();
}

// A new directory for the rendezvous under $TMPDIR (or /tmp); the rendezvous itself is a
// path inside it that does not exist yet (process 0 creates it).
absl::StatusOr<std::string> MakeTemporaryParent() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/pipesched-launch-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot create a rendezvous directory like ",
                                               QuoteForMessage(pattern, 200), ": ",
                                               std::strerror(errno), "; give --rendezvous=DIR"));
  }
  return pattern;
}

class Launcher {
 public:
  Launcher(const CommandContext& ctx, bool show_all, double grace_seconds)
      : ctx_(ctx), show_all_(show_all), grace_seconds_(grace_seconds) {}

  ~Launcher() {
    for (Relay& relay : relays_) {
      if (relay.fd >= 0) ::close(relay.fd);
    }
  }

  // Starts process `rank` of `argv` (argv[0] is the program, searched on PATH) with
  // `env`; on failure nothing of it is left.
  absl::Status Start(int rank, const std::vector<std::string>& argv,
                     const std::vector<std::string>& env) {
    std::array<int, 2> out{-1, -1}, err{-1, -1};
    if (::pipe2(out.data(), O_CLOEXEC) != 0 || ::pipe2(err.data(), O_CLOEXEC) != 0) {
      const int saved = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) {
        if (fd >= 0) ::close(fd);
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create pipes for process ", rank, ": ", std::strerror(saved)));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::vector<char*> args, vars;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const std::string& v : env) vars.push_back(const_cast<char*>(v.c_str()));
    vars.push_back(nullptr);
    // Each process leads a process group of its own, so that stopping it stops what it
    // started too (a shell's children), and the launcher alone decides when to stop it
    // (a Ctrl-C reaches the launcher, which stops every group).
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), vars.data());
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    if (rc != 0) {
      ::close(out[0]);
      ::close(err[0]);
      const std::string what =
          absl::StrCat("cannot start ", QuoteForMessage(argv[0], 200), ": ", std::strerror(rc));
      if (rc == ENOENT || rc == EACCES || rc == ENOEXEC) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, "; give a program on PATH or its path, or a pipesched command (train)"));
      }
      return absl::ResourceExhaustedError(what);
    }
    procs_.push_back({.rank = rank, .pid = pid, .running = true});
    const bool first = rank == 0;
    relays_.push_back({.fd = out[0],
                       .rank = rank,
                       .is_err = false,
                       .shown = show_all_ || first,
                       .prefixed = show_all_});
    relays_.push_back(
        {.fd = err[0], .rank = rank, .is_err = true, .shown = true, .prefixed = true});
    return absl::OkStatus();
  }

  // Relays output and reaps the processes until every one has ended; returns the exit
  // code of the launch (see RunLaunch).
  int Supervise() {
    std::optional<Clock::time_point> term_at, kill_at;
    std::optional<int> first_failure;  // index into procs_
    int forwarded_signal = 0;
    while (true) {
      Pump(/*timeout_ms=*/50);
      Reap(first_failure, term_at);
      const auto now = Clock::now();
      if (g_stop_signal != 0 && forwarded_signal == 0) {
        forwarded_signal = g_stop_signal;
        Say(absl::StrCat("stopping every process (the launcher got signal ", forwarded_signal,
                         ")"));
        SignalRunning(SIGTERM);
        kill_at = now + std::chrono::seconds(5);
        term_at.reset();
      }
      if (term_at.has_value() && now >= *term_at) {
        term_at.reset();
        if (std::vector<int> running = RunningRanks(); !running.empty()) {
          Say(absl::StrCat(
              "stopping process", running.size() > 1 ? "es " : " ", absl::StrJoin(running, ", "),
              ": still running ", ShortestNumber(grace_seconds_), " s after ",
              DescribeExit(procs_[*first_failure].rank, procs_[*first_failure].wait_status)));
          SignalRunning(SIGTERM);
          kill_at = now + std::chrono::seconds(5);
        }
      }
      if (kill_at.has_value() && now >= *kill_at) {
        kill_at.reset();
        SignalRunning(SIGKILL);
      }
      if (RunningRanks().empty()) break;
    }
    // Everyone has ended: what is left in the pipes (a process's own children may hold
    // them open, so not past a second).
    const auto drain_until = Clock::now() + std::chrono::seconds(1);
    while (AnyOpen() && Clock::now() < drain_until) Pump(/*timeout_ms=*/20);
    for (Relay& relay : relays_) Close(relay);
    if (forwarded_signal != 0) return 128 + forwarded_signal;
    if (first_failure.has_value()) return ExitCodeOf(procs_[*first_failure].wait_status);
    return kExitOk;
  }

  // Stops whatever was started (a later process could not be started) and waits for it.
  void StopAll() {
    SignalRunning(SIGTERM);
    const auto kill_at = Clock::now() + std::chrono::seconds(5);
    std::optional<int> ignored;
    std::optional<Clock::time_point> no_term;
    while (!RunningRanks().empty()) {
      Pump(/*timeout_ms=*/20);
      Reap(ignored, no_term);
      if (Clock::now() >= kill_at) SignalRunning(SIGKILL);
    }
    for (Relay& relay : relays_) Close(relay);
  }

 private:
  void Say(const std::string& line) {
    *ctx_.err << "pipesched launch: " << line << "\n" << std::flush;
  }

  std::vector<int> RunningRanks() const {
    std::vector<int> ranks;
    for (const Process& p : procs_) {
      if (p.running) ranks.push_back(p.rank);
    }
    return ranks;
  }

  void SignalRunning(int signal) {
    for (const Process& p : procs_) {
      if (p.running) ::kill(-p.pid, signal);  // its process group
    }
  }

  bool AnyOpen() const {
    for (const Relay& relay : relays_) {
      if (relay.fd >= 0) return true;
    }
    return false;
  }

  void Reap(std::optional<int>& first_failure, std::optional<Clock::time_point>& term_at) {
    std::optional<int> failed;  // the first failure among those that ended just now
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      Process& p = procs_[i];
      if (!p.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(p.pid, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      p.running = false;
      p.wait_status = got < 0 ? 0 : status;
      if (got >= 0 && Failed(status) && !failed.has_value()) failed = static_cast<int>(i);
    }
    if (failed.has_value() && !first_failure.has_value()) {
      first_failure = failed;
      const Process& p = procs_[*failed];
      const int status = p.wait_status;
      if (!RunningRanks().empty()) {
        Say(absl::StrCat(DescribeExit(p.rank, status), "; the others get ",
                         ShortestNumber(grace_seconds_), " s to stop"));
        term_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(grace_seconds_));
      } else {
        Say(DescribeExit(p.rank, status));
      }
    }
  }

  // Waits up to `timeout_ms` for output and relays every complete line that arrived.
  void Pump(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<Relay*> owners;
    for (Relay& relay : relays_) {
      if (relay.fd < 0) continue;
      fds.push_back({.fd = relay.fd, .events = POLLIN, .revents = 0});
      owners.push_back(&relay);
    }
    if (fds.empty()) {
      ::poll(nullptr, 0, timeout_ms);
      return;
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout, or EINTR
    std::array<char, 65536> buffer;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Relay& relay = *owners[i];
      const ssize_t n = ::read(relay.fd, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        Close(relay);
        continue;
      }
      relay.partial.append(buffer.data(), static_cast<std::size_t>(n));
      std::size_t start = 0;
      for (std::size_t end; (end = relay.partial.find('\n', start)) != std::string::npos;
           start = end + 1) {
        Emit(relay, std::string_view(relay.partial).substr(start, end - start));
      }
      relay.partial.erase(0, start);
    }
  }

  void Emit(const Relay& relay, std::string_view line) {
    if (!relay.shown) return;
    std::ostream& to = relay.is_err ? *ctx_.err : *ctx_.out;
    if (relay.prefixed) to << "[" << relay.rank << "] ";
    to << line << "\n" << std::flush;
  }

  void Close(Relay& relay) {
    if (relay.fd < 0) return;
    ::close(relay.fd);
    relay.fd = -1;
    if (!relay.partial.empty()) Emit(relay, relay.partial);  // a last line without its end
    relay.partial.clear();
  }

  const CommandContext& ctx_;
  const bool show_all_;
  const double grace_seconds_;
  std::vector<Process> procs_;
  std::vector<Relay> relays_;
};

// The environment of process `rank`: this one's, with the launch variables replaced.
std::vector<std::string> EnvironmentFor(int processes, int rank, const std::string& rendezvous,
                                        double timeout) {
  const std::array<std::pair<std::string_view, std::string>, 4> ours = {{
      {comm::kProcessesVariable, absl::StrCat(processes)},
      {comm::kProcessRankVariable, absl::StrCat(rank)},
      {comm::kRendezvousVariable, rendezvous},
      {comm::kRendezvousTimeoutVariable, ShortestNumber(timeout)},
  }};
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [ours_name, value] : ours) replaced = replaced || name == ours_name;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(absl::StrCat(Absl(name), "=", value));
  return env;
}

// The flags of train that launch sets for each process.
constexpr std::string_view kLaunchSets[] = {"processes",          "process-rank",
                                            "process_rank",       "rendezvous",
                                            "rendezvous-timeout", "rendezvous_timeout"};

absl::Status CheckCommand(const std::vector<std::string>& command) {
  if (command.empty()) {
    return absl::InvalidArgumentError(
        "launch needs the command each process runs, after --: `pipesched launch "
        "--processes=2 -- train --stages=2`, or a program of yours");
  }
  const std::string& name = command[0];
  for (const Command& c : AllCommands()) {
    if (c.name == name && name != "train") {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name,
          "' runs as one process; launch starts the processes of a training job: `-- train "
          "...`, or a program of yours that reads ",
          comm::kProcessesVariable, " (docs/training.md)"));
    }
  }
  if (name != "train") return absl::OkStatus();
  for (std::size_t i = 1; i < command.size(); ++i) {
    const std::string_view arg = command[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    const std::string_view flag = arg.substr(2, arg.find('=') - 2);
    for (std::string_view set : kLaunchSets) {
      if (flag == set) {
        return absl::InvalidArgumentError(absl::StrCat(
            "train's --", Absl(flag),
            " is launch's to set (each process gets its own --process-rank): give "
            "--processes, --rendezvous and --rendezvous-timeout to launch, before --"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunLaunch(const CommandContext& ctx) {
  const int processes = absl::GetFlag(FLAGS_processes);
  const std::string output = absl::GetFlag(FLAGS_output);
  const double grace = absl::GetFlag(FLAGS_grace);
  const double timeout = absl::GetFlag(FLAGS_rendezvous_timeout);
  std::string rendezvous = absl::GetFlag(FLAGS_rendezvous);
  if (!FlagGiven(ctx, "processes")) {
    return ReportError(ctx, absl::InvalidArgumentError(
                                "launch needs --processes=N: how many processes to start (2 to "
                                "4096), one per rank of the job"));
  }
  if (processes < 2 || processes > 4096) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "--processes=", processes,
                                " is out of range for launch: use 2 to 4096 (for one process, "
                                "run the command itself)")));
  }
  if (output != "first" && output != "all") {
    return ReportError(
        ctx, absl::InvalidArgumentError(absl::StrCat("--output=", QuoteForMessage(output),
                                                     " is not a choice: use first or all")));
  }
  if (!(grace >= 0) || !std::isfinite(grace) || grace > 86400) {
    return ReportError(
        ctx, absl::InvalidArgumentError(absl::StrCat("--grace=", ShortestNumber(grace),
                                                     " is out of range: give 0 to 86400 seconds")));
  }
  if (!(timeout >= 1) || !std::isfinite(timeout)) {
    return ReportError(
        ctx, absl::InvalidArgumentError(absl::StrCat(
                 "--rendezvous-timeout=", ShortestNumber(timeout), " must be at least 1 second")));
  }
  if (absl::Status s = CheckCommand(ctx.positional); !s.ok()) return ReportError(ctx, s);
  std::string temporary_parent;
  if (rendezvous.empty()) {
    absl::StatusOr<std::string> parent = MakeTemporaryParent();
    if (!parent.ok()) return ReportError(ctx, parent.status());
    temporary_parent = *parent;
    rendezvous = temporary_parent + "/rendezvous";
  } else {
    std::error_code ec;
    if (std::filesystem::symlink_status(rendezvous, ec).type() !=
        std::filesystem::file_type::not_found) {
      return ReportError(
          ctx, absl::InvalidArgumentError(absl::StrCat(
                   "--rendezvous=", QuoteForMessage(rendezvous, 200),
                   " exists already (an earlier run that did not end cleanly, or another job?): "
                   "remove it, give a new path, or leave --rendezvous out for a temporary one")));
    }
  }
  std::vector<std::string> base = ctx.positional;
  const bool is_train = base[0] == "train";
  if (is_train) {
    absl::StatusOr<std::string> self = ThisProgram();
    if (!self.ok()) return ReportError(ctx, self.status());
    base.insert(base.begin(), *self);
  }
  int code = kExitOk;
  {
    StopSignals stop_signals;
    Launcher launcher(ctx, output == "all", grace);
    absl::Status started = absl::OkStatus();
    for (int rank = 0; rank < processes && started.ok(); ++rank) {
      std::vector<std::string> argv = base;
      if (is_train) {
        argv.push_back(absl::StrCat("--processes=", processes));
        argv.push_back(absl::StrCat("--process-rank=", rank));
        argv.push_back(absl::StrCat("--rendezvous=", rendezvous));
        argv.push_back(absl::StrCat("--rendezvous-timeout=", ShortestNumber(timeout)));
      }
      started = launcher.Start(rank, argv, EnvironmentFor(processes, rank, rendezvous, timeout));
    }
    if (started.ok()) {
      code = launcher.Supervise();
    } else {
      launcher.StopAll();
      code = ReportError(ctx, started);
    }
  }
  // Every process has ended: nobody uses the rendezvous any more (a clean job removed
  // it; a failed one left it).
  std::error_code ec;
  std::filesystem::remove_all(temporary_parent.empty() ? rendezvous : temporary_parent, ec);
  return code;
}

}  // namespace pipesched::cli
