// THE CONTRACT, on the strict host backend with the built-in MLP: for every schedule x
// P in {1,2,4} x V where it applies x D in {1,2} x M in {1,4,8}, the parameters after 3
// steps equal those of plain single-device training (model::ReferenceTrainer: one
// stage, the same global batch, the same micro-batch split) to 1e-5 relative; the loss
// falls over a short run; peak activation bytes measured by the runtime equal the
// simulator's for GPipe and 1F1B; bad configurations are one-sentence errors. Shapes are
// tiny (hidden 8, micro-batch 2) so that the sweep also runs under TSan on 2 cores.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/model/reference.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/stages/trainer.h"
#include "stages/schedule_cases.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

using Case = testing::ScheduleCase;

std::vector<Case> AllCases() { return testing::AllScheduleCases(); }

TrainerConfig TinyConfig(const Case& c) {
  TrainerConfig config;
  config.schedule = c.schedule;
  config.stages = c.p;
  config.virtual_stages = c.v;
  config.replicas = c.d;
  config.microbatches = c.m;
  config.microbatch_size = 2;
  config.model = {.d_in = 6, .d_hidden = 8, .num_classes = 4, .num_layers = 7};
  config.optimizer.kind = model::OptimizerKind::kSgd;
  config.optimizer.sgd = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
  config.backend = "host";
  config.strict = true;
  config.seed = 11;
  return config;
}

// Plain single-device training of the same model and optimizer on the same global batch,
// split into the same D x M micro-batches.
absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> ReferenceFor(const TrainerConfig& config) {
  return model::ReferenceTrainer::Create(
      {.config = config.model,
       .seed = config.seed,
       .optimizer = config.optimizer,
       .num_microbatches = config.replicas * config.microbatches});
}

// |a - r| <= atol + rtol * |r| for every element; names the first mismatch.
void ExpectParametersEqual(const std::vector<model::HostTensor>& got,
                           const std::vector<model::HostTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  std::map<std::string, const model::HostTensor*> by_name;
  for (const auto& t : want) by_name[t.name] = &t;
  double max_err = 0;
  for (const auto& t : got) {
    ASSERT_TRUE(by_name.count(t.name)) << t.name;
    auto a = t.ToFloats().value();
    auto r = by_name[t.name]->ToFloats().value();
    ASSERT_EQ(a.size(), r.size()) << t.name;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double err = std::abs(static_cast<double>(a[i]) - r[i]);
      max_err = std::max(max_err, err / (1e-3 + std::abs(r[i])));
      ASSERT_LE(err, 1e-7 + 1e-5 * std::abs(r[i]))
          << t.name << "[" << i << "]: pipelined " << a[i] << " vs reference " << r[i];
    }
  }
}

