// The pipeline executor (stages/executor.h).
#include "pipesched/stages/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "pipesched/base/bytes.h"
#include "pipesched/base/file_util.h"
#include "pipesched/base/hash.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/lower.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::stages {
namespace {

using scheduler::Action;
using scheduler::Op;

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kAlign = 256;  // boundary regions start on 256-byte boundaries

std::size_t AlignUp(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

absl::StatusOr<std::unique_ptr<runtime::Event>> TimingEvent(runtime::Device& device,
                                                            std::string name) {
  return device.CreateEvent(/*timing=*/true, name);
}

double SteadyMicros() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// Streams and bookkeeping of one (replica, rank).
struct Executor::Rank {
  int replica = 0;
  int rank = 0;
  runtime::Device* device = nullptr;
  std::unique_ptr<runtime::Stream> compute, send, recv, comm;
  std::unique_ptr<runtime::Event> freed;       // exact_memory_accounting: after the last work
  std::unique_ptr<runtime::Event> drained[4];  // watchdog: end of step of each stream
  std::vector<runtime::Stream*> streams() const {
    return {compute.get(), send.get(), recv.get(), comm.get()};
  }
  bool free_pending = false;
  std::vector<int> same_device;  // indices into ranks_ on the same device, self included
  int clock = 0;                 // index into clocks_ (its device's)
};

// One (replica, stage, micro-batch): its events and, during a step, its memory.
struct Executor::Slot {
  std::unique_ptr<runtime::Event> alloc;                 // input allocated (stage > 0)
  std::unique_ptr<runtime::Event> f_start, f_end;        // F
  std::unique_ptr<runtime::Event> recv_start, recv_end;  // RECV_F into this slot
  std::unique_ptr<runtime::Event> b_start, b_end;        // B or I
  std::unique_ptr<runtime::Event> send_start, send_end;  // SEND_B out of this slot
  std::unique_ptr<runtime::Event> w_start, w_end;        // W
  // ExecutorOptions::pipeline, the next stage in another process: the activation sent
  // to it (SEND_F) and the output gradient received from it (RECV_B).
  std::unique_ptr<runtime::Event> send_f_start, send_f_end;
  std::unique_ptr<runtime::Event> recv_b_start, recv_b_end;
  runtime::Buffer input;     // the received input (stage > 0)
  bool input_ready = false;  // `input` allocated for the coming F (AllocateInput)
  bool recv_issued = false;  // its RECV_F issued already (IssueReceive)
  runtime::Buffer boundary;  // output, output gradient, input gradient
  std::unique_ptr<ActivationStash> stash;
  bool split = false;  // the backward ran as I + W
};

struct Executor::Issue {
  Action action;
  int rank = 0;
  // The F (stage > 0) that follows this action on its rank: its input buffer is allocated
  // before this action is issued, so that the receive overlaps this action. -1: none.
  int prefetch_stage = -1;
  int prefetch_mb = -1;
  // The producer of that F's input is issued before this action: the receive is issued
  // right after it, not with the F (which matters when the host issues one action ahead
  // of the streams: exact_memory_accounting).
  bool prefetch_receive = false;
  // An F of a stage > 0: the index in order_ of the action with which its RECV_F is issued
  // (this F's own, or the action before it when that issues the receive).
  std::size_t receive_issue = 0;
};

Executor::~Executor() {
  // Work may still be queued after a failed step: let it drain before buffers go (an
  // aborted step drained already, or left a host function behind that did not return).
  if (!aborted_) {
    (void)SynchronizeAll();
  } else if (abandoned_ && !AbandonedWorkReturned()) {
    // Its stage work, micro-batch buffers and step inputs stay (StageWork's promise: they
    // outlive the work enqueued with them), as the runtime keeps its deferred frees.
    KeepWhatAbandonedWorkUses();
  }
  slots_.clear();
  inputs_.clear();
  targets_.clear();
  losses_.clear();
  reducers_.clear();
  works_.clear();
  ranks_.clear();
}

namespace {

// The bootstrap whose Fail reaches the job's other processes: the pipeline's (in a
// two-dimensional job a group's Fail is the whole job's), else the replicas', whichever
// holds other processes; null for a process alone.
comm::Bootstrap* JobOf(const ExecutorOptions& options) {
  if (options.pipeline != nullptr && options.pipeline->size() > 1) return options.pipeline;
  if (options.processes != nullptr && options.processes->size() > 1) return options.processes;
  return nullptr;
}

}  // namespace

int Executor::process_of_rank(int rank) const {
  if (options_.pipeline == nullptr) return 0;
  return static_cast<int>(static_cast<std::int64_t>(rank) * options_.pipeline->size() /
                          num_ranks());
}

bool Executor::runs_rank(int rank) const {
  return options_.pipeline == nullptr || process_of_rank(rank) == options_.pipeline->rank();
}

bool Executor::ProcessBoundary(int stage) const {
  return stage > 0 && process_of_rank(schedule_.placement.RankOf(stage - 1)) !=
                          process_of_rank(schedule_.placement.RankOf(stage));
}

Executor::Rank& Executor::rank_of(int replica, int stage) const {
  return *ranks_[replica * num_ranks() + schedule_.placement.RankOf(stage)];
}

Executor::Slot& Executor::slot(int replica, int stage, int mb) const {
  return *slots_[(static_cast<std::size_t>(replica) * num_stages() + stage) * num_microbatches() +
                 mb];
}

runtime::Device& Executor::device(int replica, int rank) const {
  return *ranks_[replica * num_ranks() + rank]->device;
}

StageWork& Executor::work(int replica, int stage) const {
  return *works_[replica * num_stages() + stage];
}

std::int64_t Executor::activation_bytes(int stage) const {
  return static_cast<std::int64_t>(input_bytes_[stage] + boundary_bytes_[stage]) +
         sizes_[stage].stash;
}

bool Executor::LocalBoundary(int /*replica*/, int stage) const {
  // Replica d's rank r is one Rank of its own, so the replica does not matter.
  return stage > 0 && schedule_.placement.RankOf(stage - 1) == schedule_.placement.RankOf(stage) &&
         !transport_->two_sided();
}

std::int64_t Executor::input_bytes(int stage) const {
  return static_cast<std::int64_t>(input_bytes_[stage]);
}

scheduler::StageCosts Executor::WithMemoryCosts(int stage, scheduler::StageCosts costs) const {
  costs.activation_bytes = activation_bytes(stage);
  costs.workspace_bytes = workspace_bytes(stage);
  costs.input_bytes = input_bytes(stage);
  costs.recompute_bytes = recompute_bytes(stage);
  costs.recompute = recomputes(stage);
  return costs;
}

std::int64_t Executor::workspace_bytes(int stage) const { return sizes_[stage].workspace; }

std::int64_t Executor::recompute_bytes(int stage) const { return sizes_[stage].recompute; }

bool Executor::recomputes(int stage) const { return sizes_[stage].recomputes; }

std::int64_t Executor::actions_per_step() const {
  std::int64_t n = 0;
  for (const Issue& issue : order_) {
    const Action& a = issue.action;
    if (a.op == Op::kAllReduce) {
      ++n;
      continue;
    }
    n += num_replicas();
    if ((a.op == Op::kF || a.op == Op::kB || a.op == Op::kI) && a.stage > 0) n += num_replicas();
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const scheduler::Schedule& schedule,
                                                           runtime::Backend& backend,
                                                           const StageWorkFactory& factory,
                                                           const ExecutorOptions& options) {
  absl::StatusOr<std::unique_ptr<Executor>> ex = Build(schedule, backend, factory, options);
  // The job's other processes may be waiting in an exchange of Build's, or would wait in
  // the first step's: they stop with this reason instead of at their timeout. Not when
  // every process returns the same refusal (what its allocations found, heard by all).
  if (comm::Bootstrap* job = JobOf(options);
      !ex.ok() && job != nullptr && !comm::HeardByAll(ex.status())) {
    job->Fail(std::string(ex.status().message()));
  }
  return ex;
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Build(const scheduler::Schedule& schedule,
                                                          runtime::Backend& backend,
                                                          const StageWorkFactory& factory,
                                                          const ExecutorOptions& options) {
  // The upper limit keeps replicas x processes (each at most 4096) inside an int.
  if (options.num_replicas < 1 || options.num_replicas > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the number of data-parallel replicas must be in [1, 4096], not ", options.num_replicas));
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        "the stage factory is empty: give a function that makes each stage's StageWork");
  }
  if (!(options.step_timeout_seconds >= 0) || !std::isfinite(options.step_timeout_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the step timeout must be >= 0 seconds (0 = none), not ", options.step_timeout_seconds));
  }
  PS_RETURN_IF_ERROR(scheduler::Validate(schedule));
  if (comm::Bootstrap* pipeline = options.pipeline; pipeline != nullptr) {
    if (pipeline == options.processes && pipeline->size() > 1) {
      return absl::InvalidArgumentError(
          "ExecutorOptions::pipeline and ::processes are one bootstrap: a process cannot both "
          "split a pipeline with and hold replicas beside the same processes; give each its "
          "group of the job (comm::SplitJob)");
    }
    if (backend.kind() != runtime::BackendKind::kHost) {
      return absl::FailedPreconditionError(
          "a pipeline split across processes runs on the host backend only: on CUDA its "
          "transfers need NCCL send/recv, which is not built yet");
    }
    if (pipeline->size() > schedule.num_ranks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a pipeline of ", schedule.num_ranks(), " ranks cannot be split across ",
                       pipeline->size(), " processes: give at most ", schedule.num_ranks(),
                       " (each process runs at least one rank)"));
    }
    // A two-dimensional job: the replicas of a block of ranks must hold the same block.
    if (options.processes != nullptr && options.processes->size() > 1) {
      PS_RETURN_IF_ERROR(comm::CheckAgreement(
          *options.processes, "executor-grid", "place in its pipeline",
          absl::StrCat("process ", pipeline->rank(), " of ", pipeline->size())));
    }
  }
  auto ex = std::unique_ptr<Executor>(new Executor());
  ex->options_ = options;
  ex->backend_ = &backend;
  PS_ASSIGN_OR_RETURN(ex->schedule_, scheduler::PlaceAllReduce(schedule, ex->data_parallel_size()));
  PS_ASSIGN_OR_RETURN(ex->transport_, comm::CreateTransport(backend.kind()));
  const int P = ex->num_ranks(), S = ex->num_stages(), M = ex->num_microbatches();
  const int D = options.num_replicas;
  const bool reduce = ex->data_parallel_size() > 1;  // the stages average their gradients

  // Devices and streams per (replica, rank).
  const int num_devices = backend.device_count();
  for (int d = 0; d < D; ++d) {
    for (int r = 0; r < P; ++r) {
      if (!ex->runs_rank(r)) {  // another process's (ExecutorOptions::pipeline)
        ex->ranks_.push_back(nullptr);
        continue;
      }
      auto rank = std::make_unique<Rank>();
      rank->replica = d;
      rank->rank = r;
      rank->device = &backend.device((d * P + r) % num_devices);
      const std::string tag = absl::StrCat("r", r, D > 1 ? absl::StrCat(".d", d) : "");
      PS_ASSIGN_OR_RETURN(rank->compute, rank->device->CreateStream(tag + " compute"));
      PS_ASSIGN_OR_RETURN(rank->send, rank->device->CreateStream(tag + " send"));
      PS_ASSIGN_OR_RETURN(rank->recv, rank->device->CreateStream(tag + " recv"));
      PS_ASSIGN_OR_RETURN(rank->comm, rank->device->CreateStream(tag + " comm"));
      PS_ASSIGN_OR_RETURN(rank->freed, rank->device->CreateEvent(false, tag + " freed"));
      for (int i = 0; i < 4; ++i) {
        PS_ASSIGN_OR_RETURN(rank->drained[i], rank->device->CreateEvent(
                                                  false, absl::StrCat(tag, " end of step ", i)));
      }
      ex->ranks_.push_back(std::move(rank));
    }
  }
  for (auto& a : ex->ranks_) {
    if (a == nullptr) continue;
    for (int j = 0; j < static_cast<int>(ex->ranks_.size()); ++j) {
      if (ex->ranks_[j] != nullptr && ex->ranks_[j]->device == a->device) {
        a->same_device.push_back(j);
      }
    }
  }

  // What this process makes alone: the work of each (replica, stage) it runs -- their
  // parameters, gradients and optimizer state -- and the step's inputs, targets and
  // losses. In a job its verdict is heard by every process before the executor's
  // exchanges of the pipeline's or the replicas' (the 2-D placement check above excepted,
  // which every process makes): a device that cannot hold one process's part
  // (ResourceExhausted), or any other failure of that part, is every process's refusal
  // (comm::HeardByAll) and leaves the job whole, so a sweep skips that configuration in
  // every process alike.
  auto make_local = [&]() -> absl::Status {
    // Stage work per (replica, stage), and its sizes.
    for (int d = 0; d < D; ++d) {
      for (int s = 0; s < S; ++s) {
        if (!ex->runs_stage(s)) {
          ex->works_.push_back(nullptr);
          continue;
        }
        PS_ASSIGN_OR_RETURN(std::unique_ptr<StageWork> work,
                            factory(s, d, *ex->rank_of(d, s).device));
        if (work == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("the stage factory returned no work for stage ", s));
        }
        ex->works_.push_back(std::move(work));
      }
    }
    // Sizes a work reports are checked before they are multiplied: every buffer of a step
    // (D x M micro-batches of the largest) stays far inside 64 bits.
    constexpr std::int64_t kMaxStepBytes = std::int64_t{1} << 56;
    ex->sizes_.assign(S, {});
    for (int s = 0; s < S; ++s) {
      if (ex->works_[s] == nullptr) continue;  // another process's
      const StageWork& w = *ex->works_[s];
      const struct {
        const char* name;
        __int128 bytes;
      } sizes[] = {{"input_bytes()", static_cast<__int128>(w.input_bytes())},
                   {"output_bytes()", static_cast<__int128>(w.output_bytes())},
                   {"target_bytes()", static_cast<__int128>(w.target_bytes())},
                   {"stash_bytes()", static_cast<__int128>(w.stash_bytes())},
                   {"workspace_bytes()", static_cast<__int128>(w.workspace_bytes())},
                   {"recompute_bytes()", static_cast<__int128>(w.recompute_bytes())}};
      for (const auto& [name, bytes] : sizes) {
        if (bytes < 0 || bytes * D * M > kMaxStepBytes) {
          const std::string value = bytes < 0
                                        ? absl::StrCat(static_cast<long long>(bytes))
                                        : absl::StrCat(static_cast<unsigned long long>(bytes));
          return absl::InvalidArgumentError(absl::StrCat(
              "stage ", s, "'s ", name, " is ", bytes < 0 ? "negative" : "too large", " (", value,
              "): a step's D x M micro-batches of it must stay within ", "2^56 bytes"));
        }
      }
      ex->sizes_[s] = {.input = static_cast<std::int64_t>(w.input_bytes()),
                       .output = static_cast<std::int64_t>(w.output_bytes()),
                       .target = static_cast<std::int64_t>(w.target_bytes()),
                       .stash = w.stash_bytes(),
                       .workspace = w.workspace_bytes(),
                       .recompute = w.recompute_bytes(),
                       .recomputes = w.recomputes()};
    }
    // Step data: inputs on each replica's first rank, targets and losses on its last (empty
    // buffers where another process runs that rank).
    // A refusal says, in the process whose device it is, what would make it fit.
    const std::string more_memory =
        options.more_memory.empty() ? "the device more memory" : options.more_memory;
    auto step_buffer = [M, &more_memory](Rank& rank, std::int64_t per_microbatch,
                                         std::string_view what,
                                         bool per_sample) -> absl::StatusOr<runtime::Buffer> {
      absl::StatusOr<runtime::Buffer> buffer = rank.device->Allocate(
          static_cast<std::size_t>(M) * static_cast<std::size_t>(per_microbatch), *rank.compute);
      if (buffer.ok()) return buffer;
      return absl::Status(
          buffer.status().code(),
          absl::StrCat("the step's ", Absl(what), " (", M, " micro-batches of ", per_microbatch,
                       " bytes) do not fit: ", buffer.status().message(), "; give ", more_memory,
                       ", or fewer", per_sample ? " or smaller" : "", " micro-batches"));
    };
    for (int d = 0; d < D; ++d) {
      runtime::Buffer in, tg, loss;
      if (ex->runs_stage(0)) {
        PS_ASSIGN_OR_RETURN(in,
                            step_buffer(ex->rank_of(d, 0), ex->sizes_[0].input, "inputs", true));
      }
      if (ex->runs_stage(S - 1)) {
        Rank& last = ex->rank_of(d, S - 1);
        PS_ASSIGN_OR_RETURN(tg, step_buffer(last, ex->sizes_[S - 1].target, "targets", true));
        PS_ASSIGN_OR_RETURN(loss, step_buffer(last, sizeof(float), "losses", false));
      }
      ex->inputs_.push_back(std::move(in));
      ex->targets_.push_back(std::move(tg));
      ex->losses_.push_back(std::move(loss));
    }
    return absl::OkStatus();
  };
  PS_RETURN_IF_ERROR(
      comm::AgreeOnVerdict({options.pipeline, options.processes}, "executor-local", make_local()));
  if (options.pipeline != nullptr) {
    PS_RETURN_IF_ERROR(ex->ExchangeStageSizes());
    PS_RETURN_IF_ERROR(ex->MeasureClockOffset());
  }
  for (int s = 0; s + 1 < S; ++s) {
    if (ex->sizes_[s].output != ex->sizes_[s + 1].input) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", s, " outputs ", ex->sizes_[s].output,
                                                     " bytes per micro-batch but stage ", s + 1,
                                                     " expects ", ex->sizes_[s + 1].input));
    }
  }
  if (ex->sizes_[0].input == 0) {
    return absl::InvalidArgumentError("the first stage takes no input (input_bytes() == 0)");
  }
  if (ex->sizes_[S - 1].target == 0) {
    return absl::InvalidArgumentError("the last stage takes no targets (target_bytes() == 0)");
  }
  for (int d = 1; d < D; ++d) {
    for (int s = 0; s < S; ++s) {
      if (ex->works_[s] == nullptr) continue;  // another process's
      std::vector<GradientSpan> a = ex->works_[s]->gradients();
      std::vector<GradientSpan> b = ex->work(d, s).gradients();
      bool same = a.size() == b.size();
      for (std::size_t k = 0; same && k < a.size(); ++k) same = a[k].count == b[k].count;
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat("replica ", d, " of stage ", s,
                                                       " has gradients shaped unlike replica 0's"));
      }
      // Buffers are sized by replica 0's works: another replica's must take the same.
      const StageWork& first = *ex->works_[s];
      const StageWork& other = ex->work(d, s);
      const struct {
        const char* name;
        std::int64_t first, other;
      } sizes[] = {{"input_bytes()", static_cast<std::int64_t>(first.input_bytes()),
                    static_cast<std::int64_t>(other.input_bytes())},
                   {"output_bytes()", static_cast<std::int64_t>(first.output_bytes()),
                    static_cast<std::int64_t>(other.output_bytes())},
                   {"target_bytes()", static_cast<std::int64_t>(first.target_bytes()),
                    static_cast<std::int64_t>(other.target_bytes())},
                   {"stash_bytes()", first.stash_bytes(), other.stash_bytes()},
                   {"workspace_bytes()", first.workspace_bytes(), other.workspace_bytes()},
                   {"recompute_bytes()", first.recompute_bytes(), other.recompute_bytes()}};
      for (const auto& [name, want, got] : sizes) {
        if (want != got) {
          return absl::InvalidArgumentError(
              absl::StrCat("replica ", d, " of stage ", s, "'s ", name, " is ", got,
                           " but replica 0's is ", want, ": every replica runs the same stage"));
        }
      }
    }
  }
  // Boundary layout per stage: [out][grad_out][grad_in], whichever exist; the received
  // input (stage > 0) is a buffer of its own, allocated one action earlier (Slot::input).
  for (int s = 0; s < S; ++s) {
    Region region{kNone, kNone, kNone};
    std::size_t size = 0;
    const auto in = static_cast<std::size_t>(ex->sizes_[s].input);
    const auto out = static_cast<std::size_t>(ex->sizes_[s].output);
    ex->input_bytes_.push_back(s > 0 ? in : 0);
    if (s + 1 < S) {
      region.out = size;
      size += AlignUp(out);
      region.grad_out = size;
      size += AlignUp(out);
    }
    if (s > 0) {
      region.grad_in = size;
      size += AlignUp(in);
    }
    ex->regions_.push_back(region);
    ex->boundary_bytes_.push_back(size);
  }

  // Events per (replica, stage, micro-batch), created on the device they are recorded on.
  for (int d = 0; d < D; ++d) {
    for (int s = 0; s < S; ++s) {
      if (!ex->runs_stage(s)) {  // another process's: no events here
        for (int m = 0; m < M; ++m) ex->slots_.push_back(nullptr);
        ex->allreduce_start_.push_back(nullptr);
        ex->allreduce_end_.push_back(nullptr);
        ex->phases_.emplace_back();
        continue;
      }
      runtime::Device& dev = *ex->rank_of(d, s).device;
      for (int m = 0; m < M; ++m) {
        auto sl = std::make_unique<Slot>();
        const std::string id =
            absl::StrCat("(", s, ",", m, D > 1 ? absl::StrCat(",d", d) : "", ")");
        PS_ASSIGN_OR_RETURN(sl->alloc, dev.CreateEvent(false, "alloc" + id));
        PS_ASSIGN_OR_RETURN(sl->f_start, TimingEvent(dev, "F" + id + " start"));
        PS_ASSIGN_OR_RETURN(sl->f_end, TimingEvent(dev, "F" + id + " done"));
        PS_ASSIGN_OR_RETURN(sl->recv_start, TimingEvent(dev, "RECV_F" + id + " start"));
        PS_ASSIGN_OR_RETURN(sl->recv_end, TimingEvent(dev, "RECV_F" + id + " done"));
        PS_ASSIGN_OR_RETURN(sl->b_start, TimingEvent(dev, "B/I" + id + " start"));
        PS_ASSIGN_OR_RETURN(sl->b_end, TimingEvent(dev, "B/I" + id + " done"));
        PS_ASSIGN_OR_RETURN(sl->send_start, TimingEvent(dev, "SEND_B" + id + " start"));
        PS_ASSIGN_OR_RETURN(sl->send_end, TimingEvent(dev, "SEND_B" + id + " done"));
        PS_ASSIGN_OR_RETURN(sl->w_start, TimingEvent(dev, "W" + id + " start"));
        PS_ASSIGN_OR_RETURN(sl->w_end, TimingEvent(dev, "W" + id + " done"));
        if (s + 1 < S && ex->ProcessBoundary(s + 1)) {
          PS_ASSIGN_OR_RETURN(sl->send_f_start, TimingEvent(dev, "SEND_F" + id + " start"));
          PS_ASSIGN_OR_RETURN(sl->send_f_end, TimingEvent(dev, "SEND_F" + id + " done"));
          PS_ASSIGN_OR_RETURN(sl->recv_b_start, TimingEvent(dev, "RECV_B" + id + " start"));
          PS_ASSIGN_OR_RETURN(sl->recv_b_end, TimingEvent(dev, "RECV_B" + id + " done"));
        }
        ex->slots_.push_back(std::move(sl));
      }
      PS_ASSIGN_OR_RETURN(auto ar_start,
                          TimingEvent(dev, absl::StrCat("ALLREDUCE(", s, ",d", d, ") start")));
      PS_ASSIGN_OR_RETURN(auto ar_end,
                          TimingEvent(dev, absl::StrCat("ALLREDUCE(", s, ",d", d, ") done")));
      ex->allreduce_start_.push_back(std::move(ar_start));
      ex->allreduce_end_.push_back(std::move(ar_end));
      PhaseEvents phase;
      const std::string stage_id = absl::StrCat("(", s, ",d", d, ")");
      PS_ASSIGN_OR_RETURN(phase.zero_start, TimingEvent(dev, "ZERO_GRAD" + stage_id + " start"));
      PS_ASSIGN_OR_RETURN(phase.zero_end, TimingEvent(dev, "ZERO_GRAD" + stage_id + " done"));
      PS_ASSIGN_OR_RETURN(phase.opt_start, TimingEvent(dev, "OPTIMIZER" + stage_id + " start"));
      PS_ASSIGN_OR_RETURN(phase.opt_end, TimingEvent(dev, "OPTIMIZER" + stage_id + " done"));
      ex->phases_.push_back(std::move(phase));
    }
  }
  if (reduce) {
    for (int s = 0; s < S; ++s) {
      if (!ex->runs_stage(s)) {
        ex->reducers_.push_back(nullptr);
        continue;
      }
      std::vector<runtime::Device*> devices;
      for (int d = 0; d < D; ++d) devices.push_back(ex->rank_of(d, s).device);
      PS_ASSIGN_OR_RETURN(
          auto reducer,
          comm::CreateAllReducer(devices, {.timeout_seconds = options.step_timeout_seconds,
                                           .processes = options.processes,
                                           .channel = absl::StrCat("stage-", s)}));
      ex->reducers_.push_back(std::move(reducer));
    }
  }

  PS_RETURN_IF_ERROR(ex->SynchronizeAll());
  // One step clock per distinct device, on the compute stream of its first rank.
  for (auto& rk : ex->ranks_) {
    if (rk == nullptr) continue;
    auto same = std::find_if(ex->clocks_.begin(), ex->clocks_.end(),
                             [&](const Clock& c) { return &c.stream->device() == rk->device; });
    if (same != ex->clocks_.end()) {
      rk->clock = static_cast<int>(same - ex->clocks_.begin());
      continue;
    }
    rk->clock = static_cast<int>(ex->clocks_.size());
    PS_ASSIGN_OR_RETURN(auto origin, TimingEvent(*rk->device, "step origin"));
    ex->clocks_.push_back({.stream = rk->compute.get(), .origin = std::move(origin)});
  }

  // The issue order: walk the ranks' programs round-robin, each as far as the
  // dependencies already issued allow. Every event waited on is then recorded earlier
  // in the same walk (RECV_F after the previous stage's F, SEND_B right after its B/I).
  std::vector<int> pos(P, 0);
  std::vector<std::vector<bool>> f_done(S, std::vector<bool>(M, false));
  std::vector<std::vector<bool>> bi_done(S, std::vector<bool>(M, false));
  std::vector<int> backward_left(S, 0);
  ex->last_backward_mb_.assign(S, 0);
  ex->last_backward_is_w_.assign(S, false);
  for (const auto& program : ex->schedule_.programs) {
    for (const Action& a : program) {
      if (a.op == Op::kB || a.op == Op::kW) ++backward_left[a.stage];
    }
  }
  std::size_t remaining = ex->schedule_.NumActions();
  while (remaining > 0) {
    bool progress = false;
    for (int r = 0; r < P; ++r) {
      const std::vector<Action>& program = ex->schedule_.programs[r];
      while (pos[r] < static_cast<int>(program.size())) {
        const Action& a = program[pos[r]];
        bool ready = true;
        switch (a.op) {
          case Op::kF:
            ready = a.stage == 0 || f_done[a.stage - 1][a.microbatch];
            break;
          case Op::kB:
          case Op::kI:
            ready = f_done[a.stage][a.microbatch] &&
                    (a.stage == S - 1 || bi_done[a.stage + 1][a.microbatch]);
            break;
          case Op::kW:
            ready = bi_done[a.stage][a.microbatch];
            break;
          case Op::kAllReduce:
            ready = backward_left[a.stage] == 0;
            break;
          default:  // lowered SEND/RECV markers: the executor does its own transfers
            break;
        }
        if (!ready) break;
        switch (a.op) {
          case Op::kF:
            f_done[a.stage][a.microbatch] = true;
            break;
          case Op::kB:
          case Op::kI:
            bi_done[a.stage][a.microbatch] = true;
            break;
          default:
            break;
        }
        if (a.op == Op::kB || a.op == Op::kW) {
          --backward_left[a.stage];
          ex->last_backward_mb_[a.stage] = a.microbatch;
          ex->last_backward_is_w_[a.stage] = a.op == Op::kW;
        }
        if (scheduler::IsCompute(a.op) || (a.op == Op::kAllReduce && reduce)) {
          ex->order_.push_back(Issue{a, r});
        }
        ++pos[r];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      return absl::InternalError(
          "the executor found no issue order for a schedule the validator accepted");
    }
  }
  // Receive prefetch: each F of a stage > 0 gets its input buffer when the compute action
  // before it on its rank is issued (scheduler::StageCosts::input_bytes).
  {
    std::map<std::tuple<int, Op, int>, std::size_t> issue_of;  // compute action -> order_
    for (std::size_t k = 0; k < ex->order_.size(); ++k) {
      const Action& a = ex->order_[k].action;
      if (scheduler::IsCompute(a.op)) issue_of[{a.stage, a.op, a.microbatch}] = k;
      ex->order_[k].receive_issue = k;
    }
    for (const std::vector<Action>& program : ex->schedule_.programs) {
      const Action* before = nullptr;
      for (const Action& a : program) {
        if (!scheduler::IsCompute(a.op)) continue;
        if (before != nullptr && a.op == Op::kF && a.stage > 0) {
          const std::size_t k = issue_of.at({before->stage, before->op, before->microbatch});
          Issue& issue = ex->order_[k];
          issue.prefetch_stage = a.stage;
          issue.prefetch_mb = a.microbatch;
          // (Not across a local boundary: that copy runs on the compute stream with the F.)
          issue.prefetch_receive = issue_of.at({a.stage - 1, Op::kF, a.microbatch}) < k &&
                                   !ex->LocalBoundary(0, a.stage);
          if (issue.prefetch_receive) {
            ex->order_[issue_of.at({a.stage, a.op, a.microbatch})].receive_issue = k;
          }
        }
        before = &a;
      }
    }
  }
  // ExecutorOptions::pipeline: this process issues its own ranks' actions, in the order
  // every process walked, so that each Receive's message comes from an action that its
  // sender issued earlier in that one order (none waits on a later one: no deadlock).
  if (options.pipeline != nullptr) {
    std::vector<std::size_t> index(ex->order_.size(), kNone);
    std::vector<Issue> own;
    for (std::size_t k = 0; k < ex->order_.size(); ++k) {
      if (!ex->runs_rank(ex->order_[k].rank)) continue;
      index[k] = own.size();
      own.push_back(ex->order_[k]);
    }
    // An F's receive is issued with it or with the action before it on its rank: kept.
    for (Issue& issue : own) issue.receive_issue = index[issue.receive_issue];
    ex->order_ = std::move(own);
  }
  return ex;
}

