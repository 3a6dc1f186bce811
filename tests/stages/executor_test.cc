// Executor with the toy StageWork (tests/stages/toy_stage_work.h) on the strict host
// backend: every schedule x P x D x M trains exactly like plain sequential training;
// the measured timeline has one span per action and respects the dependencies; peak
// activation memory equals the simulator's; failures and bad configurations are errors,
// never hangs.
#include "pipesched/stages/executor.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/bubble_analysis.h"
#include "pipesched/trace/stats.h"
#include "stages/schedule_cases.h"
#include "stages/toy_stage_work.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using testing::AsInputs;
using ::testing::HasSubstr;
using testing::SleepyWork;
using testing::ToyData;
using testing::ToyFactory;
using testing::ToyOptions;
using testing::ToyReference;
using testing::ToyStage;

std::unique_ptr<runtime::Backend> HostBackend(int devices) {
  auto backend = runtime::CreateBackend(
      {.kind = runtime::BackendKind::kHost, .num_devices = devices, .strict = true});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(backend).value();
}

// Every stage a SleepyWork of these times (us).
StageWorkFactory SleepyFactory(double micros, double zero_grad_micros = 0,
                               double optimizer_micros = 0) {
  return [=](int, int, runtime::Device&) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    return std::make_unique<SleepyWork>(micros, zero_grad_micros, optimizer_micros);
  };
}

using Case = testing::ScheduleCase;

std::vector<Case> AllCases() { return testing::AllScheduleCases(); }

TEST(ExecutorToyTest, EveryScheduleTrainsLikeSequentialTraining) {
  const std::vector<Case> cases = AllCases();
  ASSERT_GE(cases.size(), 40u);
  ToyOptions options{.features = 3, .batch = 2, .lr = 0.05f};
  const std::size_t n = 6;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.Name());
    PS_ASSERT_OK_AND_ASSIGN(scheduler::Schedule schedule, testing::GenerateCase(c));
    const int stages = schedule.num_stages();
    auto backend = HostBackend(c.p * c.d);
    PS_ASSERT_OK_AND_ASSIGN(
        auto ex,
        Executor::Create(schedule, *backend, ToyFactory(stages, options), {.num_replicas = c.d}));
    ToyReference ref(stages, options);
    std::vector<float> x, t;
    for (int step = 0; step < 3; ++step) {
      ToyData(step, c.d * c.m, n, x, t);
      PS_ASSERT_OK_AND_ASSIGN(StepResult r, ex->Step(AsInputs(x, t)));
      ref.Step(x, t, c.d * c.m);
      EXPECT_TRUE(std::isfinite(r.loss));
    }
    for (int d = 0; d < c.d; ++d) {
      for (int s = 0; s < stages; ++s) {
        auto& toy = static_cast<ToyStage&>(ex->work(d, s));
        EXPECT_NEAR(toy.a(), ref.a[s], 1e-5 * std::abs(ref.a[s]) + 1e-7) << "stage " << s;
        EXPECT_NEAR(toy.b(), ref.b[s], 1e-5 * std::abs(ref.b[s]) + 1e-7) << "stage " << s;
      }
    }
    ex.reset();
  }
}

