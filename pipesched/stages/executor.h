// Executor: runs one training step of any valid Schedule over D replicas of a pipeline
// of P ranks (x V chunks), issuing all of it asynchronously from one host thread.
//
// Layout. Replica d, pipeline rank r runs on device (d * P + r) mod device_count: one
// device each when the backend has P x D devices, shared round-robin otherwise. Each
// (replica, rank) has its own four streams on its device:
//   compute  every F/B/I/W of the rank's stages, in the rank's program order; the
//            activation stash and boundary buffers of a micro-batch are allocated here
//            at its F (its input buffer one compute action earlier, see Memory) and
//            freed after its last backward (stream-ordered): stash and input here, a
//            boundary buffer of a stage > 0 on the send stream behind the gradient copy
//            that reads it, so compute never waits for an outgoing copy;
//            A stage next to another on the same rank (zb-v's bottom of the V, P = 1)
//            exchanges activations and gradients with it on this stream, in order;
//   recv     pulls each stage's input activation from the previous stage (RECV_F) into
//            the micro-batch's input buffer, as soon as the producer's F is done and the
//            buffer exists: during the rank's previous action, not after it;
//   send     pushes each stage's input gradient to the previous stage (SEND_B);
//   comm     the stage's data-parallel all-reduce (ALLREDUCE), placed by
//            scheduler::PlaceAllReduce right after the stage's last backward.
// Streams synchronise only through events; the host walks the schedule in a
// topological order in which every event is recorded before anything waits on it, and
// blocks only at the end of the step (one Synchronize per stream).
//
// Memory. Per (stage, micro-batch) the executor allocates, at F, one boundary buffer
// (output, received output-gradient, input-gradient: whichever the stage has) and the
// StageWork's stash; for a stage > 0 the received input is a buffer of its own,
// allocated when the compute action before the F on the same rank is issued (at the F
// when it is the rank's first), so that the receive overlaps that action -- double
// buffering, which keeps a hand-off off the critical path whenever the producer is
// ahead. All are freed after the last backward (B, or W when split).
// activation_bytes(stage) = input + boundary + stash bytes is exactly what one in-flight
// micro-batch holds, input_bytes(stage) the part that comes one action early; with
// workspace_bytes(stage), the scratch one B or I holds while it runs, the simulator
// predicts the runtime's peak: GPipe holds M micro-batches, 1F1B holds P - r on rank r,
// plus one backward's workspace and the next F's input.
//
// Measured timeline: every action (and transfer, and all-reduce) is bracketed by timing
// events; Step returns a trace::Timeline with time_unit "us", one row per
// (replica, rank) (row = replica * P + rank, num_ranks = P x D, so rows 0..P-1 are
// replica 0 and line up with the simulator's ranks; with D > 1 ranks_per_replica = P, so
// that the exporters name rows "replica d rank r"), lanes trace::kComputeLane (F, B,
// I, W), kSendLane (SEND_B), kRecvLane (RECV_F), kCommLane (ALLREDUCE).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/comm/transport.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/stages/stage_work.h"
#include "pipesched/trace/timeline.h"