MicrobatchIO Executor::MakeIO(int replica, int stage, int mb) const {
  const Slot& sl = slot(replica, stage, mb);
  const Region& region = regions_[stage];
  auto* base = static_cast<std::byte*>(sl.boundary.data());
  auto at = [base](std::size_t offset) -> std::byte* {
    return offset == kNone ? nullptr : base + offset;
  };
  MicrobatchIO io;
  io.microbatch = mb;
  io.input = stage == 0 ? static_cast<const void*>(inputs_[replica].as<std::byte>() +
                                                   mb * works_[0]->input_bytes())
                        : sl.input.data();
  io.output = at(region.out);
  io.grad_output = at(region.grad_out);
  io.grad_input = at(region.grad_in);
  if (stage == num_stages() - 1) {
    io.targets = targets_[replica].as<std::byte>() + mb * works_[stage]->target_bytes();
    io.loss = losses_[replica].as<float>() + mb;
  }
  io.loss_scale = 1.0f / static_cast<float>(num_microbatches());
  io.stash = sl.stash.get();
  return io;
}

std::string Executor::Channel(char kind, int stage, int replica, int mb) {
  return absl::StrCat(std::string(1, kind), "-", stage, "-", replica, "-", mb);
}

absl::Status Executor::EnqueueSend(runtime::Stream& stream, int to_rank, std::string channel,
                                   const void* data, std::size_t bytes) {
  comm::Bootstrap* pipeline = options_.pipeline;
  const int to = process_of_rank(to_rank);
  // Send copies the bytes and returns: the buffer may be freed behind it on this stream.
  return stream.EnqueueHost([pipeline, to, channel = std::move(channel), data, bytes] {
    return pipeline->Send(to, channel, std::string_view(static_cast<const char*>(data), bytes));
  });
}

