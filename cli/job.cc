// The job of several processes that train and bench run in (cli/job.h).
#include "cli/job.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/scheduler/registry.h"

ABSL_FLAG(int32_t, processes, 1,
          "processes in the job, each running --replicas replicas of the pipeline on its own "
          "devices; their gradients are averaged over all of them. Start every process with the "
          "same flags but --process-rank");
ABSL_FLAG(int32_t, process_rank, 0, "this process's rank in the job: 0 to --processes - 1");
ABSL_FLAG(std::string, rendezvous, "",
          "with --processes: a directory path that every process can see (one host, or a shared "
          "file system) and that does not exist yet; process 0 creates it and removes it at the "
          "end");
ABSL_FLAG(double, rendezvous_timeout, 300,
          "with --processes or --mpi: seconds a process waits for the others (to start, and in "
          "each exchange) before it fails");
ABSL_FLAG(bool, mpi, false,
          "the job is the processes of MPI_COMM_WORLD, started by mpirun, mpiexec or srun "
          "(`mpirun -n 2 pipesched train --mpi ...`), each running --replicas replicas as with "
          "--processes; needs a pipesched built with MPI");
ABSL_FLAG(bool, split_stages, false,
          "with a job of several processes (--processes, pipesched launch or --mpi): the "
          "processes split the pipeline's ranks in blocks (process q of N runs ranks r with "
          "r x N / P = q, for every replica) instead of each running whole replicas; "
          "activations and gradients cross between them as the job's messages; host backend");
ABSL_FLAG(int32_t, pipeline_processes, 0,
          "with a job of N processes: each pipeline is split across K of them (K divides N), "
          "and the N / K pipelines average their gradients as data-parallel replicas: process q "
          "runs block q / (N / K) of the ranks, in pipeline q mod (N / K); --split-stages is "
          "K = N; K = 1 is whole replicas in each process; host backend");

