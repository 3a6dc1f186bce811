// CostModel lookups and the cost-model JSON parser: values land where the file says,
// and every bad file is rejected with the key it got wrong.
#include "scheduler/cost_model.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
    "stages": [{"f": 1.5}, {"b": 4, "activation_bytes": 1024, "workspace_bytes": 256}],
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
  EXPECT_THAT(costs.comm, ::testing::ElementsAre(0.1, 0.2));
}

TEST(CostModelTest, ParsesMinimalFileAsBuiltInDefaults) {
  PS_ASSERT_OK_AND_ASSIGN(const CostModel costs, ParseCostModelJson(R"({"comm": 0.3})"));
  EXPECT_EQ(costs.uniform.f, 1);
  EXPECT_EQ(costs.uniform.b, 2);
  EXPECT_EQ(costs.comm_uniform, 0.3);
  EXPECT_TRUE(costs.stages.empty());
  EXPECT_TRUE(costs.comm.empty());
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
                                   HasSubstr("expected version, default, stages, comm"))));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"fwd": 1}})"),
              StatusIs(kBad, HasSubstr("unknown key \"default.fwd\"")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [{}, {"f": -1}]})"),
              StatusIs(kBad, HasSubstr("\"stages[1].f\" must be a non-negative number, got -1")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [{"b": "2"}]})"),
              StatusIs(kBad, HasSubstr("\"stages[0].b\" must be a non-negative number, got "
                                       "\"2\"")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"workspace_bytes": 1.5}})"),
              StatusIs(kBad, HasSubstr("\"default.workspace_bytes\" must be a non-negative "
                                       "integer, got 1.5")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": {"f": 1}})"),
              StatusIs(kBad, HasSubstr("\"stages\" must be an array")));
  EXPECT_THAT(ParseCostModelJson(R"({"stages": [3]})"),
              StatusIs(kBad, HasSubstr("\"stages[0]\" must be an object")));
  EXPECT_THAT(ParseCostModelJson(R"({"comm": [0.1, -0.2]})"),
              StatusIs(kBad, HasSubstr("\"comm[1]\" must be a non-negative number")));
  EXPECT_THAT(ParseCostModelJson(R"({"comm": "fast"})"),
              StatusIs(kBad, HasSubstr("\"comm\" must be a non-negative number")));
  EXPECT_THAT(ParseCostModelJson(R"({"default": {"activation_bytes": 1.5}})"),
              StatusIs(kBad, HasSubstr("\"default.activation_bytes\" must be a non-negative "
                                       "integer")));
}

}  // namespace
}  // namespace pipesched::scheduler