// Three steps of `trainer` and of single-device training on the same global batches: the
// losses agree at every step and the parameters after the third. `each_step` (optional)
// checks more of each step's result.
void ExpectThreeStepsMatchTheReference(
    Trainer& trainer, const TrainerConfig& config,
    const std::function<void(int, const StepResult&)>& each_step = {}) {
  PS_ASSERT_OK_AND_ASSIGN(auto reference, ReferenceFor(config));
  const std::int64_t g = trainer.global_batch();
  const model::Dataset& data = trainer.data();
  for (int step = 0; step < 3; ++step) {
    const float* x = data.x.data() + step * g * config.model.d_in;
    const std::int32_t* y = data.y.data() + step * g;
    PS_ASSERT_OK_AND_ASSIGN(StepResult r, trainer.Step(x, y));
    PS_ASSERT_OK_AND_ASSIGN(float ref_loss, reference->Step(x, y, static_cast<int>(g)));
    EXPECT_NEAR(r.loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "step " << step;
    if (each_step) each_step(step, r);
  }
  PS_ASSERT_OK_AND_ASSIGN(auto got, trainer.ExportParameters());
  PS_ASSERT_OK_AND_ASSIGN(auto want, reference->ExportParameters());
  ExpectParametersEqual(got, want);
}

TEST(ContractTest, EveryScheduleMatchesSingleDeviceTraining) {
  const std::vector<Case> cases = AllCases();
  // 14 schedules; V = 2 for the three interleaved ones, the four zb-v ones and dualpipe-v
  // (where M >= 2P), V in {1,2} for looped-bfs.
  ASSERT_EQ(cases.size(), 262u);
  int searched_orders = 0;  // cases of searched schedules whose order is not the unit-cost one
  for (const Case& c : cases) {
    SCOPED_TRACE(c.Name());
    TrainerConfig config = TinyConfig(c);
    PS_ASSERT_OK_AND_ASSIGN(config.schedule_override, testing::GenerateCase(c));
    if (const auto* info = scheduler::FindSchedule(c.schedule); info->uses_costs) {
      // Its order for unit costs (zb-h1's for zb-1p and zb-2p, mostly zb-v's for zb-v-1p).
      PS_ASSERT_OK_AND_ASSIGN(scheduler::Schedule unit,
                              scheduler::GenerateSchedule(c.schedule, {c.p, c.m, c.v}));
      searched_orders += config.schedule_override->programs != unit.programs;
    }
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
    ExpectThreeStepsMatchTheReference(*trainer, config);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GE(searched_orders, 24);  // of 108 (34 when written); P = 1 and M = 1 leave little
}

// `s` with its ranks renamed: rank r's program runs on rank perm[r], and each stage sits
// on the rank its rank became. An explicit placement, neither loop nor v.
scheduler::Schedule RenameRanks(const scheduler::Schedule& s, const std::vector<int>& perm) {
  scheduler::Schedule out = s;
  out.placement.kind = scheduler::PlacementKind::kExplicit;
  out.placement.stage_ranks.clear();
  for (int stage = 0; stage < s.num_stages(); ++stage) {
    out.placement.stage_ranks.push_back(perm[s.placement.RankOf(stage)]);
  }
  for (int r = 0; r < s.num_ranks(); ++r) out.programs[perm[r]] = s.programs[r];
  return out;
}

// Block placement (rank r holds stages rV .. rV + V - 1), each rank running GPipe over its
// stages: every forward in stage order, then every backward in reverse.
scheduler::Schedule BlockGpipe(int p, int v, int m) {
  scheduler::Schedule s;
  s.name = "block-gpipe";
  s.placement = {.kind = scheduler::PlacementKind::kExplicit, .num_ranks = p, .num_chunks = v};
  s.num_microbatches = m;
  s.programs.resize(p);
  for (int stage = 0; stage < p * v; ++stage) s.placement.stage_ranks.push_back(stage / v);
  for (int r = 0; r < p; ++r) {
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) s.programs[r].push_back({r * v + c, mb, scheduler::Op::kF});
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int mb = 0; mb < m; ++mb) s.programs[r].push_back({r * v + c, mb, scheduler::Op::kB});
    }
  }
  return s;
}

