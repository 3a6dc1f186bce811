// CostModel lookups and the cost-model JSON parser: values land where the file says,
// and every bad file is rejected with the key it got wrong.
#include "pipesched/scheduler/cost_model.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(CostModelTest, UniformDefaults) {
  const CostModel costs;
  EXPECT_EQ(costs.Duration({3, 0, Op::kF}), 1);
  EXPECT_EQ(costs.Duration({3, 0, Op::kB}), 2);
  EXPECT_EQ(costs.Duration({3, 0, Op::kI}), 1);
  EXPECT_EQ(costs.Duration({3, 0, Op::kW}), 1);
  EXPECT_EQ(costs.Duration({3, -1, Op::kAllReduce}), 0);
  EXPECT_EQ(costs.Duration({3, 0, Op::kSendF}), 0);
}

TEST(CostModelTest, PerStageAndPerBoundaryOverrides) {
  CostModel costs;
  costs.stages = {StageCosts{.f = 5, .b = 6, .i = 7, .w = 8, .allreduce = 9}};
  costs.comm_uniform = 0.25;
  costs.comm = {0.5, 0.75};
  EXPECT_EQ(costs.Duration({0, 1, Op::kF}), 5);
  EXPECT_EQ(costs.Duration({0, 1, Op::kB}), 6);
  EXPECT_EQ(costs.Duration({0, 1, Op::kI}), 7);
  EXPECT_EQ(costs.Duration({0, 1, Op::kW}), 8);
  EXPECT_EQ(costs.Duration({0, -1, Op::kAllReduce}), 9);
  EXPECT_EQ(costs.Duration({1, 1, Op::kF}), 1);  // beyond `stages`: uniform
  // Transfers take their boundary's time: SEND_F/RECV_B of stage s cross s -> s+1,
  // SEND_B/RECV_F of stage s cross s-1 -> s.
  EXPECT_EQ(costs.Duration({0, 0, Op::kSendF}), 0.5);
  EXPECT_EQ(costs.Duration({0, 0, Op::kRecvB}), 0.5);
  EXPECT_EQ(costs.Duration({1, 0, Op::kRecvF}), 0.5);
  EXPECT_EQ(costs.Duration({2, 0, Op::kSendB}), 0.75);
  EXPECT_EQ(costs.Duration({5, 0, Op::kSendF}), 0.25);  // beyond `comm`: uniform
}

TEST(CostModelTest, PerActionDurationsOverrideTheirStageOnly) {
  CostModel costs;
  costs.stages = {StageCosts{.f = 5, .b = 6}};
  costs.actions[{0, Op::kF, 3}] = 11;
  costs.actions[{0, Op::kB, 3}] = 12;
  EXPECT_EQ(costs.Duration({0, 3, Op::kF}), 11);
  EXPECT_EQ(costs.Duration({0, 3, Op::kB}), 12);
  EXPECT_EQ(costs.Duration({0, 2, Op::kF}), 5);  // another micro-batch: the stage's
  EXPECT_EQ(costs.Duration({1, 3, Op::kF}), 1);  // another stage: uniform
}

TEST(CostModelTest, ParsesFullFile) {
  PS_ASSERT_OK_AND_ASSIGN(const CostModel costs, ParseCostModelJson(R"({
    "version": 1,
    "stages": [{"f": 1.5}, {"b": 4, "activation_bytes": 1024, "workspace_bytes": 256,
                            "input_bytes": 128}],
    "default": {"f": 2, "b": 3, "i": 1.25, "w": 1.75, "allreduce": 0.5,
                "activation_bytes": 64},
    "comm": [0.1, 0.2]
  })"));
  EXPECT_EQ(costs.uniform.f, 2);
  EXPECT_EQ(costs.uniform.b, 3);
  EXPECT_EQ(costs.uniform.i, 1.25);
  EXPECT_EQ(costs.uniform.w, 1.75);
  EXPECT_EQ(costs.uniform.allreduce, 0.5);
  EXPECT_EQ(costs.uniform.activation_bytes, 64);
  ASSERT_EQ(costs.stages.size(), 2u);
  // Stage fields default to "default", even though "stages" comes first in the file.
  EXPECT_EQ(costs.stages[0].f, 1.5);
  EXPECT_EQ(costs.stages[0].b, 3);
  EXPECT_EQ(costs.stages[0].activation_bytes, 64);
  EXPECT_EQ(costs.stages[1].f, 2);
  EXPECT_EQ(costs.stages[1].b, 4);
  EXPECT_EQ(costs.stages[1].activation_bytes, 1024);
  EXPECT_EQ(costs.stages[0].workspace_bytes, 0);
  EXPECT_EQ(costs.stages[1].workspace_bytes, 256);
  EXPECT_EQ(costs.stages[0].input_bytes, 0);
  EXPECT_EQ(costs.stages[1].input_bytes, 128);
  EXPECT_THAT(costs.comm, ::testing::ElementsAre(0.1, 0.2));
}