namespace pipesched::stages {

struct ExecutorOptions {
  int num_replicas = 1;  // D
  // The runtime counts an allocation when Allocate is called but a stream-ordered free
  // only when its stream reaches it; a host thread that runs ahead of the devices thus
  // makes memory_stats() over-count. When true the host waits, before issuing work on a
  // device, until the frees already issued there have run, so that the measured peak
  // follows stream order exactly (and equals the simulator's). Slower: for measuring
  // memory, not for training speed.
  bool exact_memory_accounting = false;
  // Hang watchdog: a step in which no action (nor a stream's end of step) completes for
  // this long is aborted with DeadlineExceeded naming, per rank, the action it is blocked
  // on and the event or transfer that action waits for; its streams and all-reducers are
  // aborted (runtime::Stream::Abort, comm::AllReducer::Abort) and the Executor is unusable
  // afterwards. 0 = wait forever. Also bounds the host all-reduce's rendezvous. With
  // `pipeline`, a stall while this process only waits for another's message (a receive
  // begun, and none of its own actions started and unfinished) is not counted: that
  // process's watchdog, its Fail, or the bootstrap's timeout and heartbeat end it.
  double step_timeout_seconds = 60;
  // What gives a device more memory, in the caller's words, for the refusal of a step
  // buffer that does not fit ("give <it>, or fewer micro-batches"; e.g. "a larger
  // --device-memory"). Empty: "the device more memory".
  std::string more_memory;
  // Data parallelism across processes (comm/bootstrap.h), not owned; it must outlive the
  // Executor. Every process runs the same schedule with the same num_replicas, and the
  // stages' gradients are averaged over num_replicas x processes->size() replicas
  // (comm::AllReducerOptions::processes: process q's replica d is replica
  // q * num_replicas + d). Each stage's all-reduce uses bootstrap channel "stage-<s>".
  // null: this process holds every replica.
  comm::Bootstrap* processes = nullptr;
  // A pipeline whose ranks live in different processes (host backend), not owned; it
  // must outlive the Executor. Its K = pipeline->size() processes split the P pipeline
  // ranks into contiguous blocks: rank r runs in process r * K / P (K <= P), with its
  // streams, stages and the num_replicas local replicas of them; each process creates
  // an Executor with the same schedule and options, and makes the StageWork of its own
  // stages only. Activations and gradients that cross from one process to the next go
  // by Bootstrap::Send / Receive on the channels "f-<stage>-<replica>-<mb>" (the
  // activation into `stage`) and "b-<stage>-<replica>-<mb>" (the gradient out of it),
  // run by host functions on the send and recv streams: SEND_F and RECV_B spans in the
  // timeline, beside the RECV_F and SEND_B of the receiving and sending stage. Create
  // exchanges every stage's sizes ("executor-stages") and checks that the processes run
  // the same schedule ("executor-schedule"), then measures each process's steady clock
  // against process 0's (the pipeline's rank 0: in a two-dimensional job, the
  // first process of this pipeline; the quickest of 8 round trips of messages on
  // "executor-clock"; 0 for a process on process 0's host, by their boot ids, whose
  // steady clocks are one). Each Step ends with an exchange of every process's rows
  // ("executor-step"), so that every process returns the whole StepResult: the loss, and
  // every row's spans, issue times, phases, peak bytes and device (numbered process by
  // process, so not as one process would number them), on process 0's clock: exactly on
  // one host, to within half a round trip across hosts, plus the clocks' drift since
  // Create (parts per million). "One host" is one boot id; containers in time namespaces
  // share a boot id but not CLOCK_MONOTONIC: set PIPESCHED_MEASURE_CLOCK_OFFSET=1 there. A
  // crossing's RECV_F and RECV_B spans start no earlier than the matching SEND_F or SEND_B (a
  // receive posted early waits for the message, which is not transfer time). A step that fails
  // calls pipeline->Fail, so that the other processes stop too. With `processes` too, the
  // job is two-dimensional (comm::SplitJob makes both bootstraps, as groups of one job's
  // processes): `pipeline` holds the processes that split this pipeline, `processes` those
  // that run the same ranks in the other pipelines, and each stage's gradients are averaged
  // over every pipeline's replicas of it; Create checks ("executor-grid", over
  // `processes`) that the replicas of a block hold the same block. Not on CUDA (whose host
  // functions must not block: NCCL send/recv will carry it there): FailedPrecondition. null: this
  // process holds every rank.
  comm::Bootstrap* pipeline = nullptr;
};

// Makes the StageWork of virtual stage `stage` of replica `replica` on `device`.
using StageWorkFactory = std::function<absl::StatusOr<std::unique_ptr<StageWork>>(
    int stage, int replica, runtime::Device& device)>;

// Host memory holding one step's data, replica-major then micro-batch: replica d,
// micro-batch m starts at (d * M + m) * input_bytes (first stage's input_bytes()), and
// likewise for targets with the last stage's target_bytes().
struct StepInputs {
  std::span<const std::byte> inputs;
  std::span<const std::byte> targets;
};

struct StepResult {
  double loss = 0;         // mean of the D x M micro-batch losses
  double step_micros = 0;  // host wall time: first issue to the end of the final sync
  trace::Timeline timeline;
  // Per row (replica * P + rank): peak bytes allocated on its device during the step
  // above what was live when the step began (rows sharing a device show the same value).
  std::vector<std::int64_t> peak_activation_bytes;
  // Per row: its device, numbered 0, 1, ... in order of first appearance; rows with the
  // same number share a device (CUDA with fewer GPUs than P x D) and its peak above.
  std::vector<int> device_of_row;
  // Per span of `timeline` (same index): when the host began issuing the action the span
  // belongs to (for all replicas; replica d > 0 is issued just after replica 0), on the
  // timeline's clock. A stream cannot start work before it is issued, so
  // issue_micros[i] <= spans[i].start (to the clocks' agreement: a microsecond on the
  // host, half an event round trip on a GPU);
  // a stream idle up to the issue time was waiting for the host (stages/bubble_analysis.h).
  std::vector<double> issue_micros;
  // Per (replica, stage), outside the schedule's actions and so not in `timeline`: its
  // gradients zeroed ("ZERO_GRAD", on its rank's compute stream before the first action;
  // these start before 0) and its optimizer step ("OPTIMIZER", after the rank's last
  // action and the stage's all-reduce), on the timeline's clock; rank = row, lane =
  // trace::kComputeLane, microbatch -1. step_micros spans them.
  std::vector<trace::Span> phases;
  // Where time 0 of `timeline` (and of issue_micros and phases) is, in microseconds of
  // the steady clock of this process -- of the pipeline's process 0 when the pipeline is
  // split across processes (ExecutorOptions::pipeline), as its rows are: for placing
  // steps of different processes on one axis (Executor::GatherReplicas).
  double origin_micros = 0;
};

class Executor {
 public:
  // Validates `schedule` (InvalidArgument / FailedPrecondition from
  // scheduler::Validate), places the all-reduces (D > 1), creates the streams, events,
  // transports and all-reducers, and one StageWork per (replica, stage) from `factory`.
  // InvalidArgument when a stage's output size differs from the next stage's input size,
  // when the first stage needs no input or the last no targets, for num_replicas outside
  // [1, 4096], and for one bootstrap given as both `pipeline` and `processes`. In a job of
  // several processes a failed Create calls the bootstrap's Fail, so that the others
  // stop with its reason -- except where every process returns the same failure: what a
  // process makes alone (the works from `factory`, with their parameters, and the step's
  // input, target and loss buffers) is checked in every process before the executor's
  // exchanges of sizes, clocks and all-reducers (comm::AgreeOnVerdict; in a 2-D job after
  // the placement check), so any failure there -- a device that cannot hold one
  // process's part (ResourceExhausted), a factory that refuses -- fails Create in every
  // process alike, "process <n>: ..." in the others, marked comm::HeardByAll, and the
  // job stays usable (a sweep goes on). That check is one AllGather: a process that
  // makes its part for longer than the bootstrap's timeout fails Create in the others.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const scheduler::Schedule& schedule,
                                                          runtime::Backend& backend,
                                                          const StageWorkFactory& factory,
                                                          const ExecutorOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One training step: zero gradients, every action of the schedule on every replica,
  // all-reduces, optimizer steps; returns once all of it has run. The host never
  // synchronizes a stream: it polls the actions' events (Event::Query, with backoff), so
  // that a failed stream ends the step at once with its error and a stuck one with the
  // watchdog's DeadlineExceeded (ExecutorOptions::step_timeout_seconds); either way the
  // step's streams are aborted. InvalidArgument when the inputs have the wrong size. A
  // stream that failed stays failed (runtime semantics): after a failed step, make a new
  // Executor. A step after a failed one is FailedPrecondition (quoting the first line of
  // that failure) before it touches a stream, which may still run a host function. In a
  // job of several processes (ExecutorOptions::pipeline or ::processes of more than one)
  // any failed step, its inputs refused included, calls the bootstrap's Fail (the other
  // processes wait for this one's messages or all-reduces) and leaves the executor
  // failed: the job has to start again.
  absl::StatusOr<StepResult> Step(const StepInputs& inputs);