TEST(ExecutorToyTest, TimelineHasEverySpanInDependencyOrder) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  auto backend = HostBackend(4);
  PS_ASSERT_OK_AND_ASSIGN(
      auto ex, Executor::Create(schedule, *backend, ToyFactory(2, {}), {.num_replicas = 2}));
  std::vector<float> x, t;
  ToyData(0, 8, 8, x, t);
  PS_ASSERT_OK_AND_ASSIGN(StepResult r, ex->Step(AsInputs(x, t)));
  const trace::Timeline& tl = r.timeline;
  EXPECT_EQ(tl.time_unit, "us");
  EXPECT_EQ(tl.num_ranks, 4);
  EXPECT_THAT(tl.name, HasSubstr("(measured)"));
  std::map<std::string, int> count;
  std::map<std::tuple<int, int, int, std::string>, trace::Span> by_key;  // row, stage, mb, op
  auto at = [&by_key](int row, int stage, int mb, const char* op) {
    return by_key[std::make_tuple(row, stage, mb, std::string(op))];
  };
  for (const trace::Span& s : tl.spans) {
    ++count[s.op];
    by_key[std::make_tuple(s.rank, s.stage, s.microbatch, s.op)] = s;
    EXPECT_LE(s.start, s.end);
    EXPECT_GE(s.start, 0);
  }
  // 2 replicas x (2 stages x 4 mb F and B) + 2 x 4 transfers each way + 2 x 2 all-reduces.
  EXPECT_EQ(count["F"], 16);
  EXPECT_EQ(count["B"], 16);
  EXPECT_EQ(count["RECV_F"], 8);
  EXPECT_EQ(count["SEND_B"], 8);
  EXPECT_EQ(count["ALLREDUCE"], 4);
  for (int d = 0; d < 2; ++d) {
    for (int m = 0; m < 4; ++m) {
      const int r0 = d * 2, r1 = d * 2 + 1;
      EXPECT_LE(at(r0, 0, m, "F").end, at(r1, 1, m, "RECV_F").start + 1e-3);
      EXPECT_LE(at(r1, 1, m, "RECV_F").end, at(r1, 1, m, "F").start + 1e-3);
      EXPECT_LE(at(r1, 1, m, "B").end, at(r1, 1, m, "SEND_B").start + 1e-3);
      EXPECT_LE(at(r1, 1, m, "SEND_B").end, at(r0, 0, m, "B").start + 1e-3);
    }
    EXPECT_LE(at(d * 2, 0, 3, "B").end, at(d * 2, 0, -1, "ALLREDUCE").start + 1e-3);
  }
  // Compute spans of one row never overlap (one compute stream per rank).
  std::map<int, std::vector<std::pair<double, double>>> compute;
  for (const trace::Span& s : tl.spans) {
    if (s.lane == trace::kComputeLane) compute[s.rank].push_back({s.start, s.end});
  }
  for (auto& [row, spans] : compute) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
      EXPECT_LE(spans[i - 1].second, spans[i].first + 1e-3) << "row " << row;
    }
  }
  // Outside the actions, per (replica, stage): its zero-grad before its rank's first
  // action, its optimizer step after its rank's last action and its stage's all-reduce;
  // all of it within the step's wall time.
  ASSERT_EQ(r.phases.size(), 2u * 2 * 2);  // D x S x {ZERO_GRAD, OPTIMIZER}
  double first = 1e300, last = -1e300;
  for (const trace::Span& p : r.phases) {
    SCOPED_TRACE(::testing::PrintToString(std::make_tuple(p.op, p.rank, p.stage)));
    EXPECT_LE(p.start, p.end);
    EXPECT_EQ(p.stage, p.rank % 2);
    const auto& spans = compute[p.rank];
    if (p.op == "ZERO_GRAD") {
      EXPECT_LE(p.end, spans.front().first + 1e-3);
    } else {
      EXPECT_EQ(p.op, "OPTIMIZER");
      EXPECT_GE(p.start + 1e-3, spans.back().second);
      EXPECT_GE(p.start + 1e-3, at(p.rank, p.stage, -1, "ALLREDUCE").end);
    }
    first = std::min(first, p.start);
    last = std::max(last, p.end);
  }
  EXPECT_LT(first, 0);  // the zero-grads come before the first action, the timeline's 0
  EXPECT_LE(last - first, r.step_micros + 1);
  EXPECT_GT(r.step_micros, 0);
  EXPECT_GT(ex->actions_per_step(), 0);
}