TEST(CostModelTest, ParsesMinimalFileAsBuiltInDefaults) {
  PS_ASSERT_OK_AND_ASSIGN(const CostModel costs, ParseCostModelJson(R"({"comm": 0.3})"));
  EXPECT_EQ(costs.uniform.f, 1);
  EXPECT_EQ(costs.uniform.b, 2);
  EXPECT_EQ(costs.comm_uniform, 0.3);
  EXPECT_TRUE(costs.stages.empty());
  EXPECT_TRUE(costs.comm.empty());
  EXPECT_EQ(costs.action_gap, 0);
  PS_ASSERT_OK_AND_ASSIGN(const CostModel gap, ParseCostModelJson(R"({"action_gap": 0.02})"));
  EXPECT_EQ(gap.action_gap, 0.02);
  EXPECT_EQ(costs.time_unit, "unit");
}

// A measured cost file says its times are in us; the simulated timeline takes the unit,
// so that its Chrome trace and pictures are in real time. Anything but the five units
// is refused, in a file or in code.
TEST(CostModelTest, TimeUnitIsReadCheckedAndReachesTheTimeline) {
  PS_ASSERT_OK_AND_ASSIGN(const CostModel us,
                          ParseCostModelJson(R"({"default": {"f": 300}, "time_unit": "us"})"));
  EXPECT_EQ(us.time_unit, "us");
  PS_ASSERT_OK_AND_ASSIGN(const Schedule s, GenerateSchedule("1f1b", {2, 2, 1}));
  PS_ASSERT_OK_AND_ASSIGN(const SimResult sim, Simulate(s, us));
  EXPECT_EQ(sim.timeline.time_unit, "us");
  EXPECT_THAT(ParseCostModelJson(R"({"time_unit": "seconds"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"time_unit\" must be one of \"unit\", \"ns\", \"us\", \"ms\", "
                                 "\"s\", got \"seconds\"")));
  CostModel bad;
  bad.time_unit = "minutes";
  EXPECT_THAT(CheckCostModel(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("the costs' time unit is \"minutes\"")));
}