namespace pipesched::cli {
namespace {

// The size of the job an MPI launcher started this process in, and the variable that
// says it; 0 when none did. Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE, MPICH's and
// Intel MPI's mpiexec (and srun --mpi=pmi2) PMI_SIZE, MVAPICH2's MV2_COMM_WORLD_SIZE;
// srun --mpi=pmix sets no size of PMIx's, so there a PMIX_RANK with Slurm's
// SLURM_STEP_NUM_TASKS (the tasks of this srun, not of the allocation) says it.
std::pair<int, std::string> MpiLauncherSize() {
  const auto size_in = [](const char* variable) {
    int size = 0;
    const char* value = std::getenv(variable);
    return value != nullptr && absl::SimpleAtoi(value, &size) && size > 0 ? size : 0;
  };
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    if (const int size = size_in(variable); size > 0) return {size, variable};
  }
  if (std::getenv("PMIX_RANK") != nullptr) {
    if (const int size = size_in("SLURM_STEP_NUM_TASKS"); size > 0) {
      return {size, "SLURM_STEP_NUM_TASKS"};
    }
  }
  return {0, ""};
}

// "--process-rank" for the first of `flags` (canonical names: process_rank) given, if any.
std::optional<std::string> FirstGiven(const CommandContext& ctx,
                                      std::initializer_list<std::string_view> flags) {
  for (std::string_view flag : flags) {
    if (FlagGiven(ctx, flag)) {
      std::string name = absl::StrCat("--", Absl(flag));
      std::replace(name.begin(), name.end(), '_', '-');
      return name;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<Job> CheckJobFlags(const CommandContext& ctx, std::string_view command) {
  const int processes = absl::GetFlag(FLAGS_processes);
  const int rank = absl::GetFlag(FLAGS_process_rank);
  const std::string dir = absl::GetFlag(FLAGS_rendezvous);
  const double timeout = absl::GetFlag(FLAGS_rendezvous_timeout);
  // "train alone" / "run the sweep alone".
  const std::string_view verb = command == "train" ? "train" : "run the sweep";
  if (absl::GetFlag(FLAGS_mpi)) {
    if (const std::optional<std::string> given =
            FirstGiven(ctx, {"processes", "process_rank", "rendezvous"})) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mpi takes the job from MPI (its processes and their ranks): drop ", *given));
    }
  }
  if (processes < 1 || processes > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--processes=", processes, " is out of range: use 1 to 4096"));
  }
  if (rank < 0 || rank >= processes) {
    return absl::InvalidArgumentError(absl::StrCat("--process-rank=", rank,
                                                   " is out of range for --processes=", processes,
                                                   ": use 0 to ", processes - 1));
  }
  if (!(timeout >= 1) || !std::isfinite(timeout)) {
    return absl::InvalidArgumentError(absl::StrCat("--rendezvous-timeout=", ShortestNumber(timeout),
                                                   " must be at least 1 second"));
  }
  // Started by `pipesched launch -- PROGRAM` (PROGRAM this pipesched, by its path) or a
  // script of such a process: the job is in the environment, as for any launched program.
  const bool from_environment =
      !FlagGiven(ctx, "processes") && std::getenv(comm::kProcessesVariable) != nullptr;
  const bool mpi = absl::GetFlag(FLAGS_mpi);
  if (mpi) {
    if (from_environment) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mpi is given, but this process was started by `pipesched launch` (",
          comm::kProcessesVariable, " is set), which gives the job itself: drop --mpi"));
    }
    if (!comm::MpiBootstrapBuilt()) {
      return absl::InvalidArgumentError(
          "--mpi: this pipesched was built without MPI (CMake found none; on Debian install "
          "libopenmpi-dev and openmpi-bin, then build again), or start the processes with "
          "`pipesched launch`");
    }
  } else if (const auto [size, variable] = MpiLauncherSize();
             size > 1 && processes == 1 && !from_environment) {
    return absl::InvalidArgumentError(
        absl::StrCat("this process is one of ", size, " that an MPI launcher started (", variable,
                     "=", size, "), and each would ", Absl(verb), " alone: give --mpi to ",
                     Absl(verb), " as one job of ", size, " processes"));
  }
  const bool k_given = FlagGiven(ctx, "pipeline_processes");
  const int k = absl::GetFlag(FLAGS_pipeline_processes);
  if (k_given && k < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-processes=", k, " must be at least 1 (processes that split each pipeline)"));
  }
  if (k_given && absl::GetFlag(FLAGS_split_stages)) {
    return absl::InvalidArgumentError(
        "give --split-stages (the job's processes split one pipeline) or --pipeline-processes=K "
        "(pipelines of K processes), not both");
  }
  if (processes == 1 && !from_environment && !mpi) {
    if (absl::GetFlag(FLAGS_split_stages) || (k_given && k > 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::GetFlag(FLAGS_split_stages) ? "--split-stages" : "--pipeline-processes",
          " splits the pipeline across the processes of a job: start them with "
          "`pipesched launch --processes=N -- pipesched ",
          Absl(command),
          " ...`, give each --processes, --process-rank and --rendezvous, or give --mpi under "
          "mpirun"));
    }
    if (const std::optional<std::string> given =
            FirstGiven(ctx, {"process_rank", "rendezvous", "rendezvous_timeout"})) {
      return absl::InvalidArgumentError(absl::StrCat(
          *given,
          " is for a job of several processes: give --processes=N (N > 1) too, or drop it"));
    }
    return Job::kAlone;
  }
  if (from_environment) {
    if (const std::optional<std::string> given =
            FirstGiven(ctx, {"process_rank", "rendezvous", "rendezvous_timeout"})) {
      return absl::InvalidArgumentError(absl::StrCat(
          *given, " is given without --processes while ", comm::kProcessesVariable,
          " is set (this process was started by `pipesched launch`, which gives the job in "
          "the environment): give every process flag, or none"));
    }
  } else if (dir.empty() && !mpi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--processes=", processes,
                     " needs --rendezvous=DIR: a path every process can see and that does not "
                     "exist yet (process 0 creates it), the same for all"));
  }
  // Refused now rather than after the others have joined: one order must run everywhere.
  if (absl::GetFlag(FLAGS_refine)) {
    return absl::InvalidArgumentError(
        "--refine keeps a refined order only where it fits this machine's memory, which may "
        "differ between processes: refine once (`simulate --refine --schedule-json=F.json`) "
        "and give every process --from=F.json");
  }
  if (absl::GetFlag(FLAGS_recompute_stages) == "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute-stages=auto plans for this machine's memory, which may differ between "
        "processes: ",
        command == "train" ? "give the same --recompute-stages list to every process"
                           : "run bench as one process, or train with a --recompute-stages list"));
  }
  // --processes is the job's size here, also in `launch`'s check (under MPI: after
  // joining, PipelineProcesses).
  if (k_given && !from_environment && !mpi && processes % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-processes=", k, " does not divide --processes=", processes,
        ": give a divisor of ", processes, " (the job runs N / K pipelines of K processes)"));
  }
  if ((absl::GetFlag(FLAGS_split_stages) || (k_given && k > 1)) &&
      absl::GetFlag(FLAGS_backend) == "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        k_given ? absl::StrCat("--pipeline-processes=", k) : std::string("--split-stages"),
        " runs on the host backend only (on CUDA the crossings need NCCL send/recv, not "
        "built yet): give --backend=host"));
  }
  if (mpi) return Job::kMpi;
  return from_environment ? Job::kFromEnvironment : Job::kFromFlags;
}

