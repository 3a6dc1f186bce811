// Bootstrap: how the processes of one job find each other before any communicator
// exists. Ranks exchange small byte strings: an NCCL unique id (ncclCommInitRank), a
// configuration to check for agreement, or, for the host backend's emulation of a
// collective across processes, the buffers themselves (comm/all_reduce.h).
//
// Kinds (DESIGN.md, "Distributed scale"):
//   in-process: the ranks are threads of one process (tests; an embedder that runs ranks
//               as threads);
//   file:       a directory every rank can see (one host, or a shared file system);
//               rank 0 creates it, and removes it when every rank has closed;
//   MPI:        the processes of MPI_COMM_WORLD (started by mpirun, mpiexec or srun);
//               built when CMake finds MPI (Debian: libopenmpi-dev), see
//               CreateMpiBootstrap.
//
// The contract of AllGather is the one collectives have: every rank calls it with the
// same channel the same number of times, and the k-th call on a channel returns what
// each rank gave to its k-th call on that channel. Channels are independent, so threads
// may exchange on different channels at once (one all-reduce per pipeline stage, each on
// its own comm stream); calls on one channel must not overlap within one rank. A call
// blocks until every rank has made it, so one thread's calls on several channels must
// come in the same order on every rank.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipesched::comm {

struct BootstrapOptions {
  // How long one exchange waits for the other ranks before failing with
  // DeadlineExceeded naming the ranks that have not arrived (a rank that failed, or was
  // never started). 0 (or past 1e9 s) = until Abort(); negative or NaN: every factory
  // refuses it (InvalidArgument).
  double timeout_seconds = 300;
  // File kind (the MPI kind beats by messages instead: CreateMpiBootstrap): the heartbeat. From the
  // start of its first exchange until its close exchange is done, each rank rewrites
  // DIR/beat.<rank> every second (a thread of its own); a rank whose beat this rank has watched
  // stand still for this long (while waiting on the others, by its own clock) ends the waits with
  // Aborted "process <r> (pid <p> on <host>) has shown no sign of life for <t> s ...". That finds
  // what cannot say it died: its host down or cut off from the directory, or the process stopped
  // (SIGSTOP, a debugger). A rank of this host that ended is found at once anyway (its
  // alive file's lock); a rank that came to the close exchange is not judged. At least 2;
  // the ranks are read 16 at a time, so with N ranks the silence judged is at least
  // 2 x (1 + ceil((N-1)/16) x 0.25) s: 10 s up to 257 ranks, 18 s at 512, 34 s at 1024,
  // 130 s at 4096. 0 = not judged (the beats are still written).
  double heartbeat_timeout_seconds = 10;
  // File kind: whether a point-to-point Receive is also woken when its message's file (or
  // the failure marker) appears in the directory (inotify on Linux), so that a message
  // written on this host is read when it is linked, not at the wait's next look (up to
  // 1 ms in its first second, then up to 20 ms); exchanges only look. The looks go on
  // either way (a shared file system's other hosts raise no event); false: looks only, for
  // a file system whose events misbehave, or to measure what the events save. Costs one
  // inotify instance (a per-user limit), 2 descriptors and a thread; without them, looks.
  bool watch_directory = true;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual std::string_view kind() const = 0;  // "in-process", "file", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The rank in the whole job of this bootstrap's rank `rank`, for messages that name a
  // process: `rank` itself, except in a group of the job's processes
  // (CreateGroupBootstrap), whose rank i is the job's rank of its i-th member.
  virtual int job_rank(int rank) const { return rank; }

  // What each rank gave, indexed by rank (this rank's own bytes included). `channel`:
  // 1 to 64 characters of [A-Za-z0-9_-] (InvalidArgument otherwise). DeadlineExceeded
  // after BootstrapOptions::timeout_seconds, naming the missing ranks; Cancelled once
  // Abort() was called; InvalidArgument for a call after Close().
  virtual absl::StatusOr<std::vector<std::string>> AllGather(std::string_view channel,
                                                             std::string_view bytes) = 0;