TEST(CostModelTest, RejectsBadFilesNamingTheKey) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(ParseCostModelJson("{\"default\": {\"f\": 1,"),
              StatusIs(kBad, HasSubstr("cost model: not valid JSON")));
  EXPECT_THAT(ParseCostModelJson("[1, 2]"),
              StatusIs(kBad, HasSubstr("\"(top level)\" must be an object")));
  EXPECT_THAT(ParseCostModelJson(R"({"version": 2})"),
              StatusIs(kBad, HasSubstr("\"version\" must be 1")));
  EXPECT_THAT(ParseCostModelJson(R"({"defaults": {}})"),
              StatusIs(kBad, AllOf(HasSubstr("unknown key \"defaults\""),
                                   HasSubstr("expected version, default, stages, comm, "
                                             "action_gap, time_unit"))));
  EXPECT_THAT(ParseCostModelJson(R"({"action_gap": -0.5})"),
              StatusIs(kBad, HasSubstr("\"action_gap\" must be a number in [0, 1e+15], got -0.5")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"fwd": 1}})"),
              StatusIs(kBad, HasSubstr("unknown key \"default.fwd\" (expected f, b, i, w, "
                                       "allreduce, zero_grad, optimizer, activation_bytes")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [{"optimizer": -2}]})"),
              StatusIs(kBad, HasSubstr("\"stages[0].optimizer\" must be a number in [0, 1e+15], "
                                       "got -2")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [{}, {"f": -1}]})"),
              StatusIs(kBad, HasSubstr("\"stages[1].f\" must be a number in [0, 1e+15], got -1")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [{"b": "2"}]})"),
              StatusIs(kBad, HasSubstr("\"stages[0].b\" must be a number in [0, 1e+15], got "
                                       "\"2\"")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"workspace_bytes": 1.5}})"),
              StatusIs(kBad, HasSubstr("\"default.workspace_bytes\" must be an integer in "
                                       "[0, 1125899906842624] (2^50), got 1.5")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"input_bytes": -1}})"),
              StatusIs(kBad, HasSubstr("\"default.input_bytes\" must be an integer in "
                                       "[0, 1125899906842624] (2^50), got -1")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": {"f": 1}})"),
              StatusIs(kBad, HasSubstr("\"stages\" must be a non-empty array")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [3]})"),
              StatusIs(kBad, HasSubstr("\"stages[0]\" must be an object")));
  EXPECT_THAT(ParseCostModelJson(R"({"comm": [0.1, -0.2]})"),
              StatusIs(kBad, HasSubstr("\"comm[1]\" must be a number in [0, 1e+15]")));
  EXPECT_THAT(ParseCostModelJson(R"({"comm": "fast"})"),
              StatusIs(kBad, HasSubstr("\"comm\" must be a number in [0, 1e+15]")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"activation_bytes": 1.5}})"),
              StatusIs(kBad, HasSubstr("\"default.activation_bytes\" must be an integer "
                                       "in [0, 1125899906842624]")));
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A value nested 100000 deep once crashed the error path (a recursive dump() of it into
// the message); at 10000 the message was 20 KB. Now the parse stops at 64 levels, and a
// quoted value is cut at 60 bytes.
TEST(CostModelTest, DeepOrHugeValuesGiveShortErrors) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  for (int depth : {100000, 10000, 65}) {
    for (const char* key : {"version", "stages", "comm"}) {
      const std::string text = absl::StrCat("{\"", key, "\": ", Nested(depth), "}");
      EXPECT_THAT(ParseCostModelJson(text),
                  StatusIs(kBad, HasSubstr("nested deeper than 64 levels of arrays and objects")))
          << key << " at depth " << depth;
    }
  }
  // Within the limit: the value is quoted, cut short.
  absl::Status s = ParseCostModelJson(absl::StrCat("{\"version\": ", Nested(60), "}")).status();
  EXPECT_THAT(s, StatusIs(kBad, HasSubstr("got [[[[[[")));
  EXPECT_LT(s.message().size(), 200u);
  std::string wide = "{\"comm\": [[";
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&wide, i > 0 ? "," : "", i);
  s = ParseCostModelJson(wide + "]]}").status();
  EXPECT_THAT(s, StatusIs(kBad, HasSubstr("\"comm[0]\" must be a number in [0, 1e+15], got "
                                          "[0,1,2,3,")));
  EXPECT_LT(s.message().size(), 200u);
  s = ParseCostModelJson(absl::StrCat("{\"", std::string(100000, 'k'), "\": 1}")).status();
  EXPECT_THAT(s, StatusIs(kBad, HasSubstr("unknown key \"kkkk")));
  EXPECT_LT(s.message().size(), 200u);
}

// 1e308 made the simulated makespan inf (a grid that never finished drawing, "nan" in
// the statistics); the bound is the --cost-* flags' one.
TEST(CostModelTest, TimesAndBytesHaveUpperBounds) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"f": 1e308, "b": 1}})"),
              StatusIs(kBad, HasSubstr("\"default.f\" must be a number in [0, 1e+15], got "
                                       "1e+308")));
  EXPECT_THAT(ParseCostModelJson(R"({"comm": 1e308})"),
              StatusIs(kBad, HasSubstr("\"comm\" must be a number in [0, 1e+15]")));
  EXPECT_THAT(ParseCostModelJson(R"({"comm": [1, 1e16]})"),
              StatusIs(kBad, HasSubstr("\"comm[1]\" must be a number in [0, 1e+15]")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [{"w": 2e15}]})"),
              StatusIs(kBad, HasSubstr("\"stages[0].w\" must be a number in [0, 1e+15]")));
  PS_EXPECT_OK(ParseCostModelJson(R"({"default": {"f": 1e15}})").status());
  EXPECT_EQ(kMaxCostTime, 1e15);
  // 2^62 stashed per micro-batch summed to a peak that no longer fit int64.
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"activation_bytes": 4611686018427387904}})"),
              StatusIs(kBad, HasSubstr("\"default.activation_bytes\" must be an integer in "
                                       "[0, 1125899906842624] (2^50), got 4611686018427387904")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"workspace_bytes": 18446744073709551615}})"),
              StatusIs(kBad, HasSubstr("\"default.workspace_bytes\" must be an integer in")));
  PS_EXPECT_OK(
      ParseCostModelJson(R"({"default": {"activation_bytes": 1125899906842624}})").status());
  // 2^32 + 1 is not version 1 (it was read through an int).
  EXPECT_THAT(ParseCostModelJson(R"({"version": 4294967297})"),
              StatusIs(kBad, HasSubstr("\"version\" must be 1")));
}

