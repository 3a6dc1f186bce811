// `pipesched launch`: starts the processes of a job on this host, each told its rank and
// the rendezvous directory, relays their output, and when one fails stops the others
// (after --grace seconds, for those that did not stop by themselves) and removes the
// rendezvous directory. For `train` it passes --processes, --process-rank, --rendezvous
// and --rendezvous-timeout; any other program reads the same from its environment
// (comm::CreateBootstrapFromEnvironment). docs/training.md, "Launching".
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/job.h"
#include "cli/training.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/bootstrap.h"

ABSL_DECLARE_FLAG(int32_t, processes);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(double, rendezvous_timeout);

ABSL_FLAG(std::string, output, "first",
          "launch: whose output is shown: 'first' = process 0's standard output as it is and "
          "every process's errors, each line after \"[RANK] \"; 'all' = every line of every "
          "process after \"[RANK] \"");
ABSL_FLAG(int32_t, nodes, 1,
          "launch: hosts of the job, each running its own launch with the same flags but "
          "--node-rank; the job has nodes x processes processes");
ABSL_FLAG(int32_t, node_rank, 0,
          "launch: this host's place among --nodes: its processes are ranks node-rank x "
          "processes to (node-rank + 1) x processes - 1");
ABSL_FLAG(double, grace, 10,
          "launch: seconds the other processes get to end by themselves once one has failed "
          "(a failure that reaches them through the rendezvous stops them at once), before "
          "they are sent SIGTERM (and SIGKILL 5 s later)");

extern char** environ;

namespace pipesched::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A line of a prefixed relay longer than this is relayed in pieces of this size.
constexpr std::size_t kMaxLine = 64 << 10;

// The signal that asked the launcher to stop (SIGINT, SIGTERM, SIGHUP, SIGQUIT), else 0.
volatile std::sig_atomic_t g_stop_signal = 0;
void OnStopSignal(int signal) { g_stop_signal = signal; }

// Writes all of `bytes` to `fd`, or returns false: on an error, or once a stop signal
// has come while `fd` takes nothing. A write through stdio is not enough: interrupted
// after part of its bytes, it writes the rest and blocks again, so that a reader that
// never reads (a FIFO held open) would keep the launcher from its processes for good.
// Each write waits for room first (poll, 0.1 s at a time: a signal that comes just
// before a blocking write is not missed) and then writes at most PIPE_BUF bytes, which
// a pipe that has room takes without blocking.
bool WriteGivingWayToStop(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    pollfd room = {.fd = fd, .events = POLLOUT, .revents = 0};
    const int ready = ::poll(&room, 1, 100);
    if (ready == 0 || (ready < 0 && errno == EINTR)) {
      if (g_stop_signal != 0) return false;
      continue;
    }
    if (ready < 0) return false;
    const ssize_t n = ::write(fd, bytes.data(), std::min<std::size_t>(bytes.size(), PIPE_BUF));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// The launcher's signal dispositions for its lifetime, then what was there before:
// SIGINT, SIGTERM, SIGHUP and SIGQUIT set a flag (the launcher stops its processes and cleans up)
// unless they were ignored when it started (nohup, a shell's background job: they stay
// ignored); SIGPIPE is ignored (a closed standard output is an error to handle, not the
// end of the launcher with its processes left running); SIGCHLD is the default (ignored,
// waitpid would lose every exit status).
class Signals {
 public:
  Signals() {
    g_stop_signal = 0;
    for (std::size_t i = 0; i < kStop.size(); ++i) {
      sigaction(kStop[i], nullptr, &saved_[i]);
      if (saved_[i].sa_handler == SIG_IGN) continue;
      struct sigaction action = {};
      action.sa_handler = OnStopSignal;
      // No SA_RESTART: a write blocked on a reader that does not read (a full pipe) is
      // cut short by the signal, and the launcher goes on to stop the job.
      action.sa_flags = 0;
      sigemptyset(&action.sa_mask);
      sigaction(kStop[i], &action, nullptr);
    }
    struct sigaction ignore = {}, fallback = {};
    ignore.sa_handler = SIG_IGN;
    fallback.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &ignore, &saved_pipe_);
    sigaction(SIGCHLD, &fallback, &saved_child_);
  }
  ~Signals() {
    for (std::size_t i = 0; i < kStop.size(); ++i) sigaction(kStop[i], &saved_[i], nullptr);
    sigaction(SIGPIPE, &saved_pipe_, nullptr);
    sigaction(SIGCHLD, &saved_child_, nullptr);
  }
  Signals(const Signals&) = delete;
  Signals& operator=(const Signals&) = delete;

  // The processes get SIGPIPE's default back, unless the launcher found it ignored.
  bool pipe_was_default() const { return saved_pipe_.sa_handler == SIG_DFL; }

 private:
  static constexpr std::array<int, 4> kStop = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  std::array<struct sigaction, 4> saved_{};
  struct sigaction saved_pipe_ = {};
  struct sigaction saved_child_ = {};
};

