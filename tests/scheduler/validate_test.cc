// Validate(): hand-written good and bad schedules. Every rejection asserts the code, the
// words a user reads on the first line, and the grid with its arrow at the action.
#include "pipesched/scheduler/validate.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hand_schedule.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::scheduler::testing::HandSchedule;
using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// 1F1B, P=2, M=2:
//   rank 0 | 0F0 0F1 0B0 0B1
//   rank 1 | 1F0 1B0 1F1 1B1
Schedule OneFOneB() { return HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"}); }

// The grid with the arrow at (rank, step), exactly as the error must carry it.
std::string GridAt(const Schedule& schedule, int rank, int step) {
  return RenderProgramGrid(schedule, rank, step);
}

TEST(ValidateTest, AcceptsHandWritten1F1B) { PS_EXPECT_OK(Validate(OneFOneB())); }

TEST(ValidateTest, AcceptsSplitBackwardAndAllReduce) {
  const Schedule s = HandSchedule(
      2, 1, 2, {"0F0 0F1 0I0 0I1 0W0 0W1 0ALLREDUCE", "1F0 1I0 1F1 1W0 1I1 1W1 1ALLREDUCE"});
  PS_EXPECT_OK(Validate(s));
}

TEST(ValidateTest, AcceptsInterleavedLoopAndVPlacement) {
  // Loop: stages 0, 2 on rank 0; 1, 3 on rank 1.
  PS_EXPECT_OK(Validate(HandSchedule(2, 2, 1, {"0F0 2F0 2B0 0B0", "1F0 3F0 3B0 1B0"})));
  // V: stages 0, 3 on rank 0; 1, 2 on rank 1.
  PS_EXPECT_OK(
      Validate(HandSchedule(2, 2, 1, {"0F0 3F0 3B0 0B0", "1F0 2F0 2B0 1B0"}, PlacementKind::kV)));
}

TEST(ValidateTest, AcceptsLoweredTransfersAsMarkers) {
  PS_EXPECT_OK(
      Validate(HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"})));
}

TEST(ValidateTest, RejectsMissingBackward) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("rank 1 step 2: action 1F1 has no backward"),
                             HasSubstr("missing action 1B1"), HasSubstr(GridAt(s, 1, 2)),
                             HasSubstr("[1F1]"), HasSubstr("^^^ rank 1, step 2"))));
}

TEST(ValidateTest, RejectsMissingForward) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1B1"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 1 step 2: action 1B1 has no matching "
                                                     "forward 1F1"),
                                          HasSubstr(GridAt(s, 1, 2)))));
}

TEST(ValidateTest, RejectsMicrobatchMissingEntirely) {
  const Schedule s = HandSchedule(1, 1, 2, {"0F0 0B0"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("missing action 0F1: stage 0 micro-batch 1 has no forward "
                                        "on rank 0"),
                             HasSubstr(GridAt(s, 0, 2)))));
}

TEST(ValidateTest, RejectsDuplicate) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 0 step 3: action 0F1 is a duplicate "
                                                     "(first at rank 0 step 1)"),
                                          HasSubstr(GridAt(s, 0, 3)), HasSubstr("[0F1]"))));
}

TEST(ValidateTest, ChecksAnExplicitPlacement) {
  Schedule s = HandSchedule(2, 1, 1, {"1F0 1B0", "0F0 0B0"}, PlacementKind::kExplicit);
  s.placement.stage_ranks = {1, 0};
  PS_EXPECT_OK(Validate(s));
  s.placement.stage_ranks = {1};
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("schedule 'hand': explicit placement lists 1 stage "
                                               "ranks for P x V = 2 x 1 = 2 stages")));
  s.placement.stage_ranks = {1, 1};
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("puts stage 1 on rank 1, which holds V = 1 stages "
                                              "already; every rank holds V stages")));
  s.placement.stage_ranks = {-1, 0};
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("puts stage 0 on rank -1; ranks are 0..1")));
  // Loop and v compute their ranks; a list next to them is a mistake, not ignored.
  s.placement.kind = PlacementKind::kLoop;
  s.placement.stage_ranks = {1, 0};
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("loop placement with 2 explicit stage ranks")));
  EXPECT_EQ(s.placement.RankOf(0), 0);
}