  // Point to point, for what only two processes share (the activations one pipeline
  // stage hands the next when the two are in different processes). Send queues `bytes`
  // for rank `to` on `channel` and returns without waiting for the receiver (the bytes
  // are copied; nothing bounds how many sends wait to be received). Receive blocks until
  // the next message from rank `from` on `channel` is there and returns it: the k-th
  // Receive(from, channel) on rank t returns the k-th Send(t, channel) of rank `from`.
  // Messages are matched by (sender, receiver, channel), so a pair's channels are
  // independent of each other, of other pairs and of AllGather's channels (a channel
  // name may serve both). Calls on one (peer, channel) must not overlap within a rank;
  // others may, from any thread. Both are InvalidArgument for a channel AllGather
  // refuses, a peer outside [0, size()) or this rank itself, and after Close(); Cancelled
  // once Abort() was called and Aborted once the job failed (Failure()). Receive also
  // fails as an exchange does when its peer is silent: DeadlineExceeded after
  // BootstrapOptions::timeout_seconds naming the channel, the message number and `from`,
  // and Aborted once `from` has ended or is judged gone by its heartbeat. A message
  // that was sent but not received by Close() is dropped. Sizes: as AllGather's.
  virtual absl::Status Send(int to, std::string_view channel, std::string_view bytes) = 0;
  virtual absl::StatusOr<std::string> Receive(int from, std::string_view channel) = 0;

  // For a watchdog that gave up: this rank's exchanges waiting now, and its every later
  // call, fail with Cancelled (the other ranks are not told: Fail() does that).
  // Thread-safe; returns at once.
  virtual void Abort() = 0;

  // OK, or Aborted "process <rank> failed: <reason>" once a rank has called Fail(); the
  // file kind also Aborted "process <rank> (pid <pid>) ended without leaving the job
  // ..." once a rank's process on this host has ended without Close() (its alive file's
  // lock, see CreateFileBootstrap), and "process <rank> (pid <pid> on <host>) has shown
  // no sign of life ..." once its heartbeat has stood still for
  // BootstrapOptions::heartbeat_timeout_seconds. For a watchdog that does not exchange
  // (an NCCL collective waiting for a failed peer); every exchange checks it while it
  // waits. Non-blocking (file: a stat; every 50 ms an open and a flock, and every 0.25 s
  // an open and a read, for each of up to 16 ranks); thread-safe.
  virtual absl::Status Failure() = 0;

  // For a rank that fails: tells the others, whose exchanges (waiting now or later) fail
  // with Aborted "process <rank> failed: <reason>" instead of waiting for their timeout.
  // The first rank to fail is the one named. Best effort; returns at once. The file
  // kind leaves its directory behind (the others may not have read the marker yet):
  // remove it before the next run.
  virtual void Fail(std::string_view reason) = 0;

  // Leaves the job once every rank's exchanges are over: a barrier, then each rank's
  // files are removed (file: rank 0 removes the directory once every rank has left).
  // Every rank calls it once, with no exchange in flight. Without it (a failed or
  // killed run) the file kind leaves its directory behind, and the next run's rank 0
  // refuses it.
  virtual absl::Status Close() = 0;
};

// `root`'s bytes on every rank (AllGather; every rank passes its own, which only the
// root's are taken from). InvalidArgument for a root outside [0, size).
absl::StatusOr<std::string> Broadcast(Bootstrap& bootstrap, std::string_view channel,
                                      std::string_view bytes, int root);

// Returns once every rank has called it on `channel` (AllGather of nothing).
absl::Status Barrier(Bootstrap& bootstrap, std::string_view channel);

// Every rank's `bytes` agree, or FailedPrecondition naming the first rank whose differ
// from rank 0's, and `what` ("the configuration") with both values when they are short
// printable text: "process 2's configuration differs from process 0's (...)" (the
// processes named by their job_rank). For checking that every process was started with the same
// flags.
absl::Status CheckAgreement(Bootstrap& bootstrap, std::string_view channel, std::string_view what,
                            std::string_view bytes);

// The same for a configuration of fields, one per line ("seed=5"): every rank's `fields`
// equal rank 0's, or FailedPrecondition naming the first rank whose differ, with its
// first differing line and rank 0's: `process 1 was started with "seed=5", process 0
// with "seed=0": <advice>`.
absl::Status CheckSameFields(Bootstrap& bootstrap, std::string_view channel,
                             std::string_view fields, std::string_view advice);

// Some of a job's processes as a job of their own, for collectives among them only: the
// processes that hold one pipeline's stages, or the replicas of one stage
// (SplitJob). Every member calls it with the same `members` (ranks of `job`, in the
// group's rank order: members[i] is the group's rank i) and the same `name` (1 to 16
// letters and digits, different for any two groups that share two members); `job` must
// outlive it. Its AllGather and Send/Receive are `job`'s point-to-point messages between
// the members, on channels of the group's own ("<name>_..."), so groups exchange
// independently of each other and of `job`'s own collectives, with `job`'s timeouts and
// failure detection (each Receive waits up to `job`'s timeout, so an AllGather of n
// members whose parts come late one after another may wait up to n - 1 timeouts; a
// timeout's message names the group and its channel; the job's
// own point-to-point channels must not begin with a group's name and '_'); a part of its
// AllGather is 8 bytes smaller than `job`'s. A member
// given the same name but other members (or another order) makes the first AllGather
// fail with FailedPrecondition naming the process when the members' lists include each
// other; otherwise (another name, or lists that do not meet) they exchange on other
// channels or with other processes, and wait until `job`'s timeout. Abort, Failure and Fail are
// `job`'s (a failure is the whole job's); Close is a barrier of the members that leaves `job` open
// (`job` is closed by its owner, after its groups). kind() is `job`'s. InvalidArgument for a bad
// name, no members, a member outside [0, job.size()) or given twice, and when this process
// (job.rank()) is not a member.
absl::StatusOr<std::unique_ptr<Bootstrap>> CreateGroupBootstrap(Bootstrap& job,
                                                                std::vector<int> members,
                                                                std::string_view name);