absl::Status Executor::EnqueueReceive(runtime::Stream& stream, int from_rank, std::string channel,
                                      void* data, std::size_t bytes) {
  comm::Bootstrap* pipeline = options_.pipeline;
  const int from = process_of_rank(from_rank);
  // Blocks the stream's worker until the message is there (a step that stalls is ended
  // by the watchdog, whose AbortStep aborts the bootstrap and so this Receive).
  return stream.EnqueueHost(
      [pipeline, from, channel = std::move(channel), data, bytes]() -> absl::Status {
        PS_ASSIGN_OR_RETURN(const std::string message, pipeline->Receive(from, channel));
        if (message.size() != bytes) {
          return absl::InternalError(
              absl::StrCat("the message on channel '", channel, "' from process ",
                           pipeline->job_rank(from), " has ", message.size(), " bytes where ",
                           bytes, " were expected (do the processes run the same stages?)"));
        }
        std::memcpy(data, message.data(), bytes);
        return absl::OkStatus();
      });
}

absl::Status Executor::ExchangeStageSizes() {
  comm::Bootstrap& pipeline = *options_.pipeline;
  const int S = num_stages();
  // The schedule as run, placement included: the processes' actions must match one to
  // one, or their messages would never pair up.
  Fnv1a64 hash;
  for (const std::vector<Action>& program : schedule_.programs) {
    for (const Action& a : program) hash.AddField(scheduler::ToString(a));
    hash.AddField("|");
  }
  for (int s = 0; s < S; ++s) hash.AddField(absl::StrCat(schedule_.placement.RankOf(s)));
  PS_RETURN_IF_ERROR(comm::CheckAgreement(
      pipeline, "executor-schedule", "schedule",
      absl::StrFormat("%s P=%d stages=%d M=%d replicas=%d hash=%016x", schedule_.name, num_ranks(),
                      S, num_microbatches(), num_replicas(), hash.value())));
  std::string mine;
  for (int s = 0; s < S; ++s) {
    if (!runs_stage(s)) continue;
    const StageSizes& z = sizes_[s];
    absl::StrAppend(&mine, s, " ", z.input, " ", z.output, " ", z.target, " ", z.stash, " ",
                    z.workspace, " ", z.recompute, " ", z.recomputes ? 1 : 0, "\n");
  }
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                      pipeline.AllGather("executor-stages", mine));
  std::vector<bool> known(S, false);
  for (int s = 0; s < S; ++s) known[s] = runs_stage(s);
  for (int q = 0; q < static_cast<int>(all.size()); ++q) {
    if (q == pipeline.rank()) continue;
    for (absl::string_view line : absl::StrSplit(all[q], '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
      std::int64_t v[8] = {};
      bool ok = f.size() == 8;
      for (std::size_t i = 0; ok && i < 8; ++i) ok = absl::SimpleAtoi(f[i], &v[i]);
      const int s = ok ? static_cast<int>(v[0]) : -1;
      if (!ok || s < 0 || s >= S || process_of_rank(schedule_.placement.RankOf(s)) != q ||
          known[s]) {
        return absl::InternalError(absl::StrCat("process ", pipeline.job_rank(q),
                                                " reported stage sizes \"", line,
                                                "\" that this process cannot place"));
      }
      sizes_[s] = {.input = v[1],
                   .output = v[2],
                   .target = v[3],
                   .stash = v[4],
                   .workspace = v[5],
                   .recompute = v[6],
                   .recomputes = v[7] != 0};
      known[s] = true;
    }
  }
  for (int s = 0; s < S; ++s) {
    if (!known[s]) {
      return absl::InternalError(absl::StrCat(
          "no process reported the sizes of stage ", s, " (process ",
          pipeline.job_rank(process_of_rank(schedule_.placement.RankOf(s))), " runs it)"));
    }
  }
  return absl::OkStatus();
}