  // The schedule as run (with the ALLREDUCE actions placed when data_parallel_size() > 1).
  const scheduler::Schedule& schedule() const { return schedule_; }
  int num_ranks() const { return schedule_.num_ranks(); }
  int num_stages() const { return schedule_.num_stages(); }
  int num_microbatches() const { return schedule_.num_microbatches; }
  int num_replicas() const { return options_.num_replicas; }  // in this process
  // Replicas in every process together (num_replicas x processes): the schedule has
  // ALLREDUCE actions and the stages reduce gradients when it is above 1.
  int data_parallel_size() const {
    return options_.num_replicas * (options_.processes != nullptr ? options_.processes->size() : 1);
  }
  // The process of ExecutorOptions::pipeline that runs pipeline rank `rank` (0 without
  // one), and whether that is this process.
  int process_of_rank(int rank) const;
  bool runs_rank(int rank) const;
  bool runs_stage(int stage) const { return runs_rank(schedule_.placement.RankOf(stage)); }
  // ExecutorOptions::pipeline: this process's steady clock minus process 0's, as Create
  // measured it (0 on process 0's host; PIPESCHED_MEASURE_CLOCK_OFFSET=1 in the
  // environment measures there too), in microseconds.
  double clock_offset_micros() const { return clock_offset_micros_; }
  // In a job whose processes hold replicas of the pipeline (ExecutorOptions::processes):
  // `step` (this process's Step result) with every process's replicas, as one process
  // holding them all would draw it -- rows (q x D + d) x P + r for process q's replica d,
  // "replica q x D + d rank r" -- spans, issue times and phases on the clock of the
  // group's process 0 (loss, step time, peaks and devices stay this process's). Every
  // process of the group calls it after the same step; the clocks' offsets are measured
  // at the first call (as a split pipeline's). In a two-dimensional job the processes of
  // block 0 (pipeline rank 0, which hold their pipelines' gathered rows and clocks)
  // gather their pipelines; the others get `step` back. `step` itself without replicas
  // in other processes.
  absl::StatusOr<StepResult> GatherReplicas(const StepResult& step);
  // The device of (replica, rank) and the StageWork of (replica, stage); indices must be
  // in range, and the rank (the stage's) one this process runs (not checked).
  runtime::Device& device(int replica, int rank) const;
  StageWork& work(int replica, int stage) const;
  // Bytes one in-flight micro-batch of `stage` holds from its F to its last backward:
  // received input + boundary buffers + stash. What scheduler::StageCosts::activation_bytes
  // wants.
  std::int64_t activation_bytes(int stage) const;
  // The received input's part of activation_bytes (0 for stage 0), allocated before the
  // rank's compute action preceding the F. What scheduler::StageCosts::input_bytes wants.
  std::int64_t input_bytes(int stage) const;
  // `costs` (times) with `stage`'s activation_bytes, workspace_bytes, input_bytes and
  // recompute_bytes (StageWork::recompute_bytes): the stage costs whose simulated peak is
  // the runtime's.
  scheduler::StageCosts WithMemoryCosts(int stage, scheduler::StageCosts costs = {}) const;
  // Whether stage-1 -> stage of `replica` stays on one rank (its compute stream): then
  // both copies across the boundary run on that compute stream, in its order, instead
  // of on the recv and send streams behind event hand-offs.
  bool LocalBoundary(int replica, int stage) const;
  // Whether stage-1 -> stage crosses from one process of ExecutorOptions::pipeline to
  // another (messages through the bootstrap instead of copies).
  bool ProcessBoundary(int stage) const;
  // What one B or I of `stage` allocates while it runs (StageWork::workspace_bytes). What
  // scheduler::StageCosts::workspace_bytes wants.
  std::int64_t workspace_bytes(int stage) const;
  // What `stage` drops after each F and rebuilds at its backward
  // (StageWork::recompute_bytes); 0 without activation recomputation.
  std::int64_t recompute_bytes(int stage) const;
  // Whether `stage` recomputes its activations (StageWork::recomputes).
  bool recomputes(int stage) const;
  // Host actions issued per step (compute actions x D, transfers x D, all-reduces).
  std::int64_t actions_per_step() const;

