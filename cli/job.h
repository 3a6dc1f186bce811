// Jobs of several processes, for `pipesched train` and `pipesched bench`: the flags that
// say how a process learns its job (--processes, --process-rank, --rendezvous,
// --rendezvous-timeout, --mpi, or the environment `pipesched launch` gives) and how its
// processes share the pipelines (--split-stages, --pipeline-processes); their checks,
// joining the job, and this process's groups of it (docs/training.md, *Processes*).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/command.h"
#include "pipesched/base/file_util.h"
#include "pipesched/comm/bootstrap.h"

ABSL_DECLARE_FLAG(int32_t, processes);
ABSL_DECLARE_FLAG(int32_t, process_rank);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(double, rendezvous_timeout);
ABSL_DECLARE_FLAG(bool, mpi);
ABSL_DECLARE_FLAG(bool, split_stages);
ABSL_DECLARE_FLAG(int32_t, pipeline_processes);

namespace pipesched::cli {

// How this process learns its job.
enum class Job { kAlone, kFromFlags, kFromEnvironment, kMpi };

// The checks of the job's flags for `command` ("train" or "bench", which the messages
// name), without joining: the process flags' ranges and combinations, an MPI launcher's
// processes started without --mpi, --split-stages / --pipeline-processes outside a job
// or on CUDA, and what would make the processes run different orders or plans (--refine,
// --recompute-stages=auto). K dividing N is checked here when N is known (not under MPI:
// PipelineProcesses, after joining). The command's own checks of its P come after.
absl::StatusOr<Job> CheckJobFlags(const CommandContext& ctx, std::string_view command);

// For a process of a job about to run the generator `schedule` (its name): InvalidArgument
// when that order is searched for the costs this process measures (ScheduleInfo::
// uses_costs, with `search_steps` > 0), which differ between processes; OK otherwise.
absl::Status CheckOneOrderInJob(std::string_view schedule, int search_steps);

// Environment: 0 turns off the file bootstrap's waking on the rendezvous directory's
// events (comm::BootstrapOptions::watch_directory); 1, the default, leaves it on. Read
// by train and bench in a job (and checked by launch before it starts them).
inline constexpr char kRendezvousEventsVariable[] = "PIPESCHED_RENDEZVOUS_EVENTS";

// kRendezvousEventsVariable's value: true unless it says 0; InvalidArgument unless it
// is unset, 0 or 1.
absl::StatusOr<bool> WatchRendezvousDirectory();

// Joins the job (null for kAlone): created first, so that this process's later errors
// reach the others (Bootstrap::Fail) instead of leaving them to wait. With
// `judge_heartbeats` false (train's --step-timeout=0: a debugger, say) no process is
// judged gone by its heartbeat. InvalidArgument for kRendezvousEventsVariable set to
// other than 0 or 1.
absl::StatusOr<std::unique_ptr<comm::Bootstrap>> JoinJob(Job job, bool judge_heartbeats);

// Where the processes meet: "rendezvous DIR" (--rendezvous, or the launch's
// environment), or "MPI".
std::string MeetingPlace(const comm::Bootstrap& processes);

// How many processes split each pipeline: --pipeline-processes, else all of them with
// --split-stages, else 1 (each holds whole replicas). InvalidArgument when it does not
// divide the job (an MPI job's size is known only here).
absl::StatusOr<int> PipelineProcesses(const comm::Bootstrap& processes);

// This process's place in the job: the groups TrainerConfig::pipeline and ::processes
// take. K = 1: processes = the job; K = N: pipeline = the job; between: the groups of
// comm::SplitJob, owned here.
struct JobPlace {
  int k = 1;  // processes per pipeline
  comm::Bootstrap* pipeline = nullptr;
  comm::Bootstrap* processes = nullptr;
  comm::JobGrid grid;
};
absl::StatusOr<JobPlace> PlaceInJob(comm::Bootstrap& job);

// The context a process of `job` prints with: under MPI every process's standard output
// reaches one place through the launcher, so process 0 speaks for the job (as `pipesched
// launch` shows it by default) and the others print their errors only (to `silent`), a
// line at a time (Open MPI gives each process a terminal of its own). Unchanged
// otherwise.
CommandContext ContextInJob(const CommandContext& ctx, const comm::Bootstrap* job,
                            std::ostream* silent);

// For `pipesched launch -- train ...` or `-- bench ...`, whose checks the launcher makes
// once before starting the processes: `command` (`name`, "train" or "bench", and its
// flags, with the process flags launch adds; Internal for another) parsed into the program's flags,
// which it leaves so (absl::FlagSaver's restore logs every flag it restores: the caller reads its
// own flags first), and the context to check them with (its output goes nowhere); nullopt for
// --help, which each process prints. Refuses arguments that are not flags, and --mpi.
absl::StatusOr<std::optional<CommandContext>> ParseLaunchedCommand(
    const std::vector<std::string>& command, std::string_view name, std::ostream* ignored);

// Every process of `job` was started with the same values of `command`'s flags, but for
// those in `local` (canonical names: process_rank), and the same `extra` (what the flags
// name: a file's content); FailedPrecondition naming the first that differs, and both
// values, otherwise. An exchange of every process (channel "<command>-flags").
absl::Status CheckSameFlags(comm::Bootstrap& job, std::string_view command,
                            std::initializer_list<std::string_view> local, std::string_view extra);

// A path that names a process's own descriptors or terminal (/dev/stdout, /dev/fd/N,
// /proc/self/fd/N, /dev/tty): the launcher's are not the processes' it starts.
bool IsProcessesOwnDescriptor(const std::string& path);

// The launcher's check of the files the processes will read (`inputs`, empty paths
// skipped, and the processes' own descriptors): each is there and readable, or
// InvalidArgument "--data=F: no such file; give the path of one that every process can
// read". What is in them, each process reads and checks.
absl::Status CheckLaunchInputs(const std::vector<FlagPath>& inputs);

// Leaves the job at the end of a run whose outcome is `status`: Close when it is OK
// (process 0 removes the rendezvous directory), and Fail with the reason when it, or the
// close, failed, so that the others stop with it. Returns the outcome.
absl::Status LeaveJob(comm::Bootstrap* job, absl::Status status);

}  // namespace pipesched::cli