absl::Status CheckOneOrderInJob(std::string_view schedule, int search_steps) {
  const scheduler::ScheduleInfo* info = scheduler::FindSchedule(schedule);
  if (info == nullptr || !info->uses_costs || search_steps == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      Absl(schedule),
      "'s order is searched for the costs each process measures, which differ, and every "
      "process must run one order: give --search-steps=0 (its unit-cost order), or --from a "
      "schedule file (`simulate --schedule-json` writes one)"));
}

absl::StatusOr<bool> WatchRendezvousDirectory() {
  const char* events = std::getenv(kRendezvousEventsVariable);
  if (events == nullptr) return true;
  const std::string_view value = events;
  if (value != "0" && value != "1") {
    return absl::InvalidArgumentError(
        absl::StrCat(kRendezvousEventsVariable, "=", QuoteForMessage(value, 40),
                     " is not 0 or 1: give 1 (the default: a receive is woken when its message "
                     "appears in the rendezvous directory) or 0 (it only looks)"));
  }
  return value == "1";
}

absl::StatusOr<std::unique_ptr<comm::Bootstrap>> JoinJob(Job job, bool judge_heartbeats) {
  if (job == Job::kAlone) return std::unique_ptr<comm::Bootstrap>();
  PS_ASSIGN_OR_RETURN(const bool watch, WatchRendezvousDirectory());
  const comm::BootstrapOptions options = {
      .timeout_seconds = absl::GetFlag(FLAGS_rendezvous_timeout),
      .heartbeat_timeout_seconds =
          judge_heartbeats ? comm::BootstrapOptions{}.heartbeat_timeout_seconds : 0,
      .watch_directory = watch};
  if (job == Job::kFromEnvironment) return comm::CreateBootstrapFromEnvironment(options);
  if (job == Job::kMpi) return comm::CreateMpiBootstrap(options);
  return comm::CreateFileBootstrap(absl::GetFlag(FLAGS_rendezvous),
                                   absl::GetFlag(FLAGS_process_rank),
                                   absl::GetFlag(FLAGS_processes), options);
}

std::string MeetingPlace(const comm::Bootstrap& processes) {
  if (processes.kind() == "mpi") return "MPI";
  std::string dir = absl::GetFlag(FLAGS_rendezvous);
  if (const char* env = std::getenv(comm::kRendezvousVariable); dir.empty() && env != nullptr) {
    dir = env;
  }
  return absl::StrCat("rendezvous ", dir);
}

absl::StatusOr<int> PipelineProcesses(const comm::Bootstrap& processes) {
  const int n = processes.size();
  const int k = absl::GetFlag(FLAGS_pipeline_processes);
  if (k == 0) return absl::GetFlag(FLAGS_split_stages) ? n : 1;
  if (n % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-processes=", k, " does not divide the job's ", n,
        " processes: give a divisor of ", n, " (the job runs N / K pipelines of K processes)"));
  }
  return k;
}

absl::StatusOr<JobPlace> PlaceInJob(comm::Bootstrap& job) {
  JobPlace place;
  PS_ASSIGN_OR_RETURN(place.k, PipelineProcesses(job));
  if (place.k == 1) {
    place.processes = &job;
  } else if (place.k == job.size()) {
    place.pipeline = &job;
  } else {
    PS_ASSIGN_OR_RETURN(place.grid, comm::SplitJob(job, place.k));
    place.pipeline = place.grid.pipeline.get();
    place.processes = place.grid.replicas.get();
  }
  return place;
}