namespace {

// A span of a step's rows as one process sends them to the others (base/bytes.h).
void PutSpan(ByteWriter& out, const trace::Span& span) {
  for (int v : {span.rank, span.lane, span.stage, span.microbatch}) out.Int(v);
  out.Text(span.op);
  out.Real(span.start);
  out.Real(span.end);
}

trace::Span TakeSpan(ByteReader& in) {
  trace::Span span;
  span.rank = static_cast<int>(in.Int());
  span.lane = static_cast<int>(in.Int());
  span.stage = static_cast<int>(in.Int());
  span.microbatch = static_cast<int>(in.Int());
  span.op = in.Text();
  span.start = in.Real();
  span.end = in.Real();
  return span;
}

constexpr std::size_t kSpanBytes = 4 * 8 + 8 + 2 * 8;  // a span, its op empty

// A step's rows as processes send them to each other: its spans, each with its issue
// time, then its phases.
struct StepRows {
  std::vector<trace::Span> spans, phases;
  std::vector<double> issued;
};

void PutStepRows(ByteWriter& out, const StepResult& step) {
  out.Int(static_cast<std::int64_t>(step.timeline.spans.size()));
  for (std::size_t i = 0; i < step.timeline.spans.size(); ++i) {
    PutSpan(out, step.timeline.spans[i]);
    out.Real(i < step.issue_micros.size() ? step.issue_micros[i] : step.timeline.spans[i].start);
  }
  out.Int(static_cast<std::int64_t>(step.phases.size()));
  for (const trace::Span& span : step.phases) PutSpan(out, span);
}

StepRows TakeStepRows(ByteReader& in) {
  StepRows rows;
  for (std::int64_t i = 0, n = in.Count(kSpanBytes + 8); i < n; ++i) {
    rows.spans.push_back(TakeSpan(in));
    rows.issued.push_back(in.Real());
  }
  for (std::int64_t i = 0, n = in.Count(kSpanBytes); i < n; ++i) {
    rows.phases.push_back(TakeSpan(in));
  }
  return rows;
}

// Appends `rows` to `step`'s timeline, issue times and phases, `shift` us later and
// `row_base` rows further down.
void AppendStepRows(StepResult& step, const StepRows& rows, double shift, int row_base) {
  for (std::size_t i = 0; i < rows.spans.size(); ++i) {
    trace::Span span = rows.spans[i];
    span.rank += row_base;
    span.start += shift;
    span.end += shift;
    step.timeline.spans.push_back(std::move(span));
    step.issue_micros.push_back(rows.issued[i] + shift);
  }
  for (trace::Span span : rows.phases) {
    span.rank += row_base;
    span.start += shift;
    span.end += shift;
    step.phases.push_back(std::move(span));
  }
}

// This machine's boot id (Linux), empty when unknown: processes with the same one share
// the steady clock (CLOCK_MONOTONIC), so their offset is 0, not an estimate.
std::string BootId() {
  absl::StatusOr<std::string> id = ReadFile("/proc/sys/kernel/random/boot_id", 128);
  if (!id.ok()) return "";
  std::string out = *id;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace

namespace {

// This process's steady clock minus the clock of `group`'s rank 0, in microseconds: 0
// for a process on rank 0's host (the same boot id), else estimated from the quickest of
// a few message round trips with rank 0. Every rank of `group` calls it; its channels
// are "<prefix>-boot-ids", "<prefix>" and "<prefix>-offsets".
absl::StatusOr<double> ClockOffsetToRank0(comm::Bootstrap& group, std::string_view prefix) {
  const int K = group.size();
  constexpr int kRounds = 8;
  const std::string channel(prefix);
  ByteWriter offsets;
  // PIPESCHED_MEASURE_CLOCK_OFFSET=1 measures on one host too (tests of the estimate).
  const char* measure = std::getenv("PIPESCHED_MEASURE_CLOCK_OFFSET");
  const bool always = measure != nullptr && std::string_view(measure) == "1";
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> boots,
                      group.AllGather(channel + "-boot-ids", always ? "" : BootId()));
  if (group.rank() == 0) {
    for (int q = 1; q < K; ++q) {
      if (!boots[0].empty() && boots[q] == boots[0]) {  // one host: one clock
        offsets.Int(q);
        offsets.Real(0);
        continue;
      }
      double best_round_trip = std::numeric_limits<double>::infinity(), offset = 0;
      for (int i = 0; i < kRounds; ++i) {
        const double sent = SteadyMicros();
        PS_RETURN_IF_ERROR(group.Send(q, channel, ""));
        PS_ASSIGN_OR_RETURN(const std::string reply, group.Receive(q, channel));
        const double back = SteadyMicros();
        ByteReader in(reply);
        const double theirs = in.Real();
        if (!in.ok()) {
          return absl::InternalError(absl::StrCat("process ", group.job_rank(q),
                                                  " answered the clock exchange with ",
                                                  reply.size(), " bytes, not 8"));
        }
        // Their clock read half way through the round trip, the best guess without more.
        if (back - sent < best_round_trip) {
          best_round_trip = back - sent;
          offset = theirs - (sent + back) / 2;
        }
      }
      offsets.Int(q);
      offsets.Real(offset);
    }
  } else if (boots[0].empty() || boots[group.rank()] != boots[0]) {
    for (int i = 0; i < kRounds; ++i) {
      PS_RETURN_IF_ERROR(group.Receive(0, channel).status());
      ByteWriter now;
      now.Real(SteadyMicros());
      PS_RETURN_IF_ERROR(group.Send(0, channel, now.bytes()));
    }
  }
  PS_ASSIGN_OR_RETURN(const std::string all,
                      comm::Broadcast(group, channel + "-offsets", offsets.bytes(), /*root=*/0));
  ByteReader in(all);
  double mine = 0;
  for (int q = 1; q < K; ++q) {
    const std::int64_t who = in.Int();
    const double offset = in.Real();
    if (!in.ok() || who != q) {
      return absl::InternalError(absl::StrCat("process ", group.job_rank(0),
                                              " sent clock offsets this process cannot read"));
    }
    if (q == group.rank()) mine = offset;
  }
  return mine;
}

}  // namespace

absl::Status Executor::MeasureClockOffset() {
  PS_ASSIGN_OR_RETURN(clock_offset_micros_,
                      ClockOffsetToRank0(*options_.pipeline, "executor-clock"));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Executor::GatherReplicas(const StepResult& step) {
  comm::Bootstrap* group = options_.processes;
  if (group == nullptr || group->size() < 2) return step;
  // A two-dimensional job: block 0's processes hold each pipeline's clock and whole rows.
  if (options_.pipeline != nullptr && options_.pipeline->rank() != 0) return step;
  if (!replica_clock_offset_micros_.has_value()) {
    PS_ASSIGN_OR_RETURN(replica_clock_offset_micros_,
                        ClockOffsetToRank0(*group, "executor-replica-clock"));
  }
  ByteWriter out;
  out.Real(step.origin_micros - *replica_clock_offset_micros_);  // on process 0's clock
  out.Int(step.timeline.num_ranks);
  PutStepRows(out, step);
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                      group->AllGather("executor-replicas", out.bytes()));
  struct Part : StepRows {
    double origin = 0;
    std::int64_t rows = 0;
  };
  std::vector<Part> parts(all.size());
  double first = std::numeric_limits<double>::infinity();
  for (std::size_t q = 0; q < all.size(); ++q) {
    Part& part = parts[q];
    ByteReader in(all[q]);
    part.origin = in.Real();
    part.rows = in.Int();
    static_cast<StepRows&>(part) = TakeStepRows(in);
    if (part.rows != step.timeline.num_ranks) in.Fail();
    for (const std::vector<trace::Span>* spans : {&part.spans, &part.phases}) {
      for (const trace::Span& span : *spans) {
        if (span.rank < 0 || span.rank >= part.rows) in.Fail();
      }
    }
    if (!in.ok()) {
      return absl::InternalError(
          absl::StrCat("process ", group->job_rank(static_cast<int>(q)),
                       " sent its replicas' rows in a form this process cannot read"));
    }
    first = std::min(first, part.origin);
  }
  StepResult merged = step;
  const int rows = static_cast<int>(step.timeline.num_ranks);
  merged.timeline.num_ranks = rows * static_cast<int>(all.size());
  merged.timeline.ranks_per_replica = num_ranks();
  merged.timeline.spans.clear();
  merged.issue_micros.clear();
  merged.phases.clear();
  merged.origin_micros = first;
  for (std::size_t q = 0; q < parts.size(); ++q) {
    // Process q's replicas follow process q - 1's.
    AppendStepRows(merged, parts[q], parts[q].origin - first, static_cast<int>(q) * rows);
  }
  return merged;
}

absl::Status Executor::MergeAcrossProcesses(StepResult& result, double origin_micros,
                                            double& loss_sum) {
  comm::Bootstrap& pipeline = *options_.pipeline;
  const int P = num_ranks();
  ByteWriter out;
  out.Real(origin_micros - clock_offset_micros_);  // on process 0's clock
  out.Real(loss_sum);
  PutStepRows(out, result);
  std::vector<int> rows;
  for (int row = 0; row < static_cast<int>(ranks_.size()); ++row) {
    if (ranks_[row] != nullptr) rows.push_back(row);
  }
  out.Int(static_cast<std::int64_t>(rows.size()));
  for (int row : rows) {
    out.Int(row);
    out.Int(result.peak_activation_bytes[row]);
    out.Int(result.device_of_row[row]);
  }
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                      pipeline.AllGather("executor-step", out.bytes()));

  struct Part : StepRows {
    double origin = 0, loss_sum = 0;
    std::vector<std::array<std::int64_t, 3>> rows;  // row, peak bytes, device
  };
  std::vector<Part> parts(all.size());
  double first = std::numeric_limits<double>::infinity();
  for (std::size_t q = 0; q < all.size(); ++q) {
    Part& part = parts[q];
    ByteReader in(all[q]);
    part.origin = in.Real();
    part.loss_sum = in.Real();
    static_cast<StepRows&>(part) = TakeStepRows(in);
    for (std::int64_t i = 0, n = in.Count(3 * 8); i < n; ++i) {
      part.rows.push_back({in.Int(), in.Int(), in.Int()});
    }
    for (const auto& [row, peak, device] : part.rows) {
      if (row < 0 || row >= static_cast<std::int64_t>(ranks_.size())) in.Fail();
    }
    if (!in.ok()) {
      return absl::InternalError(
          absl::StrCat("process ", pipeline.job_rank(q),
                       " sent its step's rows in a form this process cannot read"));
    }
    first = std::min(first, part.origin);
  }
  trace::Timeline& timeline = result.timeline;
  timeline.spans.clear();
  result.issue_micros.clear();
  result.phases.clear();
  int device_base = 0;
  for (const Part& part : parts) {
    AppendStepRows(result, part, part.origin - first, /*row_base=*/0);
    int devices = 0;
    for (const auto& [row, peak, device] : part.rows) {
      result.peak_activation_bytes[row] = peak;
      result.device_of_row[row] = device_base + static_cast<int>(device);
      devices = std::max(devices, static_cast<int>(device) + 1);
    }
    device_base += devices;
  }
  result.origin_micros = first;  // on the pipeline's process 0's clock, as the rows
  loss_sum = parts[process_of_rank(schedule_.placement.RankOf(num_stages() - 1))].loss_sum;
  // A crossing's receive was posted when its buffer was ready and waited for the message:
  // its transfer starts when the message was sent.
  std::map<std::tuple<std::string, int, int, int>, double> sent;  // (op, stage, replica, mb)
  for (const trace::Span& span : timeline.spans) {
    if (span.op == "SEND_F" || span.op == "SEND_B") {
      sent[{span.op, span.stage, span.rank / P, span.microbatch}] = span.start;
    }
  }
  for (trace::Span& span : timeline.spans) {
    const int d = span.rank / P;
    std::optional<double> send;
    if (span.op == "RECV_F" && ProcessBoundary(span.stage)) {
      if (auto it = sent.find({"SEND_F", span.stage - 1, d, span.microbatch}); it != sent.end()) {
        send = it->second;
      }
    } else if (span.op == "RECV_B") {
      if (auto it = sent.find({"SEND_B", span.stage + 1, d, span.microbatch}); it != sent.end()) {
        send = it->second;
      }
    }
    if (send.has_value()) span.start = std::min(span.end, std::max(span.start, *send));
  }
  return absl::OkStatus();
}

absl::Status Executor::BeforeDeviceWork(int replica, int rank) {
  if (!options_.exact_memory_accounting) return absl::OkStatus();
  for (int j : ranks_[replica * num_ranks() + rank]->same_device) {
    Rank& other = *ranks_[j];
    if (!other.free_pending) continue;
    PS_RETURN_IF_ERROR(AwaitEvent(*other.freed));
    other.free_pending = false;
  }
  return absl::OkStatus();
}