// With exact accounting, the runtime's peak bytes per rank equal the simulator's
// peak_live_bytes for the executor's activation_bytes: GPipe holds M micro-batches,
// 1F1B holds min(P - r, M) on rank r.
TEST(ExecutorToyTest, PeakActivationBytesMatchTheSimulator) {
  for (const std::string name : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "interleaved-zb"}) {
    for (int p : {1, 2, 4}) {
      for (int m : {1, 4, 8}) {
        auto schedule = scheduler::GenerateSchedule(name, {.num_ranks = p, .num_microbatches = m});
        if (!schedule.ok()) continue;
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        const int stages = schedule->num_stages();
        auto backend = HostBackend(p);
        PS_ASSERT_OK_AND_ASSIGN(auto ex,
                                Executor::Create(*schedule, *backend, ToyFactory(stages, {}),
                                                 {.exact_memory_accounting = true}));
        scheduler::CostModel costs;
        for (int s = 0; s < stages; ++s) {
          costs.stages.push_back(
              {.activation_bytes = ex->activation_bytes(s), .input_bytes = ex->input_bytes(s)});
        }
        PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim, scheduler::Simulate(*schedule, costs));
        std::vector<float> x, t;
        ToyData(0, m, 8, x, t);
        for (int step = 0; step < 2; ++step) {
          PS_ASSERT_OK_AND_ASSIGN(StepResult r, ex->Step(AsInputs(x, t)));
          for (int rank = 0; rank < p; ++rank) {
            EXPECT_EQ(r.peak_activation_bytes[rank], sim.ranks[rank].peak_live_bytes)
                << "rank " << rank;
            if (name == "1f1b" && schedule->num_chunks() == 1) {
              // In the steady state a backward also holds the next F's received input.
              EXPECT_EQ(r.peak_activation_bytes[rank],
                        std::min(p - rank, m) * ex->activation_bytes(rank) +
                            (m > p - rank ? ex->input_bytes(rank) : 0));
            }
            if (name == "gpipe") {
              EXPECT_EQ(r.peak_activation_bytes[rank], m * ex->activation_bytes(rank));
            }
          }
        }
      }
    }
  }
}

// Each stage's zero-grad and optimizer step are timed around their own work: 1F1B, P=2,
// M=2, actions of 1 ms, zero-grads of 2 ms and optimizer steps of 3 ms. The measured
// phases last at least that, the step holds them, and the simulator fed with them
// predicts a step that long.
TEST(ExecutorTimingTest, ZeroGradAndOptimizerStepAreTimedAndPredicted) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 2}));
  auto backend = HostBackend(2);
  PS_ASSERT_OK_AND_ASSIGN(auto ex,
                          Executor::Create(schedule, *backend, SleepyFactory(1000, 2000, 3000)));
  std::vector<float> x(2, 1.0f), t(2, 0.0f);
  PS_ASSERT_OK_AND_ASSIGN(StepResult r, ex->Step(AsInputs(x, t)));
  ASSERT_EQ(r.phases.size(), 4u);
  for (const trace::Span& p : r.phases) {
    EXPECT_GE(p.end - p.start, p.op == "ZERO_GRAD" ? 2000 : 3000) << p.op << " " << p.stage;
  }
  const double makespan = trace::ComputeBubbleStats(r.timeline, 2).makespan;
  EXPECT_GE(r.step_micros, makespan + 2000 + 3000);
  PS_ASSERT_OK_AND_ASSIGN(scheduler::CostModel costs,
                          MeasuredCostModel({&r.timeline}, *ex, {&r.phases}));
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim, scheduler::Simulate(ex->schedule(), costs));
  EXPECT_GE(sim.step_time, sim.makespan + 2000 + 3000);
  // The step's own durations, phases, hand-offs and gaps (none longer than measured)
  // replay within it: the step holds host time too. (The plan from the medians is no
  // such bound: a median of two can be the longer sample. Under tsan it came out 1.2%
  // above the step once.)
  costs.action_gap = 0;
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis idle, AnalyzeIdle(r.timeline, r.issue_micros, 2));
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::SimResult replay,
      scheduler::Simulate(
          ex->schedule(),
          WithPhaseDurations(WithHandoffs(WithActionDurations(costs, r.timeline, 2), idle),
                             r.phases, 2)));
  EXPECT_GE(replay.step_time, replay.makespan + 2000 + 3000);
  EXPECT_LE(replay.step_time, r.step_micros * (1 + 1e-9));
}