absl::StatusOr<std::optional<CommandContext>> ParseLaunchedCommand(
    const std::vector<std::string>& command, std::string_view name, std::ostream* ignored) {
  const Command* program = nullptr;
  for (const Command& c : AllCommands()) {
    if (!command.empty() && c.name == command[0] && c.name == name) program = &c;
  }
  if (program == nullptr || (name != "train" && name != "bench")) {
    return absl::InternalError(
        absl::StrCat("ParseLaunchedCommand takes a ", Absl(name), " command line"));
  }
  // `-- train --help`: each process prints the command's help (process 0's is shown).
  for (std::size_t i = 1; i < command.size() && command[i] != "--"; ++i) {
    if (command[i] == "--help" || command[i] == "-h") return std::nullopt;
  }
  std::vector<std::string> args = {"pipesched"};
  args.insert(args.end(), command.begin(), command.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  PS_ASSIGN_OR_RETURN(const ParsedArgs parsed,
                      ParseFlags(static_cast<int>(argv.size()), argv.data(), program->flags));
  CommandContext ctx{.positional = parsed.positional,
                     .flags_set = parsed.flags_set,
                     .out = ignored,
                     .err = ignored};
  if (!ctx.positional.empty()) {
    return UnexpectedArgument(ctx.positional[0], absl::StrCat(Absl(name), " takes only --flags"));
  }
  if (absl::GetFlag(FLAGS_mpi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mpi is for processes that an MPI launcher starts (`mpirun -n N pipesched ", Absl(name),
        " --mpi ...`); `pipesched launch` gives its processes their job itself: drop --mpi"));
  }
  return ctx;
}

absl::Status CheckSameFlags(comm::Bootstrap& job, std::string_view command,
                            std::initializer_list<std::string_view> local, std::string_view extra) {
  const Command* program = nullptr;
  for (const Command& c : AllCommands()) {
    if (c.name == command) program = &c;
  }
  if (program == nullptr) return absl::InternalError(absl::StrCat("no command ", Absl(command)));
  // A line per flag, "--name=value", as the user would write it; then `extra`.
  std::string ours;
  for (std::string_view entry : program->flags) {
    const std::size_t eq = entry.find('=');
    const std::string_view name = entry.substr(0, eq);
    const std::string_view registered = eq == std::string_view::npos ? entry : entry.substr(eq + 1);
    if (std::find(local.begin(), local.end(), name) != local.end()) continue;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(Absl(registered));
    if (flag == nullptr) return absl::InternalError(absl::StrCat("no flag ", Absl(registered)));
    std::string shown = absl::StrCat("--", Absl(name));
    std::replace(shown.begin(), shown.end(), '_', '-');
    absl::StrAppend(&ours, shown, "=", flag->CurrentValue(), "\n");
  }
  absl::StrAppend(&ours, Absl(extra));
  return comm::CheckSameFields(
      job, absl::StrCat(Absl(command), "-flags"), ours,
      absl::StrCat("every process of a ", Absl(command),
                   " job needs the same flags (but its rank and outputs, which process 0 "
                   "writes)"));
}

bool IsProcessesOwnDescriptor(const std::string& path) {
  return path == "/dev/stdin" || path == "/dev/stdout" || path == "/dev/stderr" ||
         path == "/dev/tty" || path.rfind("/dev/fd/", 0) == 0 ||
         path.rfind("/proc/self/", 0) == 0 || path.rfind("/proc/thread-self/", 0) == 0;
}

absl::Status CheckLaunchInputs(const std::vector<FlagPath>& inputs) {
  for (const auto& [flag, path] : inputs) {
    if (path.empty() || IsProcessesOwnDescriptor(path)) continue;
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(path, error);
    if (error && error != std::errc::no_such_file_or_directory) {  // a directory not searchable
      return absl::InvalidArgumentError(absl::StrCat(Absl(flag), "=", path, ": ", error.message(),
                                                     "; give a file that every process can read"));
    }
    if (!std::filesystem::exists(status)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Absl(flag), "=", path,
                       ": no such file; give the path of one that every process can read"));
    }
    if (std::filesystem::is_regular_file(status) && ::access(path.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(Absl(flag), "=", path, ": ",
                                                     std::strerror(errno),
                                                     "; give a file that every process can read"));
    }
  }
  return absl::OkStatus();
}

CommandContext ContextInJob(const CommandContext& ctx, const comm::Bootstrap* job,
                            std::ostream* silent) {
  CommandContext in_job = ctx;
  if (job != nullptr && job->kind() == "mpi") {
    in_job.out_is_terminal = false;
    if (job->rank() != 0) in_job.out = silent;
  }
  return in_job;
}

absl::Status LeaveJob(comm::Bootstrap* job, absl::Status status) {
  if (job == nullptr) return status;
  if (status.ok()) status = job->Close();  // process 0 removes the rendezvous directory
  // The others stop now, with this reason (also when the close itself failed: some may
  // still wait in it).
  if (!status.ok()) job->Fail(Std(status.message()));
  return status;
}

}  // namespace pipesched::cli