TEST(ValidateTest, RejectsWrongRank) {
  // 1F0 belongs on rank 1 (loop placement, P=2) but sits on rank 0.
  const Schedule s = HandSchedule(2, 1, 1, {"0F0 1F0 0B0", "1B0"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("rank 0 step 1: action 1F0 is on rank 0 but stage 1 is "
                                        "placed on rank 1 (loop placement"),
                             HasSubstr(GridAt(s, 0, 1)))));
}

TEST(ValidateTest, RejectsWrongRankUnderVPlacement) {
  // V placement, P=2, V=2: stage 2 lives on rank 1, not rank 0.
  const Schedule s =
      HandSchedule(2, 2, 1, {"0F0 2F0 2B0 0B0", "1F0 3F0 3B0 1B0"}, PlacementKind::kV);
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 0 step 1: action 2F0 is on rank 0 but "
                                               "stage 2 is placed on rank 1 (v placement")));
}

TEST(ValidateTest, RejectsWrongOrderOnARank) {
  const Schedule s = HandSchedule(2, 1, 1, {"0F0 0B0", "1B0 1F0"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("rank 1 step 0: action 1B0 waits for 1F0, which comes "
                                        "later on the same rank (step 1)"),
                             HasSubstr(GridAt(s, 1, 0)), HasSubstr("[1B0]"))));
}

TEST(ValidateTest, RejectsWrongOrderAcrossChunksOfOneRank) {
  // P=1, V=2: 0B0 needs 1B0's input gradient, which comes after it.
  const Schedule s = HandSchedule(1, 2, 1, {"0F0 1F0 0B0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 0 step 2: action 0B0 waits for 1B0, "
                                                     "which comes later on the same rank (step "
                                                     "3)"),
                                          HasSubstr(GridAt(s, 0, 2)))));
}

TEST(ValidateTest, RejectsDeadlockAcrossRanks) {
  // Rank 0 waits in 0B0 for 1B0; rank 1 runs 1F1 first, which waits for 0F1 behind 0B0.
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(StartsWith("deadlock: no rank can run its next action;"),
                             HasSubstr("rank 0 blocked at 0B0 (waits for 1B0 on rank 1)"),
                             HasSubstr("rank 1 blocked at 1F1 (waits for 0F1 on rank 0)"),
                             HasSubstr("(2 of 8 actions ran)"), HasSubstr(GridAt(s, 0, 1)),
                             HasSubstr("[0B0]"))));
}

TEST(ValidateTest, DeadlockNamesEveryBlockedRank) {
  // Ranks 0 and 1 are in a cycle; rank 2 is starved by it.
  const Schedule s =
      HandSchedule(3, 1, 2, {"0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1", "2F0 2B0 2F1 2B1"});
  const absl::Status status = Validate(s);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                               AllOf(HasSubstr("rank 0 blocked at 0B0 (waits for 1B0 on rank 1)"),
                                     HasSubstr("rank 1 blocked at 1F1 (waits for 0F1 on rank 0)"),
                                     HasSubstr("rank 2 blocked at 2F1 (waits for 1F1 on rank "
                                               "1)"))));
}

// A cycle far down a long pipeline: ranks 15 and 16 wait for each other (15B0 for 16B0,
// whose 16F1 waits for 15F1 behind 15B0), and ranks 0-14 and 17-29 only wait behind
// them. The message names the cycle's ranks first and says they are the cause; the
// grid's arrow is at rank 15.
TEST(ValidateTest, DeadlockNamesTheCycleThatCausesIt) {
  PS_ASSERT_OK_AND_ASSIGN(Schedule s, GenerateSchedule("1f1b", {30, 2, 1}));
  s.programs[15] = {{15, 0, Op::kF}, {15, 0, Op::kB}, {15, 1, Op::kF}, {15, 1, Op::kB}};
  const absl::Status status = Validate(s);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const std::string first_line(status.message().substr(0, status.message().find('\n')));
  EXPECT_THAT(first_line,
              AllOf(StartsWith("deadlock: no rank can run its next action; rank 15 blocked at "
                               "15B0 (waits for 16B0 on rank 16); rank 16 blocked at 16F1 "
                               "(waits for 15F1 on rank 15); rank 0 blocked at "),
                    HasSubstr("; the cause: ranks 15 and 16 wait for each other, and the other "
                              "28 blocked ranks wait behind them (")));
  EXPECT_THAT(status.message(), HasSubstr(GridAt(s, 15, 1)));
}