// How one output stream of one process reaches the launcher's.
enum class RelayMode {
  kHidden,       // read and dropped (the other processes' standard output by default)
  kPassThrough,  // byte for byte (process 0's standard output by default)
  kPrefixed,     // line by line, each after "[RANK] "
};

struct Relay {
  int fd = -1;
  int rank = 0;
  bool is_err = false;
  RelayMode mode = RelayMode::kPrefixed;
  std::string partial;  // the start of a line whose end has not arrived
};

struct Process {
  int rank = 0;
  pid_t pid = -1;           // also its process group's id
  bool running = false;     // not reaped yet
  bool group_alive = true;  // its process group may still have members
  bool stop_reported = false;
};

// The first failure of a job: what is said about it and the launch's exit code.
struct Failure {
  std::string what;  // "process 1 exited with code 3"
  int exit_code = 1;
  int rank = -1;  // the failed process, if it was one
};

// "9 (Killed)": the signal's number and, where the C library has one, its description.
std::string SignalText(int sig) {
  const char* name = strsignal(sig);
  return name != nullptr ? absl::StrCat(sig, " (", name, ")") : absl::StrCat(sig);
}

Failure DescribeExit(int rank, int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return {absl::StrCat("process ", rank, " was killed by signal ", SignalText(sig)), 128 + sig,
            rank};
  }
  return {absl::StrCat("process ", rank, " exited with code ", WEXITSTATUS(wait_status)),
          WEXITSTATUS(wait_status), rank};
}

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

// `path` absolute, without a trailing slash (so that removing it never follows a link).
std::string Absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) p = path;
  // Not lexically_normal: "link/.." is the link target's parent, which the kernel
  // resolves for mkdir and remove alike.
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// The directory the launch creates and removes at the end: a new one under $TMPDIR (or
// /tmp), or --rendezvous itself, which must not exist (mkdir: no other job's directory,
// nor a link to one, is ever taken). The processes meet in "<it>/rendezvous".
absl::StatusOr<std::string> MakeLaunchDirectory(const std::string& given) {
  if (given.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        Absolute(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/pipesched-launch-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot create a rendezvous directory like ",
                                                 QuoteForMessage(pattern, 200), ": ",
                                                 std::strerror(errno), "; give --rendezvous=DIR"));
    }
    return pattern;
  }
  const std::string dir = Absolute(given);
  if (::mkdir(dir.c_str(), 0777) != 0) {
    if (errno == EEXIST) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rendezvous=", QuoteForMessage(given, 200),
          " exists already (an earlier run that did not end cleanly, or another job?): "
          "remove it, give a new path, or leave --rendezvous out for a temporary one"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create --rendezvous=", QuoteForMessage(given, 200), ": ",
                     std::strerror(errno), "; give a new path in a directory that exists"));
  }
  return dir;
}

// Room for a pipe pair per process: the soft limit on open files is raised to what is
// needed where the hard limit allows (the processes inherit it), else refused.
absl::Status MakeRoomForPipes(int processes) {
  // Two per process on top of what is open now, and a few for the launcher itself.
  rlim_t open_now = 16;
  std::error_code ec;
  if (std::filesystem::is_directory("/proc/self/fd", ec)) {
    open_now = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++open_now;
    }
  }
  const rlim_t needed = static_cast<rlim_t>(processes) * 2 + open_now + 8;
  struct rlimit limit = {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed) {
    return absl::OkStatus();
  }
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
    limit.rlim_cur = needed;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "--processes=", processes, " needs about ", needed,
      " open files (two pipes per process), more than this process may open (ulimit -n: ",
      limit.rlim_cur, ", at most ",
      limit.rlim_max == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(limit.rlim_max),
      "): raise the limit, or start fewer processes"));
}

