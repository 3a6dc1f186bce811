// Action text form: every op round-trips through ToString / ParseAction, PyTorch's
// spellings are accepted, and bad tokens are errors that quote the token.
#include "pipesched/scheduler/action.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(OpNameTest, NamesEveryOp) {
  EXPECT_EQ(OpName(Op::kF), "F");
  EXPECT_EQ(OpName(Op::kB), "B");
  EXPECT_EQ(OpName(Op::kI), "I");
  EXPECT_EQ(OpName(Op::kW), "W");
  EXPECT_EQ(OpName(Op::kSendF), "SEND_F");
  EXPECT_EQ(OpName(Op::kRecvF), "RECV_F");
  EXPECT_EQ(OpName(Op::kSendB), "SEND_B");
  EXPECT_EQ(OpName(Op::kRecvB), "RECV_B");
  EXPECT_EQ(OpName(Op::kAllReduce), "ALLREDUCE");
}

TEST(OpNameTest, ComputeOpsAreFBIW) {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const bool expected = op == Op::kF || op == Op::kB || op == Op::kI || op == Op::kW;
    EXPECT_EQ(IsCompute(op), expected) << OpName(op);
  }
}

TEST(ActionTextTest, PrintsPyTorchGrammar) {
  EXPECT_EQ(ToString({2, 0, Op::kF}), "2F0");
  EXPECT_EQ(ToString({3, 1, Op::kI}), "3I1");
  EXPECT_EQ(ToString({3, 1, Op::kW}), "3W1");
  EXPECT_EQ(ToString({0, 7, Op::kB}), "0B7");
  EXPECT_EQ(ToString({1, 4, Op::kSendF}), "1SEND_F4");
  EXPECT_EQ(ToString({1, 4, Op::kRecvF}), "1RECV_F4");
  EXPECT_EQ(ToString({12, 30, Op::kSendB}), "12SEND_B30");
  EXPECT_EQ(ToString({1, 4, Op::kRecvB}), "1RECV_B4");
  EXPECT_EQ(ToString({2, -1, Op::kAllReduce}), "2ALLREDUCE");
}

TEST(ActionTextTest, EveryOpRoundTrips) {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    for (int stage : {0, 3, 17}) {
      for (int mb : {0, 1, 42}) {
        const Action action{stage, op == Op::kAllReduce ? -1 : mb, op};
        const std::string text = ToString(action);
        absl::StatusOr<Action> parsed = ParseAction(text);
        ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
        EXPECT_EQ(*parsed, action) << text;
        EXPECT_EQ(ToString(*parsed), text);
      }
    }
  }
}

TEST(ActionTextTest, ParsesFields) {
  absl::StatusOr<Action> a = ParseAction("1SEND_F4");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->stage, 1);
  EXPECT_EQ(a->microbatch, 4);
  EXPECT_EQ(a->op, Op::kSendF);
}

TEST(ActionTextTest, AcceptsReduceGradAndWhitespace) {
  absl::StatusOr<Action> a = ParseAction("2REDUCE_GRAD");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (Action{2, -1, Op::kAllReduce}));
  absl::StatusOr<Action> b = ParseAction("  3W1\t");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (Action{3, 1, Op::kW}));
}

TEST(ActionTextTest, BadTokensNameTheTokenAndTheGrammar) {
  for (const char* bad :
       {"", "F0", "2X0", "2F", "2f0", "2F0x", "2ALLREDUCE3", "2REDUCE_GRAD1", "-1F0", "2F-1",
        "2 F0", "99999999999F0", "2F99999999999", "2SEND_F", "2SEND_X4", "2B0 3B1"}) {
    EXPECT_THAT(ParseAction(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(std::string("\"") + bad + "\""),
                               HasSubstr("<stage><op><microbatch>"), HasSubstr("\"2F0\""))))
        << bad;
  }
}

TEST(ActionTextTest, ErrorSaysWhatIsWrong) {
  EXPECT_THAT(ParseAction("2X0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown op \"X\"")));
  EXPECT_THAT(ParseAction("2F"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a micro-batch")));
  EXPECT_THAT(ParseAction("2ALLREDUCE0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("takes no micro-batch")));
  EXPECT_THAT(ParseAction("F0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage number")));
  EXPECT_THAT(ParseAction("0F-1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad action \"0F-1\": the micro-batch number is negative; "
                                 "micro-batches count from 0")));
  // PyTorch's FSDP actions: named for what they are and what to do instead.
  EXPECT_THAT(ParseAction("1UNSHARD"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("UNSHARD is an FSDP action (parameter all-gather and release), "
                                 "which pipesched does not model: drop the UNSHARD and RESHARD "
                                 "actions (a PyTorch CSV file's are skipped)")));
  EXPECT_THAT(ParseAction("0RESHARD"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RESHARD is an FSDP action")));
}

}  // namespace
}  // namespace pipesched::scheduler