// The receive of an F overlaps the compute action before it on the consumer's rank: 1F1B,
// P=2, M=3, every F, I and W 20 ms (a B is I + W, 40 ms). Rank 0 finishes F(0,1) at ~40
// ms, when rank 1 starts B(1,0); rank 1's F(1,1) input buffer was allocated before that
// B, so RECV_F(1,1) runs at once and ends ~40 ms before the B does. (Allocated at the F,
// the copy could only start when the B ended, and the F waited for it.)
TEST(ExecutorTimingTest, TheReceiveOfAnFOverlapsTheActionBeforeIt) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 3}));
  // Also when the host issues one action ahead of the streams (exact accounting): the
  // receive is issued right after B(1,0), not with F(1,1), once B(1,0) has run.
  for (const bool exact : {false, true}) {
    SCOPED_TRACE(exact ? "exact memory accounting" : "host issuing ahead");
    auto backend = HostBackend(2);
    PS_ASSERT_OK_AND_ASSIGN(auto ex, Executor::Create(schedule, *backend, SleepyFactory(20000),
                                                      {.exact_memory_accounting = exact}));
    EXPECT_EQ(ex->input_bytes(0), 0);
    EXPECT_EQ(ex->input_bytes(1), 4);
    std::vector<float> x(3, 1.0f), t(3, 0.0f);
    PS_ASSERT_OK_AND_ASSIGN(StepResult r, ex->Step(AsInputs(x, t)));
    auto find = [&](const std::string& op, int stage, int mb) -> const trace::Span* {
      for (const trace::Span& s : r.timeline.spans) {
        if (s.op == op && s.stage == stage && s.microbatch == mb) return &s;
      }
      return nullptr;
    };
    const trace::Span* recv = find("RECV_F", 1, 1);
    const trace::Span* before = find("B", 1, 0);
    const trace::Span* forward = find("F", 1, 1);
    ASSERT_NE(recv, nullptr);
    ASSERT_NE(before, nullptr);
    ASSERT_NE(forward, nullptr);
    EXPECT_LT(recv->end, before->end - 10000)
        << "RECV_F(1,1) [" << recv->start << ", " << recv->end << "], B(1,0) [" << before->start
        << ", " << before->end << "]";
    EXPECT_GE(forward->start, before->end);
  }
}

// Stages next to each other on one rank exchange activations and gradients on its
// compute stream: zb-v's bottom of the V (stages P-1 and P on rank P-1), every boundary
// at P = 1; never across ranks, nor across replicas of one stage. (The contract tests
// check that training through those copies equals plain training.)
TEST(ExecutorToyTest, OnlyBoundariesWithinOneRankAreLocal) {
  auto local_boundaries = [](const std::string& name, int p, int v, int d) {
    auto schedule = scheduler::GenerateSchedule(
        name, {.num_ranks = p, .num_microbatches = 2 * p, .num_chunks = v});
    EXPECT_TRUE(schedule.ok()) << schedule.status();
    auto backend = HostBackend(p * d);
    auto ex = Executor::Create(*schedule, *backend, ToyFactory(p * v, {}), {.num_replicas = d});
    EXPECT_TRUE(ex.ok()) << ex.status();
    std::vector<int> local;
    for (int r = 0; r < d; ++r) {
      for (int s = 0; s < p * v; ++s) {
        if ((*ex)->LocalBoundary(r, s)) local.push_back(r * 100 + s);
      }
    }
    return local;
  };
  EXPECT_EQ(local_boundaries("zb-v", 2, 2, 1), std::vector<int>{2});
  EXPECT_EQ(local_boundaries("zb-v", 4, 2, 2), (std::vector<int>{4, 104}));
  EXPECT_EQ(local_boundaries("interleaved-1f1b", 1, 2, 1), std::vector<int>{1});
  EXPECT_EQ(local_boundaries("interleaved-1f1b", 2, 2, 1), std::vector<int>{});
  EXPECT_EQ(local_boundaries("1f1b", 4, 1, 2), std::vector<int>{});
}

TEST(ExecutorToyTest, AFailingStageFailsTheStepWithoutHanging) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  auto backend = HostBackend(4);
  PS_ASSERT_OK_AND_ASSIGN(
      auto ex,
      Executor::Create(schedule, *backend, ToyFactory(2, {.fail_forward_of_microbatch = 2}),
                       {.num_replicas = 2}));
  std::vector<float> x, t;
  ToyData(0, 8, 8, x, t);
  EXPECT_THAT(ex->Step(AsInputs(x, t)),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("toy F of stage")));
  EXPECT_EQ(backend->device(0).memory_stats().current_bytes,
            backend->device(0).memory_stats().current_bytes);  // no crash on teardown
}