// Placements that are neither loop nor v (a PyTorch file may give any): the executor puts
// each stage where the placement says, hands activations over within a rank where two
// consecutive stages share one, and trains what single-device training does; a rank's
// measured peak is the simulator's for the placement.
TEST(ContractTest, ExplicitPlacementsMatchSingleDeviceTraining) {
  struct Explicit {
    Case c;
    std::vector<int> perm;  // empty: BlockGpipe
  };
  for (const Explicit& e : std::vector<Explicit>{{{"1f1b", 4, 1, 2, 4}, {3, 2, 1, 0}},
                                                 {{"zb-v", 2, 2, 1, 4}, {1, 0}},
                                                 {{"interleaved-1f1b", 2, 2, 2, 4}, {1, 0}},
                                                 {{"zb-h1", 4, 1, 1, 8}, {2, 0, 3, 1}},
                                                 {{"block-gpipe", 2, 2, 2, 4}, {}},
                                                 {{"block-gpipe", 4, 2, 1, 1}, {}}}) {
    const Case& c = e.c;
    SCOPED_TRACE(c.Name());
    TrainerConfig config = TinyConfig(c);
    if (e.perm.empty()) {
      config.schedule_override = BlockGpipe(c.p, c.v, c.m);
    } else {
      PS_ASSERT_OK_AND_ASSIGN(scheduler::Schedule named, testing::GenerateCase(c));
      config.schedule_override = RenameRanks(named, e.perm);
    }
    config.model.num_layers = 2 * c.p * c.v - 1;
    config.partition = std::vector<int>(c.p * c.v, 2);
    config.exact_memory_accounting = true;
    PS_ASSERT_OK(scheduler::Validate(*config.schedule_override));
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
    const Executor& ex = trainer->executor();
    scheduler::CostModel costs;
    for (int s = 0; s < c.p * c.v; ++s) {
      costs.stages.push_back({.activation_bytes = ex.activation_bytes(s),
                              .workspace_bytes = ex.workspace_bytes(s),
                              .input_bytes = ex.input_bytes(s)});
    }
    PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim,
                            scheduler::Simulate(*config.schedule_override, costs));
    ExpectThreeStepsMatchTheReference(*trainer, config, [&](int step, const StepResult& r) {
      for (int rank = 0; rank < c.p; ++rank) {
        EXPECT_EQ(r.peak_activation_bytes[rank], sim.ranks[rank].peak_live_bytes)
            << "rank " << rank << " step " << step;
      }
    });
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(ContractTest, AdamWMatchesToo) {
  for (const std::string name : {"1f1b", "zb-v", "interleaved-1f1b"}) {
    Case c{name, 2, name == "1f1b" ? 1 : 2, 2, 4};
    SCOPED_TRACE(c.Name());
    TrainerConfig config = TinyConfig(c);
    config.optimizer.kind = model::OptimizerKind::kAdamW;
    config.optimizer.adamw.lr = 1e-2f;
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
    ExpectThreeStepsMatchTheReference(*trainer, config);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(ContractTest, LossFalls) {
  TrainerConfig config = TinyConfig({"1f1b", 2, 1, 2, 4});
  config.model = {.d_in = 8, .d_hidden = 16, .num_classes = 4, .num_layers = 3};
  config.microbatch_size = 4;
  config.optimizer.kind = model::OptimizerKind::kAdamW;
  config.optimizer.adamw.lr = 1e-2f;
  config.optimizer.adamw.weight_decay = 0;
  config.synthetic_samples = 64;  // two global batches, seen over and over
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  std::vector<double> losses;
  for (int step = 0; step < 40; ++step) {
    PS_ASSERT_OK_AND_ASSIGN(StepResult r, trainer->Step());
    losses.push_back(r.loss);
  }
  const double first = (losses[0] + losses[1]) / 2;
  const double last = (losses[38] + losses[39]) / 2;
  EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
}

// The runtime's peak (exact accounting) equals the simulator's peak_live_bytes fed with
// the executor's activation_bytes, workspace_bytes and input_bytes, for every schedule:
// chunks of two layers, so that every backward also holds model::Chunk's (B, H) gradient
// between them. GPipe holds M micro-batches on every rank and 1F1B min(P - r, M) on rank
// r, plus one backward's workspace; in 1F1B's steady state (M > P - r) the backward also
// holds the next F's received input, allocated before it (Executor, "Memory"). zb-v-half
// and zb-v-min, searched for unit costs, hold less than zb-v on the busiest rank.
TEST(ContractTest, PeakActivationBytesMatchTheSimulator) {
  std::map<std::string, std::int64_t> busiest;  // P=4, M=8: the largest peak of any rank
  for (const std::string name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v",
                                 "interleaved-zb", "zb-v-half", "zb-v-min"}) {
    const int v =
        name == "interleaved-1f1b" || name.starts_with("zb-v") || name == "interleaved-zb" ? 2 : 1;
    for (int p : {1, 2, 4}) {
      for (int m : {1, 4, 8}) {
        TrainerConfig config = TinyConfig({name, p, v, 1, m});
        config.model.num_layers = 2 * p * v - 1;
        config.partition = std::vector<int>(p * v, 2);
        config.exact_memory_accounting = true;
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        auto trainer = Trainer::Create(config);
        PS_ASSERT_OK(trainer.status());
        const Executor& ex = (*trainer)->executor();
        scheduler::CostModel costs;
        for (int s = 0; s < p * v; ++s) {
          const std::int64_t workspace = ex.workspace_bytes(s);
          EXPECT_EQ(workspace, static_cast<std::int64_t>(sizeof(float)) * config.microbatch_size *
                                   config.model.d_hidden);
          EXPECT_EQ(ex.input_bytes(s), s == 0 ? 0
                                              : static_cast<std::int64_t>(sizeof(float)) *
                                                    config.microbatch_size * config.model.d_hidden);
          costs.stages.push_back({.activation_bytes = ex.activation_bytes(s),
                                  .workspace_bytes = workspace,
                                  .input_bytes = ex.input_bytes(s)});
        }
        PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim,
                                scheduler::Simulate((*trainer)->schedule(), costs));
        for (int step = 0; step < 2; ++step) {
          PS_ASSERT_OK_AND_ASSIGN(StepResult r, (*trainer)->Step());
          for (int rank = 0; rank < p; ++rank) {
            EXPECT_EQ(r.peak_activation_bytes[rank], sim.ranks[rank].peak_live_bytes)
                << "rank " << rank << " step " << step;
            if (p == 4 && m == 8) {
              busiest[name] = std::max(busiest[name], r.peak_activation_bytes[rank]);
            }
            if (name != "gpipe" && name != "1f1b") continue;
            const int live = name == "gpipe" ? m : std::min(p - rank, m);
            const bool steady = name == "1f1b" && m > p - rank;
            EXPECT_EQ(r.peak_activation_bytes[rank], live * ex.activation_bytes(rank) +
                                                         ex.workspace_bytes(rank) +
                                                         (steady ? ex.input_bytes(rank) : 0))
                << "rank " << rank << " step " << step;
          }
        }
      }
    }
  }
  // P = 4: zb-v-half keeps at most 6 chunk activations, zb-v-min 4, zb-v 8.
  EXPECT_LT(busiest["zb-v-half"], busiest["zb-v"]);
  EXPECT_LT(busiest["zb-v-min"], busiest["zb-v-half"]);
}

// Activation recomputation (TrainerConfig::recompute) changes memory and time, never the
// numbers: the rebuilt stash is the one the first F would have kept, so the parameters
// after 3 steps are bit for bit those of the same run without it, and within the
// contract's tolerance of single-device training, for schedules with B and with I and W
// (W deferred, several rebuilt stashes waiting), one and two chunks, D in {1, 2}.
TEST(ContractTest, RecomputeTrainsTheSameParameters) {
  for (const Case& c : std::vector<Case>{{"gpipe", 2, 1, 1, 4},
                                         {"1f1b", 4, 1, 2, 8},
                                         {"zb-h1", 2, 1, 1, 4},
                                         {"zb-1p", 4, 1, 1, 8},
                                         {"interleaved-1f1b", 2, 2, 2, 4},
                                         {"zb-v", 2, 2, 1, 8},
                                         {"dualpipe-v", 2, 2, 1, 4}}) {
    SCOPED_TRACE(c.Name());
    TrainerConfig config = TinyConfig(c);
    PS_ASSERT_OK_AND_ASSIGN(auto plain, Trainer::Create(config));
    config.recompute = true;
    PS_ASSERT_OK_AND_ASSIGN(auto recomputing, Trainer::Create(config));
    EXPECT_GT(recomputing->executor().recompute_bytes(0), 0);
    EXPECT_EQ(plain->executor().recompute_bytes(0), 0);
    PS_ASSERT_OK_AND_ASSIGN(auto reference, ReferenceFor(config));
    const std::int64_t g = recomputing->global_batch();
    for (int step = 0; step < 3; ++step) {
      const float* x = recomputing->data().x.data() + step * g * config.model.d_in;
      const std::int32_t* y = recomputing->data().y.data() + step * g;
      PS_ASSERT_OK_AND_ASSIGN(StepResult with, recomputing->Step(x, y));
      PS_ASSERT_OK_AND_ASSIGN(StepResult without, plain->Step(x, y));
      PS_ASSERT_OK(reference->Step(x, y, static_cast<int>(g)));
      EXPECT_EQ(with.loss, without.loss) << "step " << step;
    }
    PS_ASSERT_OK_AND_ASSIGN(auto got, recomputing->ExportParameters());
    PS_ASSERT_OK_AND_ASSIGN(auto same, plain->ExportParameters());
    ASSERT_EQ(got.size(), same.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].ToFloats().value(), same[k].ToFloats().value()) << got[k].name;
    }
    ExpectParametersEqual(got, reference->ExportParameters().value());
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Selective recomputation (TrainerConfig::recompute_stages): only the listed stages drop
// their stashes. The numbers stay bit for bit those of the plain run; the listed stages'
// ranks hold less, the others exactly what they held; the measured peaks equal the
// simulated ones. 1F1B P=4 recomputing the two stages that hold the most, and zb-v P=2
// recomputing rank 0's two chunks (stages 0 and 3 of its V).
TEST(ContractTest, SelectiveRecomputeChangesOnlyTheListedStages) {
  for (const auto& [c, listed] : std::vector<std::pair<Case, std::vector<int>>>{
           {{"1f1b", 4, 1, 1, 8}, {0, 1}}, {{"zb-v", 2, 2, 1, 8}, {3, 0}}}) {
    SCOPED_TRACE(c.Name());
    TrainerConfig config = TinyConfig(c);
    config.model.num_layers = 2 * c.p * c.v - 1;
    config.partition = std::vector<int>(c.p * c.v, 2);
    config.exact_memory_accounting = true;
    PS_ASSERT_OK_AND_ASSIGN(auto plain, Trainer::Create(config));
    config.recompute_stages = listed;
    PS_ASSERT_OK_AND_ASSIGN(auto selective, Trainer::Create(config));
    const Executor& ex = selective->executor();
    scheduler::CostModel costs;
    for (int s = 0; s < c.p * c.v; ++s) {
      const bool is_listed = std::find(listed.begin(), listed.end(), s) != listed.end();
      EXPECT_EQ(ex.recompute_bytes(s) > 0, is_listed) << "stage " << s;
      costs.stages.push_back(ex.WithMemoryCosts(s));
    }
    PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim,
                            scheduler::Simulate(selective->schedule(), costs));
    const std::int64_t g = selective->global_batch();
    for (int step = 0; step < 2; ++step) {
      const float* x = selective->data().x.data() + step * g * config.model.d_in;
      const std::int32_t* y = selective->data().y.data() + step * g;
      PS_ASSERT_OK_AND_ASSIGN(StepResult with, selective->Step(x, y));
      PS_ASSERT_OK_AND_ASSIGN(StepResult without, plain->Step(x, y));
      EXPECT_EQ(with.loss, without.loss);
      for (int rank = 0; rank < c.p; ++rank) {
        EXPECT_EQ(with.peak_activation_bytes[rank], sim.ranks[rank].peak_live_bytes)
            << "rank " << rank;
      }
      EXPECT_LT(with.peak_activation_bytes[0], without.peak_activation_bytes[0]);
      if (c.schedule == "1f1b") {
        EXPECT_EQ(with.peak_activation_bytes[2], without.peak_activation_bytes[2]);
        EXPECT_EQ(with.peak_activation_bytes[3], without.peak_activation_bytes[3]);
      }
    }
    PS_ASSERT_OK_AND_ASSIGN(auto got, selective->ExportParameters());
    PS_ASSERT_OK_AND_ASSIGN(auto same, plain->ExportParameters());
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].ToFloats().value(), same[k].ToFloats().value()) << got[k].name;
    }
  }
  TrainerConfig config = TinyConfig({"1f1b", 2, 1, 1, 4});
  config.recompute_stages = {2};
  EXPECT_THAT(Trainer::Create(config).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot recompute stage 2: the pipeline has stages 0 to 1 "
                                 "(P x V)")));
  config.recompute_stages = {1, 1};
  EXPECT_THAT(Trainer::Create(config).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 1 is listed twice for recomputation")));
}