 private:
  struct Rank;
  struct Slot;
  struct Issue;
  struct Kept;
  Executor() = default;
  // Step, less its failing the job of several processes when it fails.
  absl::StatusOr<StepResult> RunStep(const StepInputs& inputs);
  // The watchdog's look at a stall: whether a receive of a message from another process
  // (a crossing's RECV_F or RECV_B) has begun and not ended while no action of this
  // process has started and not finished, so that this process only waits for another
  // one, whose own watchdog, failure or silence ends it (not this one's).
  bool WaitingForAnotherProcess() const;
  // Create, less its telling the job's other processes that it failed.
  static absl::StatusOr<std::unique_ptr<Executor>> Build(const scheduler::Schedule& schedule,
                                                         runtime::Backend& backend,
                                                         const StageWorkFactory& factory,
                                                         const ExecutorOptions& options);
  absl::Status IssueAction(const Issue& issue);
  // Allocates (replica, stage, mb)'s input buffer on its compute stream and records the
  // slot's `alloc` event there, which the receive waits for.
  absl::Status AllocateInput(int replica, int stage, int mb);
  // The RECV_F of (replica, stage, mb) (stage > 0): on the recv stream behind the
  // allocation and the producer's F, or on the compute stream for a local boundary.
  absl::Status IssueReceive(int replica, int stage, int mb);
  absl::Status IssueForward(int replica, int stage, int mb);
  absl::Status IssueBackward(int replica, int stage, int mb, bool input_only);
  absl::Status IssueWeight(int replica, int stage, int mb);
  absl::Status Release(int replica, int stage, int mb);
  absl::Status IssueAllReduce(int stage);
  absl::Status BeforeDeviceWork(int replica, int rank);
  absl::Status AfterDeviceWork(int replica, int rank);
  MicrobatchIO MakeIO(int replica, int stage, int mb) const;
  // ExecutorOptions::pipeline: the message channel of a crossing ('f' activation into
  // `stage`, 'b' gradient out of it), and the host functions that move one.
  static std::string Channel(char kind, int stage, int replica, int mb);
  absl::Status EnqueueSend(runtime::Stream& stream, int to_rank, std::string channel,
                           const void* data, std::size_t bytes);
  absl::Status EnqueueReceive(runtime::Stream& stream, int from_rank, std::string channel,
                              void* data, std::size_t bytes);
  // ExecutorOptions::pipeline: every stage's sizes from the process that runs it, and the
  // check that every process runs the same schedule.
  absl::Status ExchangeStageSizes();
  // ExecutorOptions::pipeline: this process's steady clock against process 0's, from the
  // quickest of a few message round trips (clock_offset_micros_).
  absl::Status MeasureClockOffset();
  // ExecutorOptions::pipeline: every process's rows of `result` (its timeline's 0 at
  // `origin_micros` of this process's clock), merged on every process, process 0's clock
  // the common one; `loss_sum` becomes the last stage's process's.
  absl::Status MergeAcrossProcesses(StepResult& result, double origin_micros, double& loss_sum);
  double clock_offset_micros_ = 0;  // this process's steady clock minus process 0's
  // This process's steady clock minus the replica group's process 0's (GatherReplicas).
  std::optional<double> replica_clock_offset_micros_;
  absl::Status SynchronizeAll();
  // Watchdog (executor.cc, "Hang watchdog"): polls the step to its end, or aborts it.
  absl::Status AwaitStep();
  absl::Status AbortStep(absl::Status why);
  absl::Status AwaitEvent(runtime::Event& event);
  runtime::Event* EndEvent(int replica, const scheduler::Action& action) const;
  std::string Diagnose(const std::vector<std::vector<bool>>& done, double stalled_seconds) const;
  // `origin_micros`: the steady-clock time, in this process, that the timeline's 0 is.
  absl::StatusOr<trace::Timeline> CollectTimeline(double* origin_micros,
                                                  std::vector<double>* issue_micros,
                                                  std::vector<trace::Span>* phases) const;
  Rank& rank_of(int replica, int stage) const;
  Slot& slot(int replica, int stage, int mb) const;