TEST(ValidateTest, SimulateReportsTheSameDeadlock) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"});
  EXPECT_EQ(Simulate(s, CostModel{}).status(), Validate(s));
}

TEST(ValidateTest, RejectsBadShape) {
  Schedule s = OneFOneB();
  s.placement.num_ranks = 0;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("P (ranks) must be >= 1, got 0")));
  s = OneFOneB();
  s.placement.num_chunks = 0;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("V (chunks per rank) must be >= 1, got 0")));
  s = OneFOneB();
  s.num_microbatches = 0;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("M (micro-batches) must be >= 1, got 0")));
  s = OneFOneB();
  s.programs.pop_back();
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("has 1 rank programs but P = 2")));
  s = OneFOneB();
  s.num_microbatches = 1000000;
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 8 actions, fewer than")));
}

TEST(ValidateTest, RejectsOutOfRangeStageAndMicrobatch) {
  Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1 2F0", "1F0 1B0 1F1 1B1"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 0 step 4: action 2F0 has stage 2, "
                                                     "outside [0, 2) (P=2 x V=1)"),
                                          HasSubstr(GridAt(s, 0, 4)))));
  s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1 1F2"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 1 step 4: action 1F2 has micro-batch 2, "
                                               "outside [0, 2)")));
  // An op outside the enum (a hand-built action) is named where it is, not as the
  // backward it leaves without a forward.
  s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"});
  s.programs[0][1].op = static_cast<Op>(42);
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 0 step 1: action 0?1 has op 42, not one of F, "
                                               "B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, "
                                               "ALLREDUCE")));
}

// ALLREDUCE's micro-batch is ignored, so any other value than the documented -1 is a
// mistake (a hand-built schedule, or a file written by another tool).
TEST(ValidateTest, RejectsAnAllReduceWithAMicrobatch) {
  Schedule s = HandSchedule(1, 1, 1, {"0F0 0B0 0ALLREDUCE"});
  PS_ASSERT_OK(Validate(s));
  s.programs[0][2].microbatch = 99999;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 0 step 2: action 0ALLREDUCE has "
                                                     "micro-batch 99999; an ALLREDUCE reduces "
                                                     "every micro-batch of its stage and takes -1"),
                                          HasSubstr(GridAt(s, 0, 2)))));
  s.programs[0][2].microbatch = 0;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("has micro-batch 0; an ALLREDUCE")));
}

TEST(ValidateTest, RejectsMixedBackward) {
  const Schedule s = HandSchedule(1, 1, 1, {"0F0 0B0 0W0"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 0 step 2: action 0W0 mixes a full "
                                                     "backward B with a split backward I/W"),
                                          HasSubstr(GridAt(s, 0, 2)))));
}