absl::Status Executor::AfterDeviceWork(int replica, int rank) {
  if (!options_.exact_memory_accounting) return absl::OkStatus();
  Rank& rk = *ranks_[replica * num_ranks() + rank];
  PS_RETURN_IF_ERROR(rk.freed->Record(*rk.compute));
  rk.free_pending = true;
  return absl::OkStatus();
}

absl::Status Executor::AllocateInput(int d, int s, int m) {
  Rank& rk = rank_of(d, s);
  Slot& sl = slot(d, s, m);
  if (input_bytes_[s] > 0) {
    PS_ASSIGN_OR_RETURN(sl.input, rk.device->Allocate(input_bytes_[s], *rk.compute));
  }
  sl.input_ready = true;
  return sl.alloc->Record(*rk.compute);
}

absl::Status Executor::IssueReceive(int d, int s, int m) {
  // Pull the previous stage's output into this micro-batch's input buffer once both
  // exist: the recv stream waits for the allocation and the producer's F. With the
  // allocation made before the rank's previous action, the copy runs during that action.
  // From a stage on the same rank the copy runs on the compute stream itself, where the
  // producer's F already precedes it: no hand-off between streams.
  Rank& rk = rank_of(d, s);
  Slot& sl = slot(d, s, m);
  if (ProcessBoundary(s)) {
    // From another process: its message, on the recv stream behind the allocation.
    PS_RETURN_IF_ERROR(rk.recv->Wait(*sl.alloc));
    PS_RETURN_IF_ERROR(sl.recv_start->Record(*rk.recv));
    PS_RETURN_IF_ERROR(EnqueueReceive(*rk.recv, schedule_.placement.RankOf(s - 1),
                                      Channel('f', s, d, m), sl.input.data(), input_bytes_[s]));
    PS_RETURN_IF_ERROR(sl.recv_end->Record(*rk.recv));
    sl.recv_issued = true;
    return absl::OkStatus();
  }
  Slot& prev = slot(d, s - 1, m);
  Rank& prk = rank_of(d, s - 1);
  const bool local = LocalBoundary(d, s);
  runtime::Stream& via = local ? *rk.compute : *rk.recv;
  if (!local) {
    PS_RETURN_IF_ERROR(via.Wait(*sl.alloc));
    PS_RETURN_IF_ERROR(via.Wait(*prev.f_end));
  }
  PS_RETURN_IF_ERROR(sl.recv_start->Record(via));
  PS_RETURN_IF_ERROR(
      transport_->Move({prk.device, local ? &via : prk.send.get(),
                        static_cast<std::byte*>(prev.boundary.data()) + regions_[s - 1].out},
                       {rk.device, &via, sl.input.data()}, work(d, s).input_bytes(), via));
  PS_RETURN_IF_ERROR(sl.recv_end->Record(via));
  sl.recv_issued = true;
  return absl::OkStatus();
}

absl::Status Executor::IssueForward(int d, int s, int m) {
  Rank& rk = rank_of(d, s);
  Slot& sl = slot(d, s, m);
  StageWork& w = work(d, s);
  runtime::Stream& compute = *rk.compute;
  PS_RETURN_IF_ERROR(BeforeDeviceWork(d, rk.rank));
  // The input buffer, unless the action before this F on the rank allocated it already.
  if (s > 0 && !sl.input_ready) PS_RETURN_IF_ERROR(AllocateInput(d, s, m));
  sl.input_ready = false;
  if (boundary_bytes_[s] > 0) {
    PS_ASSIGN_OR_RETURN(sl.boundary, rk.device->Allocate(boundary_bytes_[s], compute));
  }
  PS_ASSIGN_OR_RETURN(sl.stash, w.AllocateStash(compute));
  if (s > 0) {
    if (!sl.recv_issued) PS_RETURN_IF_ERROR(IssueReceive(d, s, m));
    sl.recv_issued = false;
    if (!LocalBoundary(d, s)) PS_RETURN_IF_ERROR(compute.Wait(*sl.recv_end));
  }
  PS_RETURN_IF_ERROR(sl.f_start->Record(compute));
  PS_RETURN_IF_ERROR(w.Forward(MakeIO(d, s, m), compute));
  PS_RETURN_IF_ERROR(sl.f_end->Record(compute));
  if (s + 1 < num_stages() && ProcessBoundary(s + 1)) {
    // To the next stage's process: the output, sent from the send stream once F is done.
    PS_RETURN_IF_ERROR(rk.send->Wait(*sl.f_end));
    PS_RETURN_IF_ERROR(sl.send_f_start->Record(*rk.send));
    PS_RETURN_IF_ERROR(EnqueueSend(*rk.send, schedule_.placement.RankOf(s + 1),
                                   Channel('f', s + 1, d, m),
                                   static_cast<std::byte*>(sl.boundary.data()) + regions_[s].out,
                                   static_cast<std::size_t>(sizes_[s].output)));
    PS_RETURN_IF_ERROR(sl.send_f_end->Record(*rk.send));
  }
  return AfterDeviceWork(d, rk.rank);
}

absl::Status Executor::IssueBackward(int d, int s, int m, bool input_only) {
  Rank& rk = rank_of(d, s);
  Slot& sl = slot(d, s, m);
  StageWork& w = work(d, s);
  runtime::Stream& compute = *rk.compute;
  PS_RETURN_IF_ERROR(BeforeDeviceWork(d, rk.rank));
  if (s + 1 < num_stages() && ProcessBoundary(s + 1)) {
    // The output gradient from the next stage's process, into the boundary buffer that
    // this micro-batch's F allocated, on the recv stream.
    PS_RETURN_IF_ERROR(rk.recv->Wait(*sl.f_end));
    PS_RETURN_IF_ERROR(sl.recv_b_start->Record(*rk.recv));
    PS_RETURN_IF_ERROR(
        EnqueueReceive(*rk.recv, schedule_.placement.RankOf(s + 1), Channel('b', s + 1, d, m),
                       static_cast<std::byte*>(sl.boundary.data()) + regions_[s].grad_out,
                       static_cast<std::size_t>(sizes_[s].output)));
    PS_RETURN_IF_ERROR(sl.recv_b_end->Record(*rk.recv));
    PS_RETURN_IF_ERROR(compute.Wait(*sl.recv_b_end));
  } else if (s + 1 < num_stages()) {
    PS_RETURN_IF_ERROR(compute.Wait(*slot(d, s + 1, m).send_end));
  }
  PS_RETURN_IF_ERROR(sl.b_start->Record(compute));
  const MicrobatchIO io = MakeIO(d, s, m);
  PS_RETURN_IF_ERROR(input_only ? w.BackwardInput(io, compute) : w.Backward(io, compute));
  PS_RETURN_IF_ERROR(sl.b_end->Record(compute));
  sl.split = input_only;
  if (s > 0 && ProcessBoundary(s)) {
    // To the previous stage's process: the input gradient, sent from the send stream.
    PS_RETURN_IF_ERROR(rk.send->Wait(*sl.b_end));
    PS_RETURN_IF_ERROR(sl.send_start->Record(*rk.send));
    PS_RETURN_IF_ERROR(EnqueueSend(
        *rk.send, schedule_.placement.RankOf(s - 1), Channel('b', s, d, m),
        static_cast<std::byte*>(sl.boundary.data()) + regions_[s].grad_in, w.input_bytes()));
    PS_RETURN_IF_ERROR(sl.send_end->Record(*rk.send));
  } else if (s > 0) {
    // Push the input gradient into the previous stage's boundary buffer (allocated at its
    // F, which precedes this B through the data dependencies).
    // (To a stage on the same rank: on the compute stream, right behind this action.)
    Slot& prev = slot(d, s - 1, m);
    Rank& prk = rank_of(d, s - 1);
    const bool local = LocalBoundary(d, s);
    runtime::Stream& via = local ? compute : *rk.send;
    if (!local) PS_RETURN_IF_ERROR(via.Wait(*sl.b_end));
    PS_RETURN_IF_ERROR(sl.send_start->Record(via));
    PS_RETURN_IF_ERROR(transport_->Move(
        {rk.device, &via, static_cast<std::byte*>(sl.boundary.data()) + regions_[s].grad_in},
        {prk.device, local ? &via : prk.recv.get(),
         static_cast<std::byte*>(prev.boundary.data()) + regions_[s - 1].grad_out},
        w.input_bytes(), via));
    PS_RETURN_IF_ERROR(sl.send_end->Record(via));
  }
  if (!input_only) PS_RETURN_IF_ERROR(Release(d, s, m));
  return AfterDeviceWork(d, rk.rank);
}

absl::Status Executor::IssueWeight(int d, int s, int m) {
  Rank& rk = rank_of(d, s);
  Slot& sl = slot(d, s, m);
  runtime::Stream& compute = *rk.compute;
  PS_RETURN_IF_ERROR(BeforeDeviceWork(d, rk.rank));
  PS_RETURN_IF_ERROR(sl.w_start->Record(compute));
  PS_RETURN_IF_ERROR(work(d, s).BackwardWeight(MakeIO(d, s, m), compute));
  PS_RETURN_IF_ERROR(sl.w_end->Record(compute));
  PS_RETURN_IF_ERROR(Release(d, s, m));
  return AfterDeviceWork(d, rk.rank);
}

absl::Status Executor::Release(int d, int s, int m) {
  // The micro-batch's last use on this stage is issued: free its memory in stream order.
  // The boundary buffer is also read by the outgoing gradient copy (stage > 0), so it is
  // freed on the send stream behind that copy (and behind this action, for a W after a
  // split I), which keeps the compute stream from waiting for the copy: the simulator
  // plans no such wait. Exact memory accounting keeps every free on the compute stream,
  // where the host awaits them (BeforeDeviceWork), and so does a copy to a stage on the
  // same rank, which ran on the compute stream.
  Rank& rk = rank_of(d, s);
  Slot& sl = slot(d, s, m);
  if (s > 0 && !options_.exact_memory_accounting && !LocalBoundary(d, s)) {
    if (sl.split) PS_RETURN_IF_ERROR(rk.send->Wait(*sl.w_end));
    PS_RETURN_IF_ERROR(sl.boundary.FreeAsync(*rk.send));
  } else {
    if (s > 0) PS_RETURN_IF_ERROR(rk.compute->Wait(*sl.send_end));
    // The send stream's message of the output to another process reads it too.
    if (sl.send_f_end) PS_RETURN_IF_ERROR(rk.compute->Wait(*sl.send_f_end));
    PS_RETURN_IF_ERROR(sl.boundary.FreeAsync(*rk.compute));
  }
  PS_RETURN_IF_ERROR(sl.input.FreeAsync(*rk.compute));
  if (sl.stash) {
    PS_RETURN_IF_ERROR(sl.stash->FreeAsync(*rk.compute));
    sl.stash.reset();
  }
  return absl::OkStatus();
}

absl::Status Executor::IssueAllReduce(int s) {
  const int D = num_replicas();
  std::vector<std::vector<GradientSpan>> grads(D);
  for (int d = 0; d < D; ++d) {
    Rank& rk = rank_of(d, s);
    Slot& last = slot(d, s, last_backward_mb_[s]);
    PS_RETURN_IF_ERROR(rk.comm->Wait(last_backward_is_w_[s] ? *last.w_end : *last.b_end));
    PS_RETURN_IF_ERROR(allreduce_start_[d * num_stages() + s]->Record(*rk.comm));
    grads[d] = work(d, s).gradients();
  }
  for (std::size_t k = 0; k < grads[0].size(); ++k) {
    std::vector<comm::ReducePart> parts;
    for (int d = 0; d < D; ++d) {
      parts.push_back({.data = grads[d][k].data, .stream = rank_of(d, s).comm.get()});
    }
    PS_RETURN_IF_ERROR(reducers_[s]->AllReduceAverage(parts, grads[0][k].count));
  }
  for (int d = 0; d < D; ++d) {
    PS_RETURN_IF_ERROR(allreduce_end_[d * num_stages() + s]->Record(*rank_of(d, s).comm));
  }
  return absl::OkStatus();
}