TEST(ExecutorToyTest, AStageWhoseWorkThrowsFailsTheStepLikeOneThatReturnsAnError) {
  // A user's StageWork that throws on its stream: the process ended (std::terminate).
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  auto backend = HostBackend(2);
  PS_ASSERT_OK_AND_ASSIGN(
      auto ex,
      Executor::Create(schedule, *backend,
                       ToyFactory(2, {.fail_forward_of_microbatch = 1, .throw_instead = true})));
  std::vector<float> x, t;
  ToyData(0, 4, 8, x, t);
  EXPECT_THAT(
      ex->Step(AsInputs(x, t)),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("work on the stream threw: toy F of stage")));
}

TEST(ExecutorToyTest, SizesAndDataThatCannotBeRightAreErrors) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("gpipe", {.num_ranks = 2, .num_microbatches = 2}));
  auto backend = HostBackend(2);
  // 2^62 bytes per micro-batch (features x batch x 4): a step's buffers would wrap 64 bits.
  EXPECT_THAT(
      Executor::Create(schedule, *backend, ToyFactory(2, {.features = 1 << 30, .batch = 1 << 30})),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("stage 0's input_bytes() is too large (4611686018427387904): a step's "
                         "D x M micro-batches of it must stay within 2^56 bytes")));
  EXPECT_THAT(Executor::Create(schedule, *backend, ToyFactory(2, {.stash_bytes = -8})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 0's stash_bytes() is negative (-8)")));
  // Data that is a null pointer with a size.
  PS_ASSERT_OK_AND_ASSIGN(auto ex, Executor::Create(schedule, *backend, ToyFactory(2, {})));
  std::vector<float> x, t;
  ToyData(0, 2, 8, x, t);
  StepInputs null_inputs = AsInputs(x, t);
  null_inputs.inputs =
      std::span<const std::byte>(static_cast<const std::byte*>(nullptr), null_inputs.inputs.size());
  EXPECT_THAT(ex->Step(null_inputs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the step's inputs or targets are a null pointer with a size")));
  PS_EXPECT_OK(ex->Step(AsInputs(x, t)).status());
}

TEST(ExecutorToyTest, BadConfigurationsAreErrors) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("gpipe", {.num_ranks = 2, .num_microbatches = 2}));
  auto backend = HostBackend(2);
  for (int replicas : {0, 4097}) {
    EXPECT_THAT(
        Executor::Create(schedule, *backend, ToyFactory(2, {}), {.num_replicas = replicas}),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr(absl::StrCat("the number of data-parallel replicas must be in [1, "
                                        "4096], not ",
                                        replicas))));
  }
  // Stage 0 outputs 3 x 2 floats, stage 1 expects 4 x 2.
  StageWorkFactory mismatched =
      [](int stage, int, runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    return std::make_unique<ToyStage>(stage, 2, ToyOptions{.features = stage == 0 ? 3 : 4}, device);
  };
  EXPECT_THAT(
      Executor::Create(schedule, *backend, mismatched),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("stage 0 outputs 24 bytes per micro-batch but stage 1 expects 32")));
  scheduler::Schedule broken = schedule;
  broken.programs[1].pop_back();
  EXPECT_FALSE(Executor::Create(broken, *backend, ToyFactory(2, {})).ok());
  EXPECT_THAT(
      Executor::Create(schedule, *backend, StageWorkFactory()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the stage factory is empty")));
  // Replica 1's micro-batches are twice replica 0's: its buffers, sized by replica 0's
  // works, would overflow (a heap overflow under ASan before it was refused).
  StageWorkFactory uneven_replicas =
      [](int stage, int replica,
         runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    return std::make_unique<ToyStage>(stage, 2, ToyOptions{.batch = replica == 0 ? 4 : 8}, device);
  };
  auto four_devices = HostBackend(4);
  EXPECT_THAT(Executor::Create(schedule, *four_devices, uneven_replicas, {.num_replicas = 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replica 1 of stage 0's input_bytes() is 128 but replica 0's is "
                                 "64: every replica runs the same stage")));

  PS_ASSERT_OK_AND_ASSIGN(auto ex, Executor::Create(schedule, *backend, ToyFactory(2, {})));
  std::vector<float> x(3), t(3);
  EXPECT_THAT(ex->Step(AsInputs(x, t)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes of inputs")));
}

TEST(ExecutorToyTest, MeasuredCostModelReplaysTheRun) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("zb-h1", {.num_ranks = 2, .num_microbatches = 4}));
  auto backend = HostBackend(2);
  PS_ASSERT_OK_AND_ASSIGN(auto ex, Executor::Create(schedule, *backend, ToyFactory(2, {})));
  std::vector<float> x, t;
  ToyData(0, 4, 8, x, t);
  PS_ASSERT_OK_AND_ASSIGN(StepResult r, ex->Step(AsInputs(x, t)));
  PS_ASSERT_OK_AND_ASSIGN(scheduler::CostModel costs, MeasuredCostModel({&r.timeline}, *ex));
  ASSERT_EQ(costs.stages.size(), 2u);
  for (const scheduler::StageCosts& c : costs.stages) {
    EXPECT_GT(c.f, 0);
    EXPECT_GT(c.i, 0);
    EXPECT_GT(c.w, 0);
    EXPECT_DOUBLE_EQ(c.b, c.i + c.w);
    EXPECT_GT(c.activation_bytes, 0);
  }
  ASSERT_EQ(costs.comm.size(), 1u);
  EXPECT_GT(costs.comm[0], 0);
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim, scheduler::Simulate(ex->schedule(), costs));
  EXPECT_DOUBLE_EQ(sim.step_time, sim.makespan);  // no phases given: not modelled
  // With the step's zero-grad and optimizer spans: each stage's own (one step, one each).
  PS_ASSERT_OK_AND_ASSIGN(scheduler::CostModel with_phases,
                          MeasuredCostModel({&r.timeline}, *ex, {&r.phases}));
  ASSERT_EQ(r.phases.size(), 4u);
  for (const trace::Span& p : r.phases) {
    const scheduler::StageCosts& c = with_phases.stages[p.stage];
    EXPECT_DOUBLE_EQ(p.op == "ZERO_GRAD" ? c.zero_grad : c.optimizer, p.end - p.start) << p.op;
  }
  EXPECT_EQ(with_phases.stages[1].f, costs.stages[1].f);
  // Null entries are skipped, as the exporters skip them.
  PS_ASSERT_OK_AND_ASSIGN(scheduler::CostModel with_nulls,
                          MeasuredCostModel({&r.timeline, nullptr}, *ex, {nullptr}));
  EXPECT_EQ(with_nulls.stages[1].f, costs.stages[1].f);
  // Nothing measured, or another executor's timeline: no stage's times are made up.
  EXPECT_THAT(MeasuredCostModel({}, *ex),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the timelines hold no measured F of stage 0 of 2: give the "
                                 "timelines of steps this executor ran")));
  trace::Timeline one_stage = r.timeline;
  std::erase_if(one_stage.spans, [](const trace::Span& span) { return span.stage == 1; });
  EXPECT_THAT(
      MeasuredCostModel({&one_stage}, *ex),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no measured F of stage 1 of 2")));
  std::erase_if(one_stage.spans, [](const trace::Span& span) { return span.op == "W"; });
  EXPECT_THAT(MeasuredCostModel({&one_stage}, *ex),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no measured backward (B, or I and W) of stage 0 of 2")));
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult step,
                          scheduler::Simulate(ex->schedule(), with_phases));
  // A rank's zero-grad can only hold its first action back (with this tiny work rank
  // 1's may outlast 0F0 and the transfer).
  EXPECT_GE(step.makespan, sim.makespan - 1e-9);
  EXPECT_GE(step.step_time, step.makespan + with_phases.stages[0].zero_grad);
}

}  // namespace
}  // namespace pipesched::stages