// The two groups of a job whose N processes split each pipeline across K of them
// (2-D parallelism: N / K data-parallel replicas of a pipeline split K ways).
struct JobGrid {
  // The K processes that hold this process's pipeline between them, in pipeline order
  // (its rank k runs the k-th block of pipeline ranks): ExecutorOptions::pipeline.
  std::unique_ptr<Bootstrap> pipeline;
  // The N / K processes that hold the same stages as this one, one per pipeline, which
  // average their gradients: ExecutorOptions::processes.
  std::unique_ptr<Bootstrap> replicas;
};

// Process q of N runs block q / (N / K) of every pipeline, in replica group q mod (N / K):
// the replicas of a block are consecutive processes, so with processes numbered host by
// host the gradients' all-reduce stays on a host and the pipeline's smaller messages
// cross between hosts (Megatron-LM orders its ranks so too). K = 1: each process holds
// whole pipelines (`pipeline` is a group of one); K = N: one pipeline (`replicas` is a
// group of one). InvalidArgument unless K >= 1 divides N. Creates groups only (no
// exchange); every process of `job` calls it with the same K. The groups' names are
// fixed by K and the process's place ("pipe<K>x<g>", "repl<K>x<b>"): two grids of one K
// alive at once on one job would share channels, so make one per K (grids of different
// K do not meet).
absl::StatusOr<JobGrid> SplitJob(Bootstrap& job, int pipeline_processes);

// Each process's own verdict on something it checked alone (`own`: OK, or why it cannot go
// on, e.g. its memory) heard by every process of the groups given: an AllGather on
// `channel` in each group of several members in turn (null ones and groups of one are
// passed over), each passing on what the one before found -- with a job's two groups
// (SplitJob's pipeline and replicas) every process hears every other. Returns OK when
// every process passed; else the failure of the first process that failed (in the first
// group's order, then the next's), with its code, the same in every process, in its
// words where it is its own and "process <job rank>: <message>" in the others'; that
// status carries HeardByAll. Nobody else waits on a process that returns it, so the job
// need not fail (Bootstrap::Fail): every process can go on to the next configuration
// together. Every process of the groups calls it at the same point. A failed exchange
// returns its own error (not HeardByAll). With no group of several: `own`, unmarked.
absl::Status AgreeOnVerdict(const std::vector<Bootstrap*>& groups, std::string_view channel,
                            absl::Status own);

// Whether `status` is an AgreeOnVerdict failure that every process of its groups returned.
bool HeardByAll(const absl::Status& status);

// `size` bootstraps linked in memory; element r is rank r. InvalidArgument for size < 1.
absl::StatusOr<std::vector<std::unique_ptr<Bootstrap>>> CreateInProcessBootstraps(
    int size, const BootstrapOptions& options = {});

// Rank `rank` of `size` meeting in directory `dir`. Rank 0 creates `dir` (its parent
// must exist) and refuses one that exists already: "... exists (an earlier run that did
// not close left it, or another job uses it?): remove it, or give every run a new path"
// (it never touches a directory it did not create: it may be a live job's). A rank
// started before rank 0 that finds an earlier run's directory joins it and fails at its
// first exchange (its own earlier file is there), or at the earlier run's failure marker
// (the message says how old it is), or at a rank of that run that ended without closing,
// or waits out the timeout: never a silent mix-up that finishes. The other ranks wait
// for rank 0 (up to the timeout) and check that it was started with the same size. A
// second process with the same rank started at the same moment (both pass the liveness
// look below) is refused by the first exchange. Rank or size out of range:
// InvalidArgument. Returns once rank 0's directory is there; the first AllGather is
// where every rank meets.
// Liveness: each rank holds a flock on DIR/alive.<rank> from joining until Close() (the
// kernel drops it however the process ends), so the others' waits end at once with
// Aborted naming a rank on this host that was killed, crashed or exited without Close(),
// instead of at the timeout (Failure()); a second live process with the same rank is
// refused here (FailedPrecondition "another live process is rank ..."). A rank on
// another host (a shared file system may keep locks per machine), or any on a file
// system without flock, is found dead by its heartbeat instead
// (BootstrapOptions::heartbeat_timeout_seconds, 10 s by default). InvalidArgument for a
// heartbeat timeout that is negative, not finite, or above 0 but under 2 s.
absl::StatusOr<std::unique_ptr<Bootstrap>> CreateFileBootstrap(
    const std::string& dir, int rank, int size, const BootstrapOptions& options = {});