TEST(ValidateTest, RejectsHalfASplitBackward) {
  EXPECT_THAT(Validate(HandSchedule(1, 1, 1, {"0F0 0I0"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("rank 0 step 1: action 0I0 has no matching W: missing action "
                                  "0W0")));
  EXPECT_THAT(Validate(HandSchedule(1, 1, 1, {"0F0 0W0"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("rank 0 step 1: action 0W0 has no matching I")));
}

TEST(ValidateTest, RejectsAllReduceBeforeBackwardOrTwice) {
  Schedule s = HandSchedule(1, 1, 2, {"0F0 0B0 0ALLREDUCE 0F1 0B1"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(StartsWith("rank 0 step 2: action 0ALLREDUCE comes "
                                                     "before 0B1 (step 4)"),
                                          HasSubstr(GridAt(s, 0, 2)))));
  s = HandSchedule(1, 1, 1, {"0F0 0I0 0ALLREDUCE 0W0"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 0 step 2: action 0ALLREDUCE comes before "
                                               "0W0 (step 3)")));
  s = HandSchedule(1, 1, 1, {"0F0 0B0 0ALLREDUCE 0ALLREDUCE"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 0 step 3: action 0ALLREDUCE is a duplicate "
                                               "(first at rank 0 step 2)")));
}

TEST(ValidateTest, RejectsTransferPastTheEnds) {
  const Schedule s = HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1SEND_F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 1 step 1: action 1SEND_F0 transfers across "
                                               "a boundary that does not exist")));
  EXPECT_THAT(Validate(HandSchedule(2, 1, 1, {"0RECV_F0 0F0 0B0", "1F0 1B0"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("rank 0 step 0: action 0RECV_F0 transfers")));
}

// Lowered transfers follow PyTorch: a RECV blocks until its SEND is issued. Rank 0 waits
// for B0's gradient before it sends F0's activation: a deadlock that used to validate.
TEST(ValidateTest, RejectsTransfersThatDeadlock) {
  const Schedule s =
      HandSchedule(2, 1, 1, {"0RECV_B0 0F0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(StartsWith("deadlock: no rank can run its next action; rank 0 "
                                        "blocked at 0RECV_B0 (waits for 1SEND_B0 on rank 1); "
                                        "rank 1 blocked at 1RECV_F0 (waits for 0SEND_F0 on "
                                        "rank 0) (0 of 8 actions ran)"),
                             HasSubstr(GridAt(s, 0, 0)))));
  // The simulator walks the same graph.
  EXPECT_THAT(Simulate(s, CostModel{}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("0RECV_B0")));
}

TEST(ValidateTest, RejectsUnmatchedDuplicateAndMisorderedTransfers) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  Schedule s = HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0B0", "1F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, AllOf(StartsWith("rank 0 step 1: action 0SEND_F0 has "
                                                           "no matching receive: missing action "
                                                           "1RECV_F0 on rank 1"),
                                                HasSubstr(GridAt(s, 0, 1)))));
  s = HandSchedule(2, 1, 1, {"0F0 0B0", "1RECV_F0 1F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 1 step 0: action 1RECV_F0 has no "
                                                     "matching send: missing action 0SEND_F0 on "
                                                     "rank 0")));
  s = HandSchedule(2, 1, 1, {"0F0 0RECV_B0 0B0", "1F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, HasSubstr("0RECV_B0 has no matching send: missing "
                                                    "action 1SEND_B0 on rank 1")));
  s = HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1B0 1SEND_B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, HasSubstr("1SEND_B0 has no matching receive: missing "
                                                    "action 0RECV_B0 on rank 0")));
  s = HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 0 step 2: action 0SEND_F0 is a "
                                                     "duplicate (first at rank 0 step 1)")));
  s = HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0B0", "1RECV_F0 1RECV_F0 1F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 1 step 1: action 1RECV_F0 is a "
                                                     "duplicate")));
  s = HandSchedule(2, 1, 1, {"0SEND_F0 0F0 0B0", "1RECV_F0 1F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 0 step 0: action 0SEND_F0 comes "
                                                     "before 0F0 (step 1), which computes what "
                                                     "it sends")));
  s = HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0B0", "1F0 1RECV_F0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 1 step 0: action 1F0 comes before "
                                                     "1RECV_F0 (step 1), which receives its "
                                                     "input")));
  s = HandSchedule(2, 1, 1, {"0F0 0B0 0RECV_B0", "1F0 1B0 1SEND_B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 0 step 1: action 0B0 comes before "
                                                     "0RECV_B0 (step 2)")));
  s = HandSchedule(2, 1, 1, {"0F0 0RECV_B0 0B0", "1F0 1SEND_B0 1B0"});
  EXPECT_THAT(Validate(s), StatusIs(kBad, StartsWith("rank 1 step 1: action 1SEND_B0 comes "
                                                     "before 1B0 (step 2)")));
  // Split backward: SEND_B follows I; a full set of transfers around ZB-H1-like order.
  PS_EXPECT_OK(Validate(
      HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0RECV_B0 0I0 0W0", "1RECV_F0 1F0 1I0 1SEND_B0 1W0"})));
}

// NCCL pairs two ranks' transfers in order: rank 1 receiving micro-batch 1 before 0
// while rank 0 sends 0 first would hand it micro-batch 0's activations as 1's. Each
// receive waits for its own send here, so this is no deadlock; it is refused as such.
TEST(ValidateTest, RejectsReceivesOutOfTheSendersOrder) {
  const Schedule s = HandSchedule(2, 1, 2,
                                  {"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                                   "1RECV_F1 1RECV_F0 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1"});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("rank 1 step 0: action 1RECV_F1 is rank 1's 1st receive "
                                        "from rank 0, but rank 0's 1st send to rank 1 is "
                                        "0SEND_F0 (received by 1RECV_F0 at step 1): NCCL pairs "
                                        "two ranks' transfers in order, so this receive would "
                                        "get 0SEND_F0's data; receive from rank 0 in the order "
                                        "rank 0 sends\n"),
                             HasSubstr(GridAt(s, 1, 0)))));
  EXPECT_THAT(Simulate(s, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1st receive")));
  // The backward direction too: rank 0 receives B1 before B0, rank 1 sends B0 first.
  const Schedule b = HandSchedule(2, 1, 2,
                                  {"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0RECV_B0 0B0 0B1",
                                   "1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1"});
  EXPECT_THAT(Validate(b), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("rank 0 step 4: action 0RECV_B1 is rank 0's 1st "
                                               "receive from rank 1, but rank 1's 1st send to "
                                               "rank 0 is 1SEND_B0")));
  // In the senders' order, with the two directions interleaved: fine.
  PS_EXPECT_OK(Validate(HandSchedule(2, 1, 2,
                                     {"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                                      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"})));
}