// Recomputation keeps a stage's received input from F to backward, rebuilds the rest,
// and runs F again inside B and I.
TEST(CostModelTest, WithRecomputeKeepsTheInputAndRerunsTheForward) {
  CostModel costs;
  costs.uniform = StageCosts{.f = 1, .b = 2, .i = 1.25, .w = 0.75, .activation_bytes = 100};
  costs.stages = {costs.uniform, costs.uniform};
  costs.stages[1].f = 3;
  costs.stages[1].input_bytes = 10;
  costs.comm_uniform = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(const CostModel rc, WithRecompute(costs));
  EXPECT_EQ(rc.stages[0].activation_bytes, 0);  // stage 0 receives nothing
  EXPECT_EQ(rc.stages[0].recompute_bytes, 100);
  EXPECT_EQ(rc.stages[0].b, 3);
  EXPECT_EQ(rc.stages[0].i, 2.25);
  EXPECT_EQ(rc.stages[0].w, 0.75);
  EXPECT_EQ(rc.stages[1].activation_bytes, 10);
  EXPECT_EQ(rc.stages[1].input_bytes, 10);
  EXPECT_EQ(rc.stages[1].recompute_bytes, 90);
  EXPECT_EQ(rc.stages[1].b, 5);
  EXPECT_EQ(rc.stages[1].i, 4.25);
  EXPECT_EQ(rc.stages[1].f, 3);
  EXPECT_EQ(rc.uniform.recompute_bytes, 100);
  EXPECT_EQ(rc.comm_uniform, 0.5);
  // Twice would count the second forward twice; a replay's durations are measured.
  EXPECT_THAT(WithRecompute(rc),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 0's costs recompute already (recompute_bytes 100: "
                                 "measured with recomputation")));
  CostModel measured = costs;
  measured.stages[1].recompute_bytes = 7;
  measured.uniform.recompute_bytes = 0;
  EXPECT_THAT(WithRecompute(measured), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("stage 1's costs recompute already")));
  // A default that recomputes is used by no stage when there is a list: not an error.
  CostModel listed = costs;
  listed.uniform.recompute_bytes = 200;
  PS_ASSERT_OK_AND_ASSIGN(const CostModel from_list, WithRecompute(listed));
  EXPECT_EQ(from_list.stages[1].recompute_bytes, 90);
  // The second forward may not push B or I past the longest time a cost takes.
  CostModel slow;
  slow.uniform = StageCosts{.f = 6e14, .b = 6e14, .i = 3e14, .w = 3e14};
  EXPECT_THAT(WithRecompute(slow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the default B or I with recomputation's second forward (B 6e+14 "
                                 "+ F 6e+14, I 3e+14 + F 6e+14) passes the longest time a cost "
                                 "may take, 1e+15")));
  CostModel replay = costs;
  replay.actions[{0, Op::kF, 0}] = 2;
  EXPECT_THAT(WithRecompute(replay),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot add activation recomputation to a replayed step's")));
  // Read from and written to cost files.
  PS_ASSERT_OK_AND_ASSIGN(const CostModel file,
                          ParseCostModelJson(R"({"stages": [{"recompute_bytes": 64}, {}]})"));
  EXPECT_EQ(file.stages[0].recompute_bytes, 64);
  EXPECT_EQ(file.stages[1].recompute_bytes, 0);
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"recompute_bytes": -1}})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"default.recompute_bytes\" must be an integer in")));
}

// Selective recomputation: only the listed stages; uniform costs spread per stage first.
TEST(CostModelTest, WithRecomputeOnChangesTheListedStagesOnly) {
  CostModel costs;
  costs.uniform =
      StageCosts{.f = 1, .b = 2, .i = 1, .w = 1, .activation_bytes = 100, .input_bytes = 10};
  PS_ASSERT_OK_AND_ASSIGN(const CostModel some, WithRecomputeOn(costs, {2, 0}, 4));
  ASSERT_EQ(some.stages.size(), 4u);
  for (int s : {0, 2}) {
    EXPECT_EQ(some.stages[s].recompute_bytes, 90) << s;
    EXPECT_EQ(some.stages[s].activation_bytes, 10) << s;
    EXPECT_EQ(some.stages[s].b, 3) << s;
  }
  for (int s : {1, 3}) {
    EXPECT_EQ(some.stages[s].recompute_bytes, 0) << s;
    EXPECT_EQ(some.stages[s].activation_bytes, 100) << s;
    EXPECT_EQ(some.stages[s].b, 2) << s;
  }
  PS_ASSERT_OK_AND_ASSIGN(const CostModel none, WithRecomputeOn(costs, {}, 4));
  EXPECT_EQ(none.stages[3].activation_bytes, 100);
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(WithRecomputeOn(costs, {4}, 4),
              StatusIs(kBad, HasSubstr("cannot recompute stage 4: the schedule has stages 0 to 3 "
                                       "(P x V)")));
  EXPECT_THAT(WithRecomputeOn(costs, {1, 1}, 4),
              StatusIs(kBad, HasSubstr("stage 1 is listed twice for recomputation")));
  EXPECT_THAT(WithRecomputeOn(some, {1}, 3),
              StatusIs(kBad, HasSubstr("\"stages\" has 4 entries, the schedule 3 stages")));
  EXPECT_THAT(WithRecomputeOn(some, {2}, 4),
              StatusIs(kBad, HasSubstr("stage 2's costs recompute already")));
}