class Launcher {
 public:
  // `rendezvous`: the job's rendezvous directory, where a failure is marked (Fail);
  // `stop_marks_as`: the rank a stop of this launch is marked as (MarkStopped), -1 for
  // none (one host: the launch stops every process itself).
  Launcher(const CommandContext& ctx, bool show_all, double grace_seconds, bool pipe_default,
           std::string rendezvous, int stop_marks_as)
      : ctx_(ctx),
        show_all_(show_all),
        grace_seconds_(grace_seconds),
        pipe_default_(pipe_default),
        rendezvous_(std::move(rendezvous)),
        stop_marks_as_(stop_marks_as) {}

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
    // Each process leads a process group of its own, so that stopping it stops what it
    // started too (a shell's children), and the launcher alone decides when to stop it
    // (a Ctrl-C reaches the launcher, which stops every group). SIGPIPE, which the
    // launcher ignores, is the default again in the process.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t defaults;
    sigemptyset(&defaults);
    if (pipe_default_) sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attributes, 0);
    std::vector<char*> args, vars;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const std::string& v : env) vars.push_back(const_cast<char*>(v.c_str()));
    vars.push_back(nullptr);
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
    const RelayMode out_mode = show_all_   ? RelayMode::kPrefixed
                               : rank == 0 ? RelayMode::kPassThrough
                                           : RelayMode::kHidden;
    relays_.push_back({.fd = out[0], .rank = rank, .is_err = false, .mode = out_mode});
    relays_.push_back({.fd = err[0], .rank = rank, .is_err = true, .mode = RelayMode::kPrefixed});
    return absl::OkStatus();
  }

  // Relays output and reaps the processes until every one has ended; returns the exit
  // code of the launch (see RunLaunch).
  // The launcher's own error output for what is said while its signal handlers are in
  // place (Send: a blocked reader gives way to a stop signal).
  void WriteError(std::string_view text) { Send(/*is_err=*/true, text); }

  int Supervise() {
    std::optional<Clock::time_point> term_at, kill_at;
    // The first failure is announced a moment after it is seen, so that processes that
    // fail with it (the same bad flag) are counted out of "the others".
    std::optional<Clock::time_point> failed_at;
    bool announced = false;
    int stop_signal = 0;  // why the launcher itself stops the job
    while (true) {
      Pump(/*timeout_ms=*/failed_at.has_value() && !announced ? 10 : 50);
      Reap();
      const auto now = Clock::now();
      if (failure_.has_value() && !failed_at.has_value()) failed_at = now;
      if (failed_at.has_value() && !announced && stop_signal == 0 &&
          (now >= *failed_at + std::chrono::milliseconds(100) || RunningRanks().empty())) {
        announced = true;
        if (RunningRanks().empty()) {
          Say(failure_->what);
        } else {
          Say(absl::StrCat(failure_->what, "; the others get ", ShortestNumber(grace_seconds_),
                           " s to stop"));
          term_at = *failed_at + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(grace_seconds_));
        }
      }
      if (stop_signal == 0 && (g_stop_signal != 0 || out_lost_ || err_lost_)) {
        stop_signal = g_stop_signal != 0 ? static_cast<int>(g_stop_signal) : SIGPIPE;
        quiet_ = true;  // what ends now, ends because the launcher stops it
        Say(stop_signal == SIGPIPE
                ? absl::StrCat("standard ", out_lost_ ? "output" : "error",
                               " cannot be written (a closed pipe, or a full disk): stopping "
                               "every process")
                : absl::StrCat("stopping every process (the launcher got signal ", stop_signal,
                               ")"));
        MarkStopped(stop_signal == SIGPIPE
                        ? std::string("its output cannot be written")
                        : absl::StrCat("it got signal ", SignalText(stop_signal)));
        SignalGroups(SIGTERM);
        term_at.reset();
        kill_at = now + std::chrono::seconds(5);
      }
      if (term_at.has_value() && now >= *term_at) {
        term_at.reset();
        if (std::vector<int> running = RunningRanks(); !running.empty()) {
          Say(absl::StrCat("stopping process", running.size() > 1 ? "es " : " ",
                           absl::StrJoin(running, ", "), ": still running ",
                           ShortestNumber(grace_seconds_), " s after ", failure_->what));
          SignalGroups(SIGTERM);
          kill_at = now + std::chrono::seconds(5);
        }
      }
      if (kill_at.has_value() && now >= *kill_at) {
        kill_at.reset();
        SignalGroups(SIGKILL);
      }
      if (RunningRanks().empty()) break;
    }
    // A job that failed or was stopped: what its processes started goes too.
    if (failure_.has_value() || stop_signal != 0) StopLeftovers();
    // What is left in the pipes (a process's own children may hold them open, so not
    // past a second).
    const auto drain_until = Clock::now() + std::chrono::seconds(1);
    while (AnyOpen() && Clock::now() < drain_until) Pump(/*timeout_ms=*/20);
    for (Relay& relay : relays_) Close(relay);
    if (stop_signal != 0) return 128 + stop_signal;
    if (failure_.has_value()) return failure_->exit_code;
    return kExitOk;
  }

  // When this launch stops its processes by itself (nodes > 1), the processes on the
  // other hosts are told through the rendezvous, as for a failed process.
  void MarkStopped(std::string_view why) {
    if (stop_marks_as_ < 0 || rendezvous_.empty()) return;
    (void)comm::MarkFileBootstrapFailed(
        rendezvous_, stop_marks_as_,
        absl::StrCat("its host's pipesched launch stopped it: ", Absl(why)));
  }

  // Stops whatever was started (a later process could not be started) and waits for it,
  // without a word: the launch's error says why.
  void StopAll() {
    MarkStopped("a process could not be started");
    quiet_ = true;
    SignalGroups(SIGTERM);
    const auto kill_at = Clock::now() + std::chrono::seconds(5);
    while (!RunningRanks().empty()) {
      Pump(/*timeout_ms=*/20);
      Reap();
      if (Clock::now() >= kill_at) SignalGroups(SIGKILL);
    }
    StopLeftovers();
    for (Relay& relay : relays_) Close(relay);
  }

 private:
  void Say(const std::string& line) {
    Send(/*is_err=*/true, absl::StrCat("pipesched launch: ", line, "\n"));
  }

  std::vector<int> RunningRanks() const {
    std::vector<int> ranks;
    for (const Process& p : procs_) {
      if (p.running) ranks.push_back(p.rank);
    }
    return ranks;
  }

  // The process groups of this session with a live member: a process that is not a
  // zombie, or a zombie whose other threads still run (its main thread called
  // pthread_exit). kill(0) counts zombies, which stay until someone reaps them (in a
  // container whose init does not, forever). nullopt where /proc cannot be read.
  static std::optional<std::set<pid_t>> LiveGroups() {
    std::error_code ec;
    if (!std::filesystem::is_directory("/proc/self", ec)) return std::nullopt;
    const pid_t session = ::getsid(0);
    std::set<pid_t> live;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "stat");
      std::string stat;
      std::getline(in, stat);
      // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
      // cmajflt utime stime cutime cstime priority nice num_threads ...": comm may hold
      // spaces and parentheses.
      const std::size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 1));
      char state = 0;
      long long ppid = 0, pgrp = 0, sid = 0, skipped = 0, threads = 0;
      if (!(rest >> state >> ppid >> pgrp >> sid)) continue;
      for (int k = 0; k < 13 && (rest >> skipped); ++k) {
      }
      if (!(rest >> threads)) threads = 1;
      const bool alive = (state != 'Z' && state != 'X') || threads > 1;
      if (alive && sid == session) live.insert(static_cast<pid_t>(pgrp));
    }
    return live;
  }

  // A reaped process's group with no live member left is forgotten: its id may be taken
  // by another process group, which must never be signalled. (A process not reaped yet
  // holds its id.)
  void ForgetEmptyGroups() {
    const std::optional<std::set<pid_t>> live = LiveGroups();
    for (Process& p : procs_) {
      if (!p.group_alive || p.running) continue;
      const bool empty =
          live.has_value() ? !live->contains(p.pid) : ::kill(-p.pid, 0) != 0 && errno == ESRCH;
      if (empty) p.group_alive = false;
    }
  }

  // `signal` to every process group of the job that still has members (a process that
  // has ended may have left children running in it); a stopped process is continued, so
  // that it can act on SIGTERM.
  void SignalGroups(int signal) {
    ForgetEmptyGroups();
    for (Process& p : procs_) {
      if (!p.group_alive) continue;
      if (::kill(-p.pid, signal) != 0 && errno == ESRCH) {
        p.group_alive = false;
        continue;
      }
      if (signal == SIGTERM) ::kill(-p.pid, SIGCONT);
    }
  }

  bool AnyGroupAlive() {
    ForgetEmptyGroups();
    for (const Process& p : procs_) {
      if (p.group_alive) return true;
    }
    return false;
  }

  // After every process has ended: SIGTERM to what they left in their groups, SIGKILL to
  // what is still there 2 s later.
  void StopLeftovers() {
    SignalGroups(SIGTERM);
    const auto kill_at = Clock::now() + std::chrono::seconds(2);
    while (AnyGroupAlive()) {
      if (Clock::now() >= kill_at) {
        SignalGroups(SIGKILL);
        break;
      }
      Pump(/*timeout_ms=*/20);
    }
  }

  bool AnyOpen() const {
    for (const Relay& relay : relays_) {
      if (relay.fd >= 0) return true;
    }
    return false;
  }

  void Reap() {
    for (Process& p : procs_) {
      if (!p.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(p.pid, &status, WNOHANG | WUNTRACED);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      if (got > 0 && WIFSTOPPED(status)) {
        // Stopped, most likely for reading the terminal (SIGTTIN) from a background
        // process group: it would wait forever. A failure of the job.
        if (!p.stop_reported) {
          p.stop_reported = true;
          Fail({absl::StrCat("process ", p.rank, " was stopped by signal ",
                             SignalText(WSTOPSIG(status)),
                             ": launched processes have no terminal to read or write"),
                1, p.rank});
        }
        continue;
      }
      p.running = false;
      if (got < 0) {
        Fail({absl::StrCat("process ", p.rank,
                           "'s exit status is lost (waitpid: ", std::strerror(errno), ")"),
              1, p.rank});
        continue;
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail(DescribeExit(p.rank, status));
    }
  }

  void Fail(Failure failure) {
    if (quiet_ || failure_.has_value()) return;
    // The processes of the job that wait in the rendezvous, on this host and on the
    // others, stop now rather than at their timeouts (one that failed by itself has said
    // why already: the first marker stays).
    if (failure.rank >= 0 && !rendezvous_.empty()) {
      (void)comm::MarkFileBootstrapFailed(
          rendezvous_, failure.rank,
          absl::StrCat(Absl(failure.what), " (said by pipesched launch)"));
    }
    failure_ = std::move(failure);
  }

  // Waits up to `timeout_ms` for output and relays what arrived.
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
      Take(relay, std::string_view(buffer.data(), static_cast<std::size_t>(n)));
    }
  }

  void Take(Relay& relay, std::string_view bytes) {
    switch (relay.mode) {
      case RelayMode::kHidden:
        return;
      case RelayMode::kPassThrough:
        Write(relay, bytes);
        return;
      case RelayMode::kPrefixed:
        break;
    }
    std::size_t scan = relay.partial.size();  // what was there holds no newline
    relay.partial.append(bytes);
    std::size_t start = 0;
    for (std::size_t end; (end = relay.partial.find('\n', scan)) != std::string::npos;) {
      EmitLine(relay, std::string_view(relay.partial).substr(start, end - start));
      start = scan = end + 1;
    }
    relay.partial.erase(0, start);
    // A line this long is relayed in pieces rather than held.
    std::size_t cut = 0;
    for (; relay.partial.size() - cut >= kMaxLine; cut += kMaxLine) {
      EmitLine(relay, std::string_view(relay.partial).substr(cut, kMaxLine));
    }
    relay.partial.erase(0, cut);
  }

  // One line after its prefix, in pieces of kMaxLine: a long line whose end came in the
  // same read as its start is cut as one that came in many.
  void EmitLine(const Relay& relay, std::string_view line) {
    do {
      const std::string_view piece = line.substr(0, kMaxLine);
      Write(relay, absl::StrCat("[", relay.rank, "] ", Absl(piece), "\n"));
      line.remove_prefix(piece.size());
    } while (!line.empty());
  }

  void Write(const Relay& relay, std::string_view bytes) { Send(relay.is_err, bytes); }

  // Writes to the launcher's standard output (error), or marks it lost. The program's
  // own streams are written through their file descriptors (WriteGivingWayToStop): a
  // write blocked on a reader that does not read gives way to a stop signal.
  void Send(bool is_err, std::string_view bytes) {
    std::ostream& to = is_err ? *ctx_.err : *ctx_.out;
    bool& lost = is_err ? err_lost_ : out_lost_;
    if (lost) return;
    const int fd = &to == &std::cout ? STDOUT_FILENO : &to == &std::cerr ? STDERR_FILENO : -1;
    if (fd >= 0) {
      to.flush();  // (empty: everything the launcher writes there goes through here)
      if (!to || !WriteGivingWayToStop(fd, bytes)) lost = true;
      return;
    }
    to.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    to.flush();
    if (!to) lost = true;
  }

  void Close(Relay& relay) {
    if (relay.fd < 0) return;
    ::close(relay.fd);
    relay.fd = -1;
    // A last line without its end.
    if (relay.mode == RelayMode::kPrefixed && !relay.partial.empty())
      EmitLine(relay, relay.partial);
    relay.partial.clear();
  }

  const CommandContext& ctx_;
  const bool show_all_;
  const double grace_seconds_;
  const bool pipe_default_;
  const std::string rendezvous_;
  const int stop_marks_as_;
  std::vector<Process> procs_;
  std::vector<Relay> relays_;
  std::optional<Failure> failure_;
  bool quiet_ = false;  // the launcher stops the job: exits are not failures
  // Writing standard output (error) failed: a closed pipe, a full disk.
  bool out_lost_ = false, err_lost_ = false;
};