// A 100000-rank file with a problem on its last row printed all 100000 rows (3 MB).
TEST(ValidateTest, TallGridsAreCutAroundTheMark) {
  std::vector<std::string> rows;
  for (int r = 0; r < 1000; ++r) rows.push_back(absl::StrCat(r, "F0 ", r, "B0"));
  rows.back() += " 999B0";
  const Schedule s = HandSchedule(1000, 1, 1, rows);
  const absl::Status status = Validate(s);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(StartsWith("rank 999 step 2: action 999B0 is a duplicate"),
                                     HasSubstr("| ... 979 ranks above not shown\nrank 979 |"),
                                     HasSubstr("rank 999 |"), Not(HasSubstr("rank 978 ")))));
  EXPECT_LT(std::count(status.message().begin(), status.message().end(), '\n'), 26);
  // Marked in the middle: 10 on each side.
  const std::string grid = RenderProgramGrid(s, 500, 0);
  EXPECT_THAT(grid, AllOf(HasSubstr("... 490 ranks above not shown"), HasSubstr("rank 490 |"),
                          HasSubstr("rank 510 |"), HasSubstr("... 489 ranks below not shown"),
                          Not(HasSubstr("rank 511 "))));
  // A deadlock names the first 8 blocked ranks: rank 0 waits for 1B0, every other rank
  // for the F1 of the rank before it.
  rows = {"0F0 0B0 0F1 0B1"};
  for (int r = 1; r < 20; ++r) rows.push_back(absl::StrFormat("%dF1 %dF0 %dB0 %dB1", r, r, r, r));
  EXPECT_THAT(Validate(HandSchedule(20, 1, 2, rows)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank 7 blocked at 7F1"), Not(HasSubstr("rank 8 blocked")),
                             HasSubstr("; and 12 more ranks blocked; the cause: ranks 0 and 1 "
                                       "wait for each other, and the other 18 blocked ranks "
                                       "wait behind them (1 of 80 actions ran)"))));
}

}  // namespace
}  // namespace pipesched::scheduler