  scheduler::Schedule schedule_;
  ExecutorOptions options_;
  runtime::Backend* backend_ = nullptr;
  std::unique_ptr<comm::Transport> transport_;
  std::vector<std::unique_ptr<Rank>> ranks_;                 // [replica * P + rank]
  std::vector<std::unique_ptr<StageWork>> works_;            // [replica * S + stage]
  std::vector<std::unique_ptr<Slot>> slots_;                 // [(replica * S + stage) * M + mb]
  std::vector<std::unique_ptr<comm::AllReducer>> reducers_;  // [stage], data_parallel_size() > 1
  std::vector<std::unique_ptr<runtime::Event>> allreduce_start_, allreduce_end_;  // [r*S+s]
  struct PhaseEvents {  // StepResult::phases
    std::unique_ptr<runtime::Event> zero_start, zero_end, opt_start, opt_end;
  };
  std::vector<PhaseEvents> phases_;  // [replica * S + stage]
  std::vector<Issue> order_;         // the issue order
  // Per stage, what its StageWork reports (the stages of other processes' through
  // ExchangeStageSizes).
  struct StageSizes {
    std::int64_t input = 0, output = 0, target = 0, stash = 0, workspace = 0, recompute = 0;
    bool recomputes = false;
  };
  std::vector<StageSizes> sizes_;            // [stage]
  std::vector<std::size_t> boundary_bytes_;  // [stage]
  std::vector<std::size_t> input_bytes_;     // [stage]: the received input (0 for stage 0)
  struct Region {
    std::size_t out = 0, grad_out = 0, grad_in = 0;  // offsets; SIZE_MAX = none
  };
  std::vector<Region> regions_;                             // [stage]
  std::vector<runtime::Buffer> inputs_, targets_, losses_;  // [replica]
  std::vector<int> last_backward_mb_;  // [stage]: micro-batch of the last B/W issued
  std::vector<bool> last_backward_is_w_;
  // The first failed step's status: the streams stay failed, so later steps are refused.
  absl::Status failed_step_;
  bool aborted_ = false;    // a step was aborted: the streams are poisoned
  bool abandoned_ = false;  // ... and some did not drain (a host function did not return)
  // The end-of-step events (Rank::drained) that had not completed when the step was
  // abandoned: the destructor waits for them a bounded time before it frees anything
  // a host function still running could use (KeepWhatAbandonedWorkUses).
  std::vector<runtime::Event*> abandoned_events_;
  bool AbandonedWorkReturned();
  void KeepWhatAbandonedWorkUses();
  std::vector<double> issue_times_;  // [order_ index]: steady-clock us when issued
  // The step's clock (MarkStepOrigins): per distinct device, a timing event recorded on an
  // idle stream of it at the start of each step, and the steady-clock us at which it
  // completed. Every span is timed from its device's origin (CollectTimeline).
  struct Clock {
    runtime::Stream* stream = nullptr;
    std::unique_ptr<runtime::Event> origin;
    double origin_micros = 0;
  };
  std::vector<Clock> clocks_;
  absl::Status MarkStepOrigins();
};

// The cost model that makes the simulator replay what was measured: per (stage, op)
// the median span duration over all replicas, micro-batches and `timelines`; per
// boundary the median RECV_F / SEND_B transfer (between the processes of
// ExecutorOptions::pipeline: RECV_F / RECV_B, which start at their message's send); per stage the
// median ALLREDUCE, the median ZERO_GRAD and OPTIMIZER of `phases` (StepResult::phases; 0 without
// them) and the executor's activation_bytes, workspace_bytes, input_bytes and recompute_bytes.
// Stages that ran B only get I = W = B / 2 (with recomputation W = (B - F) / 2 and I = B - W: the
// second forward is part of I); stages that ran I and W get B = I + W. Null entries, and spans
// whose duration is not finite and non-negative, are skipped. FailedPrecondition naming the
// stage when one has no measured F or no backward (B, or I and W) in `timelines` (none
// given, or timelines of another executor): its times would be made up.
absl::StatusOr<scheduler::CostModel> MeasuredCostModel(
    const std::vector<const trace::Timeline*>& timelines, const Executor& executor,
    const std::vector<const std::vector<trace::Span>*>& phases = {});

}  // namespace pipesched::stages