// The environment of process `rank`: the one this program was started with (its own
// changes to it undone, OwnEnvironmentChanges), the launch variables replaced.
std::vector<std::string> EnvironmentFor(int processes, int rank, const std::string& rendezvous,
                                        double timeout) {
  std::vector<std::pair<std::string, std::optional<std::string>>> set = {
      {comm::kProcessesVariable, absl::StrCat(processes)},
      {comm::kProcessRankVariable, absl::StrCat(rank)},
      {comm::kRendezvousVariable, rendezvous},
      {comm::kRendezvousTimeoutVariable, ShortestNumber(timeout)},
  };
  for (const auto& [name, original] : OwnEnvironmentChanges()) set.emplace_back(name, original);
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [set_name, value] : set) replaced = replaced || name == set_name;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [name, value] : set) {
    if (value.has_value()) env.push_back(absl::StrCat(name, "=", *value));
  }
  return env;
}

// What launch gives train or bench of process `rank`, right after the command's name.
std::vector<std::string> TrainProcessFlags(int processes, int rank, const std::string& rendezvous,
                                           double timeout) {
  return {absl::StrCat("--processes=", processes), absl::StrCat("--process-rank=", rank),
          absl::StrCat("--rendezvous=", rendezvous),
          absl::StrCat("--rendezvous-timeout=", ShortestNumber(timeout))};
}