// With recomputation the runtime's peak still equals the simulator's, now fed with the
// executor's recompute_bytes too: a micro-batch in flight keeps only its input and
// boundary buffers, and one rebuilt stash at a time is live with B (GPipe:
// M x activation_bytes + the rebuilt stash + the workspace). Deferred W's keep theirs
// until they run, which the simulator follows too; so do two chunks on one rank (zb-v,
// dualpipe-v, and every stage at P = 1).
TEST(ContractTest, RecomputePeakBytesMatchTheSimulator) {
  for (const std::string name :
       {"gpipe", "1f1b", "zb-h1", "zb-v", "interleaved-zb", "dualpipe-v"}) {
    const int v = name == "zb-v" || name == "interleaved-zb" || name == "dualpipe-v" ? 2 : 1;
    for (int p : {1, 2, 4}) {
      for (int m : {1, 4, 8}) {
        if (name == "dualpipe-v" && m < 2 * p) continue;  // its generator's floor
        TrainerConfig config = TinyConfig({name, p, v, 1, m});
        config.model.num_layers = 2 * p * v - 1;
        config.partition = std::vector<int>(p * v, 2);
        config.exact_memory_accounting = true;
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        PS_ASSERT_OK_AND_ASSIGN(auto plain, Trainer::Create(config));
        config.recompute = true;
        PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
        const Executor& ex = trainer->executor();
        scheduler::CostModel costs;
        for (int s = 0; s < p * v; ++s) {
          // What the stage drops is what it would have stashed.
          EXPECT_EQ(ex.recompute_bytes(s),
                    plain->executor().activation_bytes(s) - ex.activation_bytes(s));
          costs.stages.push_back(ex.WithMemoryCosts(s));
        }
        PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult sim,
                                scheduler::Simulate(trainer->schedule(), costs));
        PS_ASSERT_OK_AND_ASSIGN(StepResult without, plain->Step());
        for (int step = 0; step < 2; ++step) {
          PS_ASSERT_OK_AND_ASSIGN(StepResult r, trainer->Step());
          for (int rank = 0; rank < p; ++rank) {
            EXPECT_EQ(r.peak_activation_bytes[rank], sim.ranks[rank].peak_live_bytes)
                << "rank " << rank << " step " << step;
            if (m >= 4 && p >= 2 && rank == 0 && (name == "gpipe" || name == "1f1b")) {
              EXPECT_LT(r.peak_activation_bytes[rank], without.peak_activation_bytes[rank])
                  << "rank " << rank;
            }
            if (name == "gpipe") {
              EXPECT_EQ(r.peak_activation_bytes[rank], m * ex.activation_bytes(rank) +
                                                           ex.recompute_bytes(rank) +
                                                           ex.workspace_bytes(rank))
                  << "rank " << rank;
            }
          }
        }
      }
    }
  }
}

