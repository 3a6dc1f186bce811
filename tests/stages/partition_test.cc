// Partitioning: balanced splits minimise the slowest chunk, explicit splits are checked,
// and impossible partitions are one-sentence errors.
#include "pipesched/stages/partition.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PartitionTest, BalancedSplitsUniformCostsEvenly) {
  PS_ASSERT_OK_AND_ASSIGN(auto r, PartitionBalanced({1, 1, 1, 1, 1, 1}, 3));
  EXPECT_EQ(PartitionToString(r), "[0,2) [2,4) [4,6)");
}

TEST(PartitionTest, BalancedMinimisesTheSlowestChunk) {
  // One heavy layer gets a chunk of its own.
  PS_ASSERT_OK_AND_ASSIGN(auto r, PartitionBalanced({1, 1, 6, 1, 1, 1}, 3));
  EXPECT_EQ(PartitionToString(r), "[0,2) [2,3) [3,6)");
  PS_ASSERT_OK_AND_ASSIGN(auto one, PartitionBalanced({3, 4}, 1));
  EXPECT_THAT(one, ElementsAre(LayerRange{0, 2}));
  PS_ASSERT_OK_AND_ASSIGN(auto each, PartitionBalanced({3, 4, 5}, 3));
  EXPECT_EQ(PartitionToString(each), "[0,1) [1,2) [2,3)");
}

TEST(PartitionTest, MlpBalancesByFlops) {
  // d_in = 512 makes block 0 eight times a 64-wide block: it gets a chunk alone.
  model::MlpConfig config{.d_in = 512, .d_hidden = 64, .num_classes = 8, .num_layers = 4};
  PS_ASSERT_OK_AND_ASSIGN(auto r, PartitionMlp(config, 2));
  EXPECT_EQ(PartitionToString(r), "[0,1) [1,5)");
}

TEST(PartitionTest, ExplicitCountsLayersWithTheHeadLast) {
  model::MlpConfig config{.d_in = 8, .d_hidden = 8, .num_classes = 4, .num_layers = 4};
  PS_ASSERT_OK_AND_ASSIGN(auto r, PartitionMlp(config, 3, {2, 2, 1}));
  EXPECT_EQ(PartitionToString(r), "[0,2) [2,4) [4,5)");
}

TEST(PartitionTest, ImpossiblePartitionsAreErrors) {
  model::MlpConfig config{.d_in = 8, .d_hidden = 8, .num_classes = 4, .num_layers = 4};
  EXPECT_THAT(PartitionMlp(config, 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4 blocks + head = 5 layers cannot fill 8 chunks")));
  EXPECT_THAT(PartitionMlp(config, 3, {2, 3, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("chunk 2 of the partition (2,3,0) has 0 layers")));
  EXPECT_THAT(PartitionMlp(config, 3, {2, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lists 2 chunk sizes (2,2) but the pipeline has 3 chunks")));
  EXPECT_THAT(PartitionMlp(config, 2, {2, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("covers 4 layers but the model has 5")));
  // Counts whose sum wraps around int (to 4 + 1 = 5 here) are refused one by one.
  EXPECT_THAT(PartitionMlp(config, 3, {2147483647, 2147483647, 7}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gives chunk 0 2147483647 layers but only 5 of the model's 5 "
                                 "are left for it")));
  EXPECT_THAT(PartitionMlp(config, 3, {3, 2, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gives chunk 2 1 layers but only 0 of the model's 5")));
  EXPECT_THAT(PartitionBalanced({1, -1}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("costs must be >= 0")));
  EXPECT_THAT(PartitionBalanced({1, 1}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1, not 0")));
}

}  // namespace
}  // namespace pipesched::stages