// The flags of train and bench that launch sets for each process.
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
    if (c.name == name && name != "train" && name != "bench") {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name,
          "' runs as one process; launch starts the processes of a training job: `-- train "
          "...` or `-- bench ...`, or a program of yours that reads ",
          comm::kProcessesVariable, " (docs/training.md)"));
    }
  }
  if (name != "train" && name != "bench") return absl::OkStatus();
  for (std::size_t i = 1; i < command.size(); ++i) {
    const std::string_view arg = command[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    const std::string_view flag = arg.substr(2, arg.find('=') - 2);
    for (std::string_view set : kLaunchSets) {
      if (flag == set) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, "'s --", Absl(flag),
            " is launch's to set (each process gets its own --process-rank): give "
            "--processes, --rendezvous and --rendezvous-timeout to launch, before --"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunLaunch(const CommandContext& ctx) {
  const int processes = absl::GetFlag(FLAGS_processes);  // on this host
  const int nodes = absl::GetFlag(FLAGS_nodes);
  const int node_rank = absl::GetFlag(FLAGS_node_rank);
  const std::string output = absl::GetFlag(FLAGS_output);
  const double grace = absl::GetFlag(FLAGS_grace);
  const double timeout = absl::GetFlag(FLAGS_rendezvous_timeout);
  const std::string rendezvous_flag = absl::GetFlag(FLAGS_rendezvous);
  if (!FlagGiven(ctx, "processes")) {
    return ReportError(ctx, absl::InvalidArgumentError(
                                "launch needs --processes=N: how many processes to start here "
                                "(2 to 4096; with --nodes, 1 or more per host), one per rank "
                                "of the job"));
  }
  if (nodes < 1 || nodes > 4096) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "--nodes=", nodes, " is out of range: use 1 to 4096 hosts")));
  }
  if (nodes == 1 && node_rank != 0) {
    return ReportError(ctx, absl::InvalidArgumentError(
                                "--node-rank is for a job on several hosts: give --nodes=K (K > "
                                "1) too, or drop it"));
  }
  if (node_rank < 0 || node_rank >= nodes) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "--node-rank=", node_rank, " is out of range for --nodes=", nodes,
                                ": use 0 to ", nodes - 1)));
  }
  if (nodes == 1 && (processes < 2 || processes > 4096)) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "--processes=", processes,
                                " is out of range for launch: use 2 to 4096 (for one process, "
                                "run the command itself)")));
  }
  if (nodes > 1 && (processes < 1 || static_cast<std::int64_t>(processes) * nodes > 4096)) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "--processes=", processes, " on each of --nodes=", nodes,
                                " is out of range: use 1 or more per host, at most 4096 in all")));
  }
  if (nodes > 1 && rendezvous_flag.empty()) {
    return ReportError(ctx, absl::InvalidArgumentError(absl::StrCat(
                                "--nodes=", nodes,
                                " needs --rendezvous=DIR: a path every host sees (a shared file "
                                "system), the same on all, that does not exist yet (node 0 "
                                "creates it)")));
  }
  const int total = processes * nodes;  // the job's processes
  const int first_rank = node_rank * processes;
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
  if (absl::Status s = MakeRoomForPipes(processes); !s.ok()) return ReportError(ctx, s);
  std::vector<std::string> program = ctx.positional;
  // train or bench: this pipesched, given its process flags.
  const bool is_ours = program[0] == "train" || program[0] == "bench";
  if (is_ours) {
    // What every process would refuse is said once, before any starts (process 0's
    // command line: the others' differ only in --process-rank). This sets the command's
    // flags: launch's own were read above.
    std::vector<std::string> first = program;
    const std::vector<std::string> flags = TrainProcessFlags(total, 0, "launch-check", timeout);
    first.insert(first.begin() + 1, flags.begin(), flags.end());
    if (absl::Status s =
            program[0] == "train" ? CheckTrainCommandLine(first) : CheckBenchCommandLine(first);
        !s.ok()) {
      return ReportError(ctx, s);
    }
    if (absl::Status s = WatchRendezvousDirectory().status(); !s.ok()) return ReportError(ctx, s);
    absl::StatusOr<std::string> self = ThisProgram();
    if (!self.ok()) return ReportError(ctx, self.status());
    program.insert(program.begin(), *self);
  }
  // Node 0 makes the directory (and removes it at the end); the other nodes' processes
  // wait for process 0 to make the rendezvous in it, as hand-started ones do.
  absl::StatusOr<std::string> directory =
      node_rank == 0 ? MakeLaunchDirectory(rendezvous_flag) : Absolute(rendezvous_flag);
  if (!directory.ok()) return ReportError(ctx, directory.status());
  const std::string rendezvous = *directory + "/rendezvous";
  int code = kExitOk;
  {
    Signals signals;
    Launcher launcher(ctx, output == "all", grace, signals.pipe_was_default(), rendezvous,
                      nodes > 1 ? first_rank : -1);
    absl::Status started = absl::OkStatus();
    for (int rank = first_rank; rank < first_rank + processes && started.ok(); ++rank) {
      std::vector<std::string> argv = program;
      if (is_ours) {
        // Right after the command name: before anything of the user's, a "--" included.
        const std::vector<std::string> flags = TrainProcessFlags(total, rank, rendezvous, timeout);
        argv.insert(argv.begin() + 2, flags.begin(), flags.end());
      }
      started = launcher.Start(rank, argv, EnvironmentFor(total, rank, rendezvous, timeout));
    }
    if (started.ok()) {
      code = launcher.Supervise();
    } else {
      launcher.StopAll();
      CommandContext said = ctx;
      std::ostringstream text;
      said.err = &text;
      code = ReportError(said, started);
      launcher.WriteError(text.str());
    }
  }
  // Every process has ended: nobody uses the directory any more (a clean job removed
  // the rendezvous in it; a failed one left it). The launch created it (node 0's).
  // Across hosts, after a failure, the other hosts' processes may not have read the
  // failure yet (on NFS a new file can take seconds to show): the directory stays.
  if (node_rank == 0 && nodes > 1 && code != kExitOk) {
    *ctx.err << "pipesched launch: left " << *directory
             << " for the other hosts' processes: remove it once they have ended\n";
  } else if (node_rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(*directory, ec);
  }
  return code;
}

}  // namespace pipesched::cli