TEST(ContractTest, PlannedReplaysTheMeasuredCosts) {
  TrainerConfig config = TinyConfig({"1f1b", 2, 1, 1, 4});
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  EXPECT_THAT(trainer->Planned(), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  for (int i = 0; i < 3; ++i) PS_ASSERT_OK(trainer->Step());
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult plan, trainer->Planned());
  EXPECT_EQ(plan.timeline.time_unit, "us");
  EXPECT_EQ(plan.ranks.size(), 2u);
  EXPECT_GT(plan.makespan, 0);
}

TEST(ContractTest, SaveAndLoadRoundTrip) {
  TrainerConfig config = TinyConfig({"1f1b", 2, 1, 1, 2});
  PS_ASSERT_OK_AND_ASSIGN(auto a, Trainer::Create(config));
  PS_ASSERT_OK(a->Step());
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "contract_params.safetensors").string();
  PS_ASSERT_OK(a->SaveParameters(path));
  config.seed = 99;  // different initialisation, then overwritten by the file
  config.replicas = 2;
  PS_ASSERT_OK_AND_ASSIGN(auto b, Trainer::Create(config));
  PS_ASSERT_OK(b->LoadParameters(path));
  ExpectParametersEqual(b->ExportParameters().value(), a->ExportParameters().value());

  // A file for another model names the tensor that does not fit.
  config.model.d_hidden = 16;
  PS_ASSERT_OK_AND_ASSIGN(auto c, Trainer::Create(config));
  absl::Status s = c->LoadParameters(path);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("blocks.0"));
  std::vector<model::HostTensor> extra = a->ExportParameters().value();
  extra.push_back(model::HostTensor::F32("blocks.99.weight", {1}, {0.0f}));
  EXPECT_THAT(a->ImportParameters(extra),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'blocks.99.weight' is not a parameter of this model")));
}