absl::Status Executor::IssueAction(const Issue& issue) {
  const Action& a = issue.action;
  if (a.op == Op::kAllReduce) return IssueAllReduce(a.stage);
  for (int d = 0; d < num_replicas(); ++d) {
    if (issue.prefetch_stage >= 0) {
      PS_RETURN_IF_ERROR(BeforeDeviceWork(d, issue.rank));
      PS_RETURN_IF_ERROR(AllocateInput(d, issue.prefetch_stage, issue.prefetch_mb));
    }
    switch (a.op) {
      case Op::kF:
        PS_RETURN_IF_ERROR(IssueForward(d, a.stage, a.microbatch));
        break;
      case Op::kB:
        PS_RETURN_IF_ERROR(IssueBackward(d, a.stage, a.microbatch, /*input_only=*/false));
        break;
      case Op::kI:
        PS_RETURN_IF_ERROR(IssueBackward(d, a.stage, a.microbatch, /*input_only=*/true));
        break;
      case Op::kW:
        PS_RETURN_IF_ERROR(IssueWeight(d, a.stage, a.microbatch));
        break;
      default:
        break;
    }
    // After this action's own receive (an F's), so that the recv stream keeps the
    // rank's order of F's; the copy waits only for the allocation made before this action.
    if (issue.prefetch_receive) {
      PS_RETURN_IF_ERROR(IssueReceive(d, issue.prefetch_stage, issue.prefetch_mb));
    }
  }
  return absl::OkStatus();
}

// ---- Hang watchdog ----------------------------------------------------------------
// The host never synchronizes a stream during a step: it polls events. "Progress" is any
// action's end event (or a stream's end-of-step event) completing since the last poll; a
// failed stream (Stream::status) or an NCCL asynchronous error ends the step at once.
// Actions on one rank's compute stream complete in program order, so each row keeps a
// cursor; an ALLREDUCE (comm stream) may complete after later compute actions and is
// skipped over while pending.

namespace {

using WatchClock = std::chrono::steady_clock;

double SecondsSince(WatchClock::time_point t) {
  return std::chrono::duration<double>(WatchClock::now() - t).count();
}

// Sleeps between polls: 0, 10 us, 20 us, ... up to `cap`; reset on progress. The
// default cap keeps a host thread that watches a long step nearly idle; AwaitStep
// lowers it once every action has completed, since then the poll that sees the
// optimizer steps end is the step's own end (with 1 ms that poll came a median 0.62 ms
// after the last optimizer step in train runs of bench's model; docs/benchmarks.md).
void Backoff(std::chrono::microseconds& wait,
             std::chrono::microseconds cap = std::chrono::microseconds(1000)) {
  if (wait.count() > 0) std::this_thread::sleep_for(wait);
  wait = std::min(cap, std::max(wait * 2, std::chrono::microseconds(10)));
}

bool Completed(runtime::Event* event) {
  absl::StatusOr<bool> done = event->Query();
  return !done.ok() || *done;  // a query error counts as done: the stream's status reports it
}

}  // namespace

runtime::Event* Executor::EndEvent(int replica, const Action& a) const {
  switch (a.op) {
    case Op::kF:
      return slot(replica, a.stage, a.microbatch).f_end.get();
    case Op::kB:
    case Op::kI:
      return slot(replica, a.stage, a.microbatch).b_end.get();
    case Op::kW:
      return slot(replica, a.stage, a.microbatch).w_end.get();
    case Op::kAllReduce:
      return data_parallel_size() > 1 ? allreduce_end_[replica * num_stages() + a.stage].get()
                                      : nullptr;
    default:
      return nullptr;  // lowered SEND/RECV markers: the executor's own transfers
  }
}

absl::Status Executor::AwaitEvent(runtime::Event& event) {
  const auto start = WatchClock::now();
  std::chrono::microseconds wait(0);
  while (!Completed(&event)) {
    const double waited = SecondsSince(start);
    if (options_.step_timeout_seconds > 0 && waited >= options_.step_timeout_seconds) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "step timed out: event '%s' did not complete within %.3g s (step timeout)", event.name(),
          waited));
    }
    Backoff(wait);
  }
  return absl::OkStatus();
}

absl::Status Executor::AwaitStep() {
  const int D = num_replicas(), P = num_ranks();
  for (auto& rk : ranks_) {
    if (rk == nullptr) continue;  // another process's
    const std::vector<runtime::Stream*> streams = rk->streams();
    for (int i = 0; i < 4; ++i) {
      absl::Status recorded = rk->drained[i]->Record(*streams[i]);
      if (!recorded.ok()) return AbortStep(recorded);
    }
  }
  // done[row][k]: action k of the row's rank program has completed; cursor[row]: the
  // first that has not.
  std::vector<std::vector<bool>> done(static_cast<std::size_t>(D) * P);
  std::vector<std::size_t> cursor(done.size(), 0);
  for (int d = 0; d < D; ++d) {
    for (int r = 0; r < P; ++r) {
      // Another process's rank is not watched here: its actions count as done.
      done[d * P + r].assign(schedule_.programs[r].size(), !runs_rank(r));
    }
  }
  std::vector<std::array<bool, 4>> drained(ranks_.size(), {false, false, false, false});
  auto last_progress = WatchClock::now();
  auto last_wait_look = last_progress;
  std::chrono::microseconds wait(0);
  // A failure anywhere: the first stream error, else the first all-reduce error.
  auto first_error = [this]() -> absl::Status {
    for (auto& rk : ranks_) {
      if (rk == nullptr) continue;
      for (runtime::Stream* stream : rk->streams()) PS_RETURN_IF_ERROR(stream->status());
    }
    for (auto& reducer : reducers_) {
      if (reducer != nullptr) PS_RETURN_IF_ERROR(reducer->AsyncError());
    }
    return absl::OkStatus();
  };
  for (;;) {
    if (absl::Status error = first_error(); !error.ok()) return AbortStep(error);
    bool progress = false;
    bool actions_done = true;  // every row's program has completed
    for (int d = 0; d < D; ++d) {
      for (int r = 0; r < P; ++r) {
        const std::vector<Action>& program = schedule_.programs[r];
        std::vector<bool>& row_done = done[d * P + r];
        std::size_t& c = cursor[d * P + r];
        for (std::size_t k = c; k < program.size(); ++k) {
          if (row_done[k]) continue;
          runtime::Event* end = EndEvent(d, program[k]);
          if (end == nullptr || Completed(end)) {
            row_done[k] = true;
            progress = progress || end != nullptr;
          } else if (program[k].op != Op::kAllReduce) {
            break;  // later compute actions of this rank cannot have completed
          }
        }
        while (c < program.size() && row_done[c]) ++c;
        actions_done = actions_done && c == program.size();
      }
    }
    bool all_drained = true;
    for (std::size_t j = 0; j < ranks_.size(); ++j) {
      if (ranks_[j] == nullptr) continue;
      for (int i = 0; i < 4; ++i) {
        if (drained[j][i]) continue;
        drained[j][i] = Completed(ranks_[j]->drained[i].get());
        progress = progress || drained[j][i];
        all_drained = all_drained && drained[j][i];
      }
    }
    if (all_drained) {
      // Read again: work that failed after the check above has set its error before its
      // stream's drained event completed.
      if (absl::Status error = first_error(); !error.ok()) return AbortStep(error);
      return absl::OkStatus();
    }
    // Waiting for another process's message is not this process's stall: the sender's
    // watchdog or failure (its Fail ends the receive), or the bootstrap's timeout and
    // heartbeat, end that wait. Looked at every 10 ms (a look queries every crossing's
    // events), so an own stall is timed from at most 10 ms before it began.
    if (options_.pipeline != nullptr && !progress &&
        WatchClock::now() - last_wait_look >= std::chrono::milliseconds(10)) {
      last_wait_look = WatchClock::now();
      if (WaitingForAnotherProcess()) last_progress = last_wait_look;
    }
    if (progress) {
      last_progress = WatchClock::now();
      wait = std::chrono::microseconds(0);
    } else if (const double stalled = SecondsSince(last_progress);
               options_.step_timeout_seconds > 0 && stalled >= options_.step_timeout_seconds &&
               !WaitingForAnotherProcess()) {
      return AbortStep(absl::DeadlineExceededError(Diagnose(done, stalled)));
    }
    Backoff(wait, std::chrono::microseconds(actions_done ? 100 : 1000));
  }
}

bool Executor::WaitingForAnotherProcess() const {
  if (options_.pipeline == nullptr) return false;
  const int S = num_stages();
  auto running = [](const std::unique_ptr<runtime::Event>& start,
                    const std::unique_ptr<runtime::Event>& end) {
    return start != nullptr && Completed(start.get()) && !Completed(end.get());
  };
  // An action of this process that started and has not finished is this process's stall,
  // even while a receive waits too: the other processes may be waiting for it in turn
  // (a cycle through the schedule, which no other watchdog would break).
  for (int d = 0; d < num_replicas(); ++d) {
    for (int s = 0; s < S; ++s) {
      if (!runs_stage(s)) continue;
      if (running(allreduce_start_[d * S + s], allreduce_end_[d * S + s])) return false;
      for (int m = 0; m < num_microbatches(); ++m) {
        const Slot& sl = slot(d, s, m);
        if (running(sl.f_start, sl.f_end) || running(sl.b_start, sl.b_end) ||
            running(sl.w_start, sl.w_end)) {
          return false;
        }
      }
    }
  }
  for (int d = 0; d < num_replicas(); ++d) {
    for (int s = 0; s < S; ++s) {
      if (!runs_stage(s)) continue;
      const bool from_before = ProcessBoundary(s);
      const bool from_after = s + 1 < S && ProcessBoundary(s + 1);
      if (!from_before && !from_after) continue;
      for (int m = 0; m < num_microbatches(); ++m) {
        const Slot& sl = slot(d, s, m);
        if (from_before && Completed(sl.recv_start.get()) && !Completed(sl.recv_end.get())) {
          return true;
        }
        if (from_after && Completed(sl.recv_b_start.get()) && !Completed(sl.recv_b_end.get())) {
          return true;
        }
      }
    }
  }
  return false;
}