// "comm": [5] at P=4 used to cost boundary 0 only, the others silently 0.
TEST(CostModelTest, CheckCostsFitStatesTheLengthExpected) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  CostModel costs;
  PS_EXPECT_OK(CheckCostsFit(costs, 4, 2));
  costs.comm = {5};
  EXPECT_THAT(CheckCostsFit(costs, 4, 1),
              StatusIs(kBad, HasSubstr("\"comm\" has 1 entry but the schedule has 3 stage "
                                       "boundaries (4 virtual stages, P=4 x V=1)")));
  costs.comm = {1, 2, 3};
  PS_EXPECT_OK(CheckCostsFit(costs, 4, 1));
  EXPECT_THAT(CheckCostsFit(costs, 2, 1), StatusIs(kBad, HasSubstr("has 3 entries")));
  costs.comm.clear();
  costs.stages.assign(5, StageCosts{});
  EXPECT_THAT(CheckCostsFit(costs, 2, 1),
              StatusIs(kBad, HasSubstr("\"stages\" has 5 entries but the schedule has 2 "
                                       "virtual stages (P=2 x V=1); give one entry per virtual "
                                       "stage")));
  costs.stages.assign(1, StageCosts{});
  EXPECT_THAT(CheckCostsFit(costs, 2, 1), StatusIs(kBad, HasSubstr("has 1 entry but")));
  costs.stages.assign(4, StageCosts{});
  PS_EXPECT_OK(CheckCostsFit(costs, 2, 2));
  // In a file, an empty "stages" list is refused: in memory it reads as "not given".
  EXPECT_THAT(ParseCostModelJson(R"({"version": 1, "stages": []})"),
              StatusIs(kBad, HasSubstr("a non-empty array of per-stage objects")));
  // So is an empty "comm" list: it simulated as free transfers for P=4.
  EXPECT_THAT(ParseCostModelJson(R"({"version": 1, "comm": []})"),
              StatusIs(kBad, HasSubstr("cost model: \"comm\" must be a number (every "
                                       "boundary's transfer time) or a non-empty array of "
                                       "per-boundary times, got []")));
}

// A received input larger than the activations it belongs to (the fuzzer found such
// files: they parsed, then failed to simulate) does not fit, naming the stage; stage 0
// receives nothing, and a default that no stage uses is not checked.
TEST(CostModelTest, CheckCostsFitRefusesAnInputAboveItsActivations) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  PS_ASSERT_OK_AND_ASSIGN(
      CostModel file, ParseCostModelJson(R"({"stages": [{}, {}, {}, {"input_bytes": 65536}]})"));
  EXPECT_THAT(CheckCostsFit(file, 2, 2),
              StatusIs(kBad, HasSubstr("cost model: stage 3: input_bytes 65536 exceeds "
                                       "activation_bytes 0; the received input is part of")));
  PS_ASSERT_OK_AND_ASSIGN(file, ParseCostModelJson(R"({"default": {"input_bytes": 9}})"));
  EXPECT_THAT(CheckCostsFit(file, 2, 1), StatusIs(kBad, HasSubstr("stage 1: input_bytes 9")));
  PS_EXPECT_OK(CheckCostsFit(file, 1, 1));  // one stage: nothing received
  PS_ASSERT_OK_AND_ASSIGN(file, ParseCostModelJson(R"({"default": {"input_bytes": 9},
                                   "stages": [{}, {"activation_bytes": 9}]})"));
  PS_EXPECT_OK(CheckCostsFit(file, 2, 1));  // the default's 9 is stage 0's only
}

}  // namespace
}  // namespace pipesched::scheduler