TEST(ContractTest, BadConfigurationsAreOneSentenceErrors) {
  TrainerConfig config = TinyConfig({"1f1b", 4, 1, 1, 4});
  config.model.num_layers = 2;
  EXPECT_THAT(Trainer::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 blocks + head = 3 layers cannot fill 4 chunks")));
  config = TinyConfig({"no-such-schedule", 2, 1, 1, 4});
  EXPECT_THAT(Trainer::Create(config), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  config = TinyConfig({"zb-v", 2, 3, 1, 4});
  EXPECT_THAT(Trainer::Create(config), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  config = TinyConfig({"1f1b", 2, 1, 1, 4});
  config.microbatch_size = 0;
  EXPECT_THAT(Trainer::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro-batch size")));
  config = TinyConfig({"1f1b", 2, 1, 1, 4});
  config.synthetic_samples = 3;
  EXPECT_THAT(Trainer::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the data set has 3 samples but one step needs 8")));
  config = TinyConfig({"1f1b", 2, 1, 1, 4});
  config.partition = {3, 4};
  EXPECT_THAT(Trainer::Create(config), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("covers 7 layers but the model has 8")));
  // A data file whose shapes disagree with the flags.
  model::Dataset data;
  data.d_in = 5;
  data.num_classes = 4;
  data.x.assign(5 * 16, 0.5f);
  data.y.assign(16, 1);
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "contract_data.safetensors").string();
  PS_ASSERT_OK(model::SaveDataset(path, data));
  config = TinyConfig({"1f1b", 2, 1, 1, 4});
  config.data_path = path;
  EXPECT_THAT(Trainer::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("x has 5 features per sample but the model takes 6")));
  if (!runtime::CudaAvailable()) {
    config = TinyConfig({"1f1b", 2, 1, 1, 4});
    config.backend = "cuda";
    EXPECT_THAT(Trainer::Create(config), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  }
}

}  // namespace
}  // namespace pipesched::stages