std::string Executor::Diagnose(const std::vector<std::vector<bool>>& done,
                               double stalled_seconds) const {
  const int D = num_replicas(), P = num_ranks(), S = num_stages();
  auto row_name = [&](int d, int r) {
    return D > 1 ? absl::StrCat("rank ", r, " replica ", d) : absl::StrCat("rank ", r);
  };
  auto is_done = [&](runtime::Event* event) { return Completed(event); };
  auto producer = [&](int d, int stage, int mb, Op op) {
    return absl::StrCat(row_name(d, schedule_.placement.RankOf(stage)), " has not finished ",
                        scheduler::ToString(Action{stage, mb, op}));
  };
  // What `a` (the first unfinished action of row (d, r)) waits for.
  auto explain = [&](int d, const Action& a) -> std::string {
    const std::string name = scheduler::ToString(a);
    if (a.op == Op::kAllReduce) {
      runtime::Event* start = allreduce_start_[d * S + a.stage].get();
      if (is_done(start)) {
        std::vector<std::string> missing;
        for (int e = 0; e < D; ++e) {
          if (!is_done(allreduce_start_[e * S + a.stage].get())) {
            missing.push_back(absl::StrCat(e));
          }
        }
        return absl::StrCat(
            name, " waits in the all-reduce for ",
            missing.empty()
                ? std::string(options_.processes != nullptr && options_.processes->size() > 1
                                  ? "the other processes' replicas to arrive"
                                  : "the other replicas to finish it")
                : absl::StrCat("replica(s) ", absl::StrJoin(missing, ", "), " to arrive"));
      }
      const Slot& last = slot(d, a.stage, last_backward_mb_[a.stage]);
      runtime::Event* grad = last_backward_is_w_[a.stage] ? last.w_end.get() : last.b_end.get();
      return absl::StrCat(name, " waits for event '", grad->name(),
                          "' (the stage's last backward)");
    }
    const Slot& sl = slot(d, a.stage, a.microbatch);
    runtime::Event* start = a.op == Op::kF   ? sl.f_start.get()
                            : a.op == Op::kW ? sl.w_start.get()
                                             : sl.b_start.get();
    if (is_done(start)) {
      return absl::StrCat(name,
                          " started and has not finished (its stage callback or kernel has not "
                          "returned)");
    }
    if (a.op == Op::kF && ProcessBoundary(a.stage) && !is_done(sl.recv_end.get())) {
      return absl::StrCat(
          name, " waits for transfer RECV_F of micro-batch ", a.microbatch,
          ": the activation from process ",
          options_.pipeline->job_rank(process_of_rank(schedule_.placement.RankOf(a.stage - 1))),
          " has not come (channel '", Channel('f', a.stage, d, a.microbatch), "')");
    }
    if ((a.op == Op::kB || a.op == Op::kI) && a.stage + 1 < S && ProcessBoundary(a.stage + 1) &&
        !is_done(sl.recv_b_end.get())) {
      return absl::StrCat(
          name, " waits for transfer RECV_B of micro-batch ", a.microbatch,
          ": the gradient from process ",
          options_.pipeline->job_rank(process_of_rank(schedule_.placement.RankOf(a.stage + 1))),
          " has not come (channel '", Channel('b', a.stage + 1, d, a.microbatch), "')");
    }
    if (a.op == Op::kF && a.stage > 0 && !ProcessBoundary(a.stage) && !is_done(sl.recv_end.get())) {
      const Slot& prev = slot(d, a.stage - 1, a.microbatch);
      if (!is_done(prev.f_end.get())) {
        return absl::StrCat(name, " waits for transfer RECV_F of micro-batch ", a.microbatch,
                            ": event '", prev.f_end->name(), "' not reached (",
                            producer(d, a.stage - 1, a.microbatch, Op::kF), ")");
      }
      return absl::StrCat(name, " waits for transfer RECV_F of micro-batch ", a.microbatch,
                          " (event '", sl.recv_end->name(), "' not reached: the copy has not run)");
    }
    if ((a.op == Op::kB || a.op == Op::kI) && a.stage + 1 < S && !ProcessBoundary(a.stage + 1)) {
      const Slot& next = slot(d, a.stage + 1, a.microbatch);
      if (!is_done(next.send_end.get())) {
        if (!is_done(next.b_end.get())) {
          const Op op = next.split ? Op::kI : Op::kB;
          return absl::StrCat(name, " waits for transfer SEND_B of micro-batch ", a.microbatch,
                              ": event '", next.b_end->name(), "' not reached (",
                              producer(d, a.stage + 1, a.microbatch, op), ")");
        }
        return absl::StrCat(name, " waits for transfer SEND_B of micro-batch ", a.microbatch,
                            " (event '", next.send_end->name(),
                            "' not reached: the copy has not run)");
      }
    }
    return absl::StrCat(name,
                        " has not started: earlier work on its compute stream has not "
                        "finished (event '",
                        start->name(), "' not reached)");
  };
  std::string out = absl::StrFormat(
      "step timed out: no action finished for %.3g s (step timeout %.3g s); the step was "
      "aborted. Blocked, per rank:",
      stalled_seconds, options_.step_timeout_seconds);
  for (int d = 0; d < D; ++d) {
    for (int r = 0; r < P; ++r) {
      if (!runs_rank(r)) continue;  // another process's: it diagnoses its own
      const std::vector<Action>& program = schedule_.programs[r];
      const std::vector<bool>& row_done = done[d * P + r];
      std::vector<std::string> blocked;
      for (std::size_t k = 0; k < program.size(); ++k) {
        if (row_done[k] || EndEvent(d, program[k]) == nullptr) continue;
        blocked.push_back(explain(d, program[k]));
        if (program[k].op != Op::kAllReduce) break;
      }
      absl::StrAppend(&out, "\n  ", row_name(d, r), ": ",
                      blocked.empty() ? std::string("all actions finished; a stream has not "
                                                    "reached its end of step (optimizer step)")
                                      : absl::StrJoin(blocked, "; "));
    }
  }
  return out;
}

// What an executor left behind when a host function of an abandoned step had not
// returned by its destruction: kept for the life of the process (reachable, so that leak
// checkers do not report it), because that function may still read or write any of it.
struct Executor::Kept {
  std::vector<std::unique_ptr<StageWork>> works;
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<std::unique_ptr<comm::AllReducer>> reducers;
  std::vector<runtime::Buffer> inputs, targets, losses;
};

namespace {

std::mutex& KeptMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

}  // namespace

bool Executor::AbandonedWorkReturned() {
  // As long as a stream's destructor would wait for it (Stream::kAbortGraceMillis).
  const auto start = WatchClock::now();
  std::chrono::microseconds wait(0);
  while (true) {
    std::erase_if(abandoned_events_, [](runtime::Event* e) { return Completed(e); });
    if (abandoned_events_.empty()) return true;
    if (SecondsSince(start) * 1000 >= runtime::Stream::kAbortGraceMillis) return false;
    Backoff(wait);
  }
}

void Executor::KeepWhatAbandonedWorkUses() {
  static std::vector<std::unique_ptr<Kept>>* kept = new std::vector<std::unique_ptr<Kept>>;
  auto k = std::make_unique<Kept>();
  k->works = std::move(works_);
  k->slots = std::move(slots_);
  k->reducers = std::move(reducers_);
  k->inputs = std::move(inputs_);
  k->targets = std::move(targets_);
  k->losses = std::move(losses_);
  std::lock_guard<std::mutex> lock(KeptMutex());
  kept->push_back(std::move(k));
}

absl::Status Executor::AbortStep(absl::Status why) {
  aborted_ = true;
  for (auto& reducer : reducers_) {
    if (reducer != nullptr) reducer->Abort();
  }
  // A host function blocked in Receive returns once the bootstrap is aborted.
  if (options_.pipeline != nullptr) options_.pipeline->Abort();
  for (auto& rk : ranks_) {
    if (rk == nullptr) continue;
    for (runtime::Stream* stream : rk->streams()) stream->Abort(why);
  }
  // Aborted streams drain at once (event records only) unless a host function does
  // not return: wait for them a bounded time, polling, then leave them to their
  // destructors (runtime::Stream::Abort).
  const auto start = WatchClock::now();
  std::vector<runtime::Event*> pending;
  for (auto& rk : ranks_) {
    if (rk == nullptr) continue;
    const std::vector<runtime::Stream*> streams = rk->streams();
    for (int i = 0; i < 4; ++i) {
      if (rk->drained[i]->Record(*streams[i]).ok()) pending.push_back(rk->drained[i].get());
    }
  }
  std::chrono::microseconds wait(0);
  while (!pending.empty()) {
    std::erase_if(pending, [](runtime::Event* e) { return Completed(e); });
    if (pending.empty()) break;
    if (SecondsSince(start) * 1000 >= runtime::Stream::kAbortGraceMillis) {
      abandoned_ = true;
      abandoned_events_ = pending;
      break;
    }
    Backoff(wait);
  }
  return why;
}

absl::Status Executor::SynchronizeAll() {
  absl::Status first = absl::OkStatus();
  for (auto& rk : ranks_) {
    if (rk == nullptr) continue;
    for (runtime::Stream* s : {rk->compute.get(), rk->recv.get(), rk->send.get(), rk->comm.get()}) {
      if (s == nullptr) continue;
      absl::Status status = s->Synchronize();
      if (first.ok() && !status.ok()) first = status;
    }
  }
  return first;
}

absl::StatusOr<StepResult> Executor::Step(const StepInputs& inputs) {
  // An aborted step may have left a host function running that a new step's first
  // synchronisation would wait on forever; any failed step left failed streams.
  if (!failed_step_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a previous step of this executor failed (", failed_step_.message(),
        JobOf(options_) != nullptr ? "): the job of several processes has failed; start it again"
                                   : "): its streams stay failed; make a new Executor"));
  }
  absl::StatusOr<StepResult> result = RunStep(inputs);
  if (comm::Bootstrap* job = JobOf(options_); !result.ok() && job != nullptr) {
    // The other processes wait for this one's messages, its all-reduces, or its exchange
    // at the step's end: they stop now, with this reason. Its exchanges are out of step
    // from here.
    if (failed_step_.ok()) failed_step_ = result.status();
    job->Fail(std::string(result.status().message()));
  }
  return result;
}

absl::StatusOr<StepResult> Executor::RunStep(const StepInputs& inputs) {
  const int D = num_replicas(), S = num_stages(), M = num_microbatches(), P = num_ranks();
  const std::size_t in_bytes = static_cast<std::size_t>(M) * sizes_[0].input;
  const std::size_t tg_bytes = static_cast<std::size_t>(M) * sizes_[S - 1].target;
  if ((!inputs.inputs.empty() && inputs.inputs.data() == nullptr) ||
      (!inputs.targets.empty() && inputs.targets.data() == nullptr)) {
    return absl::InvalidArgumentError(
        "the step's inputs or targets are a null pointer with a size; give the data");
  }
  if (inputs.inputs.size() != D * in_bytes || inputs.targets.size() != D * tg_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step over ", D, " replica(s) x ", M, " micro-batches needs ", D * in_bytes,
                     " bytes of inputs and ", D * tg_bytes, " bytes of targets, got ",
                     inputs.inputs.size(), " and ", inputs.targets.size()));
  }
  for (int d = 0; d < D; ++d) {
    if (runs_stage(0)) {
      PS_RETURN_IF_ERROR(rank_of(d, 0).device->CopyFromHost(
          inputs_[d].data(), inputs.inputs.data() + d * in_bytes, in_bytes));
    }
    if (runs_stage(S - 1)) {
      PS_RETURN_IF_ERROR(rank_of(d, S - 1).device->CopyFromHost(
          targets_[d].data(), inputs.targets.data() + d * tg_bytes, tg_bytes));
    }
  }
  std::map<runtime::Device*, std::int64_t> baseline;
  for (auto& rk : ranks_) {
    if (rk == nullptr || baseline.count(rk->device)) continue;
    rk->device->ResetPeakMemory();
    baseline[rk->device] = rk->device->memory_stats().current_bytes;
  }

  PS_RETURN_IF_ERROR(MarkStepOrigins());
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status issued = [&]() -> absl::Status {
    for (int d = 0; d < D; ++d) {
      for (int s = 0; s < S; ++s) {
        if (!runs_stage(s)) continue;
        runtime::Stream& compute = *rank_of(d, s).compute;
        PS_RETURN_IF_ERROR(phases_[d * S + s].zero_start->Record(compute));
        PS_RETURN_IF_ERROR(work(d, s).ZeroGrad(compute));
        PS_RETURN_IF_ERROR(phases_[d * S + s].zero_end->Record(compute));
      }
    }
    issue_times_.assign(order_.size(), 0);
    for (std::size_t k = 0; k < order_.size(); ++k) {
      issue_times_[k] = SteadyMicros();
      PS_RETURN_IF_ERROR(IssueAction(order_[k]));
    }
    for (int d = 0; d < D; ++d) {
      for (int s = 0; s < S; ++s) {
        if (!runs_stage(s)) continue;
        Rank& rk = rank_of(d, s);
        if (data_parallel_size() > 1) {
          PS_RETURN_IF_ERROR(rk.compute->Wait(*allreduce_end_[d * S + s]));
        }
        PS_RETURN_IF_ERROR(phases_[d * S + s].opt_start->Record(*rk.compute));
        PS_RETURN_IF_ERROR(work(d, s).OptimizerStep(*rk.compute));
        PS_RETURN_IF_ERROR(phases_[d * S + s].opt_end->Record(*rk.compute));
      }
    }
    return absl::OkStatus();
  }();
  absl::Status synced = issued.ok() ? AwaitStep() : AbortStep(issued);
  const auto t1 = std::chrono::steady_clock::now();
  for (auto& rk : ranks_) {
    if (rk != nullptr) rk->free_pending = false;
  }
  if (!issued.ok() || !synced.ok()) {
    failed_step_ = issued.ok() ? synced : issued;  // (Step tells the job's other processes)
    // Drop what a failed step left behind, once its streams are idle. Not when a host
    // function was abandoned still running: it may use any of these buffers (and on CUDA
    // freeing one now would wait for it, forever for one that never returns); they stay
    // for the destructor, which keeps them if it has not returned by then.
    if (!abandoned_) {
      for (auto& sl : slots_) {
        if (sl == nullptr) continue;
        sl->input = runtime::Buffer();
        sl->input_ready = false;
        sl->recv_issued = false;
        sl->boundary = runtime::Buffer();
        sl->stash.reset();
      }
    }
    return issued.ok() ? synced : issued;
  }

  StepResult result;
  result.step_micros = std::chrono::duration<double, std::micro>(t1 - t0).count();
  double loss_sum = 0;
  if (runs_stage(S - 1)) {
    for (int d = 0; d < D; ++d) {
      std::vector<float> losses(M);
      PS_RETURN_IF_ERROR(rank_of(d, S - 1).device->CopyToHost(losses.data(), losses_[d].data(),
                                                              sizeof(float) * M));
      for (float l : losses) loss_sum += l;
    }
  }
  for (int row = 0; row < D * P; ++row) {
    if (ranks_[row] == nullptr) {  // another process's
      result.peak_activation_bytes.push_back(0);
      result.device_of_row.push_back(-1);
      continue;
    }
    runtime::Device* device = ranks_[row]->device;
    result.peak_activation_bytes.push_back(device->memory_stats().peak_bytes - baseline[device]);
    result.device_of_row.push_back(ranks_[row]->clock);  // clocks_: one per distinct device
  }
  double origin = 0;
  PS_ASSIGN_OR_RETURN(result.timeline,
                      CollectTimeline(&origin, &result.issue_micros, &result.phases));
  result.origin_micros = origin;
  if (options_.pipeline != nullptr) {
    // The processes' exchanges are out of step after a failed one: no more steps.
    if (absl::Status merged = MergeAcrossProcesses(result, origin, loss_sum); !merged.ok()) {
      failed_step_ = merged;
      return merged;
    }
  }
  result.loss = loss_sum / (static_cast<double>(D) * M);
  return result;
}