// Whether this pipesched was built with MPI (CreateMpiBootstrap works).
bool MpiBootstrapBuilt();

// This process as its rank of MPI_COMM_WORLD, the job being all of its processes.
//
// MPI is initialized here (MPI_Init_thread, MPI_THREAD_MULTIPLE) unless the embedder has
// done so, and then finalized at exit. An embedder that initializes MPI itself must ask
// for MPI_THREAD_MULTIPLE (the bootstrap's own thread makes its MPI calls, on a duplicate
// of MPI_COMM_WORLD, so they never meet the embedder's messages) and must destroy every
// bootstrap before MPI_Finalize. Blocks until every process has called it (MPI_Comm_dup
// is collective): a process that exits first ends the job by the MPI launcher's rule.
//
// Exchanges keep the contract above with `options.timeout_seconds`. One part is at most
// 2147483573 bytes (MPI counts in int, and a message has a header): AllGather refuses
// more with InvalidArgument, and the channel goes on as if it had not been asked.
//
// A process that exits or is killed is the MPI launcher's to find (it ends the job); one
// that is stopped or cut off is found by its heartbeat: each bootstrap's thread sends
// every other rank a message each second, and a rank that an exchange (or Failure()) has
// heard nothing from for options.heartbeat_timeout_seconds ends it with Aborted "process
// <r> has shown no sign of life for <t> s ..." (0 = not judged; not after Close() has
// begun). After a failure (Fail, a failure heard, Abort, a timeout, an MPI error) the
// MPI_Finalize at exit is waited for 10 s at most: a stopped process never comes to it.
//
// InvalidArgument for a heartbeat timeout that CreateFileBootstrap refuses too;
// FailedPrecondition when built without MPI ("... built without MPI ..."), when MPI
// cannot give MPI_THREAD_MULTIPLE, or when it was finalized already; Internal for an MPI
// call that fails, with MPI's words.
absl::StatusOr<std::unique_ptr<Bootstrap>> CreateMpiBootstrap(const BootstrapOptions& options = {});

// For a launcher whose process `rank` of the job meeting in `dir` (a file bootstrap's
// directory) ended without a word, killed or crashed: marks the job failed as that rank's
// Fail(reason) would, so that the other processes, on this host or on others, stop at
// once with "process <rank> failed: <reason>". OK, doing nothing, when `dir` holds no job
// (yet, or any more), when `rank` has left the job (Close() wrote its gone file: a
// failure after that is not the job's), or when the job is marked failed already (the
// first marker stays).
absl::Status MarkFileBootstrapFailed(const std::string& dir, int rank, std::string_view reason);

// The environment `pipesched launch` gives each process it starts (docs/training.md):
// the job's size, this process's rank, the rendezvous directory and the seconds an
// exchange waits (BootstrapOptions::timeout_seconds).
inline constexpr char kProcessesVariable[] = "PIPESCHED_PROCESSES";
inline constexpr char kProcessRankVariable[] = "PIPESCHED_PROCESS_RANK";
inline constexpr char kRendezvousVariable[] = "PIPESCHED_RENDEZVOUS";
inline constexpr char kRendezvousTimeoutVariable[] = "PIPESCHED_RENDEZVOUS_TIMEOUT";

// The file bootstrap those variables describe, for a program started by `pipesched
// launch`: null (OK) when PIPESCHED_PROCESSES is not set (a process on its own); else
// CreateFileBootstrap(PIPESCHED_RENDEZVOUS, PIPESCHED_PROCESS_RANK, PIPESCHED_PROCESSES)
// with PIPESCHED_RENDEZVOUS_TIMEOUT, when set, for `options.timeout_seconds` (seconds, 1
// or more, as launch's flag: not 0, which would wait for ever). A missing or malformed
// variable is InvalidArgument naming it and its value: the numbers are decimal (digits
// only for the size, 1 to 4096 as launch's --processes, and the rank; no spaces, signs or
// hexadecimal).
absl::StatusOr<std::unique_ptr<Bootstrap>> CreateBootstrapFromEnvironment(
    const BootstrapOptions& options = {});

}  // namespace pipesched::comm