absl::Status Executor::MarkStepOrigins() {
  // Each origin is recorded on an idle stream between two host clock reads: it completed
  // at their midpoint, to half the round trip (host: the record completes on the calling
  // thread; CUDA: a record and a synchronize, microseconds). Spans timed from it are then
  // on the host's steady clock, where the issue times are, and within a step a device's
  // spans are all intervals from one event: on CUDA, cudaEventElapsedTime's float
  // milliseconds over one step keep nanoseconds, and consecutive events of a stream keep
  // their order (rounding is monotone).
  // A preemption between the two reads widens the error: record again (the last record
  // is the one that counts) until a round trip is short, a few tries at most.
  // Host backend: every device's events stamp one steady clock (TimestampMicros), so only
  // the first origin needs a midpoint and the others are placed from it exactly: a span
  // that waited for another device's event then never starts before that event's time
  // (under ASan a 0.1 us disagreement between two midpoints did exactly that). CUDA
  // devices' timestamps agree only to tens of microseconds: each gets its own midpoint.
  constexpr double kGoodRoundTripMicros = 50;
  if (clocks_.empty()) return absl::OkStatus();
  const bool one_clock = clocks_[0].stream->device().kind() == runtime::BackendKind::kHost;
  for (std::size_t i = 0; i < clocks_.size(); ++i) {
    Clock& clock = clocks_[i];
    if (one_clock && i > 0) {
      PS_RETURN_IF_ERROR(clock.origin->Record(*clock.stream));
      PS_RETURN_IF_ERROR(clock.origin->Synchronize());
      PS_ASSIGN_OR_RETURN(const double first, clocks_[0].origin->TimestampMicros());
      PS_ASSIGN_OR_RETURN(const double at, clock.origin->TimestampMicros());
      clock.origin_micros = clocks_[0].origin_micros + (at - first);
      continue;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      const double before = SteadyMicros();
      PS_RETURN_IF_ERROR(clock.origin->Record(*clock.stream));
      PS_RETURN_IF_ERROR(clock.origin->Synchronize());
      const double after = SteadyMicros();
      clock.origin_micros = (before + after) / 2;
      if (after - before < kGoodRoundTripMicros) break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<trace::Timeline> Executor::CollectTimeline(double* origin_micros,
                                                          std::vector<double>* issue_micros,
                                                          std::vector<trace::Span>* phases) const {
  const int D = num_replicas(), S = num_stages(), M = num_microbatches(), P = num_ranks();
  trace::Timeline timeline;
  const int V = schedule_.num_chunks();
  timeline.name = absl::StrCat(schedule_.name, " P=", P, V > 1 ? absl::StrCat(" V=", V) : "",
                               " M=", M, D > 1 ? absl::StrCat(" D=", D) : "", " (measured)");
  timeline.time_unit = "us";
  timeline.num_ranks = P * D;
  timeline.ranks_per_replica = D > 1 ? P : 0;  // drawn as "replica d rank r"
  double issued = 0;                           // of the action being collected, steady-clock us
  // An event of `row`'s device on the steady clock, through its step origin.
  auto stamp = [&](int row, const runtime::Event& event) -> absl::StatusOr<double> {
    const Clock& clock = clocks_[ranks_[row]->clock];
    PS_ASSIGN_OR_RETURN(double ms, event.ElapsedMillis(*clock.origin));
    return clock.origin_micros + ms * 1000;
  };
  auto add = [&](int row, int lane, int stage, int mb, std::string op, const runtime::Event& start,
                 const runtime::Event& end) -> absl::Status {
    PS_ASSIGN_OR_RETURN(double t_start, stamp(row, start));
    PS_ASSIGN_OR_RETURN(double t_end, stamp(row, end));
    timeline.spans.push_back(trace::Span{.rank = row,
                                         .lane = lane,
                                         .stage = stage,
                                         .microbatch = mb,
                                         .op = std::move(op),
                                         .start = t_start,
                                         .end = std::max(t_start, t_end)});
    if (issue_micros != nullptr) issue_micros->push_back(issued);
    return absl::OkStatus();
  };
  for (const Issue& issue : order_) {
    const Action& a = issue.action;
    issued = issue_times_.empty() ? 0 : issue_times_[&issue - order_.data()];
    for (int d = 0; d < D; ++d) {
      const int row = d * P + issue.rank;
      if (a.op == Op::kAllReduce) {
        PS_RETURN_IF_ERROR(add(row, trace::kCommLane, a.stage, -1, "ALLREDUCE",
                               *allreduce_start_[d * S + a.stage],
                               *allreduce_end_[d * S + a.stage]));
        continue;
      }
      const Slot& sl = slot(d, a.stage, a.microbatch);
      switch (a.op) {
        case Op::kF:
          if (a.stage > 0) {
            // Issued with the action before the F, perhaps: that action's issue time.
            const double f_issued = issued;
            if (!issue_times_.empty()) issued = issue_times_[issue.receive_issue];
            PS_RETURN_IF_ERROR(add(row, trace::kRecvLane, a.stage, a.microbatch, "RECV_F",
                                   *sl.recv_start, *sl.recv_end));
            issued = f_issued;
          }
          PS_RETURN_IF_ERROR(
              add(row, trace::kComputeLane, a.stage, a.microbatch, "F", *sl.f_start, *sl.f_end));
          if (sl.send_f_start) {  // to the next stage's process
            PS_RETURN_IF_ERROR(add(row, trace::kSendLane, a.stage, a.microbatch, "SEND_F",
                                   *sl.send_f_start, *sl.send_f_end));
          }
          break;
        case Op::kB:
        case Op::kI:
          if (sl.recv_b_start) {  // from the next stage's process
            PS_RETURN_IF_ERROR(add(row, trace::kRecvLane, a.stage, a.microbatch, "RECV_B",
                                   *sl.recv_b_start, *sl.recv_b_end));
          }
          PS_RETURN_IF_ERROR(add(row, trace::kComputeLane, a.stage, a.microbatch,
                                 a.op == Op::kB ? "B" : "I", *sl.b_start, *sl.b_end));
          if (a.stage > 0) {
            PS_RETURN_IF_ERROR(add(row, trace::kSendLane, a.stage, a.microbatch, "SEND_B",
                                   *sl.send_start, *sl.send_end));
          }
          break;
        case Op::kW:
          PS_RETURN_IF_ERROR(
              add(row, trace::kComputeLane, a.stage, a.microbatch, "W", *sl.w_start, *sl.w_end));
          break;
        default:
          break;
      }
    }
  }
  double origin = std::numeric_limits<double>::infinity();
  for (const trace::Span& span : timeline.spans) origin = std::min(origin, span.start);
  if (timeline.spans.empty()) origin = 0;
  *origin_micros = origin;
  for (trace::Span& span : timeline.spans) {
    span.start -= origin;
    span.end -= origin;
  }
  if (phases != nullptr) {
    phases->clear();
    for (int d = 0; d < D; ++d) {
      for (int s = 0; s < S; ++s) {
        if (!runs_stage(s)) continue;
        const int row = d * P + schedule_.placement.RankOf(s);
        const PhaseEvents& e = phases_[d * S + s];
        for (const auto& [op, start, end] :
             {std::tuple{"ZERO_GRAD", e.zero_start.get(), e.zero_end.get()},
              std::tuple{"OPTIMIZER", e.opt_start.get(), e.opt_end.get()}}) {
          PS_ASSIGN_OR_RETURN(double t_start, stamp(row, *start));
          PS_ASSIGN_OR_RETURN(double t_end, stamp(row, *end));
          phases->push_back(trace::Span{.rank = row,
                                        .lane = trace::kComputeLane,
                                        .stage = s,
                                        .microbatch = -1,
                                        .op = op,
                                        .start = t_start - origin,
                                        .end = std::max(t_start, t_end) - origin});
        }
      }
    }
  }
  if (issue_micros != nullptr) {
    for (double& t : *issue_micros) t -= origin;
  }
  return timeline;
}

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

absl::StatusOr<scheduler::CostModel> MeasuredCostModel(
    const std::vector<const trace::Timeline*>& timelines, const Executor& executor,
    const std::vector<const std::vector<trace::Span>*>& phases) {
  const int S = executor.num_stages();
  std::vector<std::map<std::string, std::vector<double>>> by_stage(S);
  std::vector<std::vector<double>> transfers(std::max(S - 1, 0));
  auto add = [&](const std::vector<trace::Span>& spans) {
    for (const trace::Span& span : spans) {
      if (span.stage < 0 || span.stage >= S) continue;
      const double duration = span.end - span.start;
      // A span that does not take a finite, non-negative time is not a measurement.
      if (!(duration >= 0) || !std::isfinite(duration)) continue;
      if (span.op == "RECV_F" || span.op == "SEND_B") {
        // Between processes a SEND_B only posts the message: the RECV_B times its transfer.
        if (span.op == "SEND_B" && executor.ProcessBoundary(span.stage)) continue;
        if (span.stage > 0) transfers[span.stage - 1].push_back(duration);
      } else if (span.op == "RECV_B") {
        if (span.stage + 1 < S) transfers[span.stage].push_back(duration);
      } else if (span.op != "SEND_F") {
        by_stage[span.stage][span.op].push_back(duration);
      }
    }
  };
  for (const trace::Timeline* timeline : timelines) {
    if (timeline != nullptr) add(timeline->spans);  // null entries are skipped
  }
  for (const std::vector<trace::Span>* spans : phases) {
    if (spans != nullptr) add(*spans);
  }
  scheduler::CostModel costs;
  // The timelines' clock ("us" for the executor's): a simulation of these costs keeps it.
  for (const trace::Timeline* timeline : timelines) {
    if (timeline != nullptr) {
      costs.time_unit = timeline->time_unit;
      break;
    }
  }
  std::vector<double> all_transfers;
  for (int s = 0; s < S; ++s) {
    scheduler::StageCosts c;
    auto& ops = by_stage[s];
    const bool has_b = !ops["B"].empty(), has_iw = !ops["I"].empty() && !ops["W"].empty();
    if (ops["F"].empty() || (!has_b && !has_iw)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the timelines hold no measured ", ops["F"].empty() ? "F" : "backward (B, or I and W)",
          " of stage ", s, " of ", S,
          ": give the timelines of steps this executor ran (StepResult::timeline)"));
    }
    c.f = Median(ops["F"]);
    if (has_iw) {
      c.i = Median(ops["I"]);
      c.w = Median(ops["W"]);
    }
    if (has_b) c.b = Median(ops["B"]);
    if (has_b && !has_iw) {
      c.i = c.w = c.b / 2;
      // With recomputation a B runs F again first, which a split would put in I.
      if (executor.recomputes(s)) {
        c.w = std::max(0.0, c.b - c.f) / 2;
        c.i = c.b - c.w;
      }
    }
    if (has_iw && !has_b) c.b = c.i + c.w;
    c.allreduce = Median(ops["ALLREDUCE"]);
    c.zero_grad = Median(ops["ZERO_GRAD"]);
    c.optimizer = Median(ops["OPTIMIZER"]);
    costs.stages.push_back(executor.WithMemoryCosts(s, c));
  }
  for (const auto& t : transfers) {
    costs.comm.push_back(Median(t));
    all_transfers.insert(all_transfers.end(), t.begin(), t.end());
  }
  costs.comm_uniform = Median(all_transfers);
  if (!costs.stages.empty()) costs.uniform = costs.stages.back();
  return costs;
}

}  // namespace pipesched::stages
