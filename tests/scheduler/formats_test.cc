// Schedule file formats: PyTorch CSV files written by PyTorch's own tooling load with
// the right shape and re-export byte for byte; the JSON format round-trips; every kind
// of bad input is InvalidArgument naming the problem.
#include "pipesched/scheduler/formats.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/file_util.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Shared(const std::string& relative) {
  return std::string(PIPESCHED_SHARED_DIR) + "/" + relative;
}

std::string Slurp(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

std::string TempFile(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + "/formats_test_" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(PytorchCsvTest, TwoRankFileIsLoopPlacementWithTwoChunks) {
  const std::string path = Shared("interop/pytorch/2-rank.csv");
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile file, LoadScheduleFile(path));
  const Schedule& s = file.schedule;
  EXPECT_EQ(s.num_ranks(), 2);
  EXPECT_EQ(s.num_chunks(), 2);
  EXPECT_EQ(s.num_stages(), 4);
  EXPECT_EQ(s.num_microbatches, 8);
  EXPECT_EQ(s.placement.kind, PlacementKind::kLoop);
  EXPECT_EQ(s.name, "2-rank");
  EXPECT_FALSE(file.costs.has_value());
  ASSERT_EQ(s.programs.size(), 2u);
  EXPECT_EQ(s.programs[0].size(), 48u);  // 2 stages x 8 micro-batches x (F, I, W)
  EXPECT_EQ(s.programs[0][8], (Action{2, 0, Op::kF}));
  EXPECT_EQ(s.programs[1][17], (Action{3, 0, Op::kW}));
  EXPECT_EQ(ToPytorchCsv(s), Slurp(path));
}

// A CSV is named by its file's stem, which may hold any byte but '/': control characters
// become '?' (the name reaches terminals, pictures and JSON, and a JSON "name" with one
// would not load again).
TEST(PytorchCsvTest, NameFromTheFileHasNoControlCharacters) {
  const std::string path = TempFile(
      "esc\x1b[31mred\x01\xC2\x9B"
      "1m\xC3\xA9.csv",
      "0F0,0B0\n");
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile file, LoadScheduleFile(path));
  EXPECT_EQ(file.schedule.name, "formats_test_esc?[31mred??1m\xC3\xA9");  // e-acute kept
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile again,
                          ParseScheduleJson(ToScheduleJson(file.schedule, nullptr)));
  EXPECT_EQ(again.schedule.name, file.schedule.name);
}

TEST(PytorchCsvTest, EightRankFileIsOneChunkPerRank) {
  const std::string path = Shared("interop/pytorch/8-rank.csv");
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile file, LoadScheduleFile(path));
  const Schedule& s = file.schedule;
  EXPECT_EQ(s.num_ranks(), 8);
  EXPECT_EQ(s.num_chunks(), 1);
  EXPECT_EQ(s.num_microbatches, 10);
  EXPECT_EQ(s.placement.kind, PlacementKind::kLoop);
  EXPECT_TRUE(s.SplitsBackward());
  EXPECT_EQ(s.NumActions(), 8u * 10 * 3);
  EXPECT_EQ(ToPytorchCsv(s), Slurp(path));
}

TEST(PytorchCsvTest, SharedFilesValidateAndSimulate) {
  for (const char* f : {"interop/pytorch/2-rank.csv", "interop/pytorch/8-rank.csv"}) {
    PS_ASSERT_OK_AND_ASSIGN(ScheduleFile file, LoadScheduleFile(Shared(f)));
    PS_EXPECT_OK(Validate(file.schedule)) << f;
    absl::StatusOr<SimResult> sim = Simulate(file.schedule, CostModel{});
    PS_ASSERT_OK(sim) << f;
    EXPECT_GT(sim->makespan, 0) << f;
    EXPECT_EQ(sim->timeline.num_ranks, file.schedule.num_ranks()) << f;
  }
}

TEST(PytorchCsvTest, InfersVPlacement) {
  // ZB-V shape on 2 ranks: stages 0 and 3 on rank 0, stages 1 and 2 on rank 1.
  PS_ASSERT_OK_AND_ASSIGN(Schedule s, ParsePytorchCsv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n"));
  EXPECT_EQ(s.placement.kind, PlacementKind::kV);
  EXPECT_EQ(s.num_chunks(), 2);
  EXPECT_EQ(s.num_microbatches, 1);
}

TEST(PytorchCsvTest, DropsIdleCellsAndAcceptsCrlfAndSpaces) {
  PS_ASSERT_OK_AND_ASSIGN(
      Schedule s, ParsePytorchCsv("0F0,,0B0, 0ALLREDUCE\r\n,1F0, 1B0 ,,1REDUCE_GRAD\r\n\r\n"));
  ASSERT_EQ(s.programs.size(), 2u);
  EXPECT_EQ(s.programs[0].size(), 3u);
  EXPECT_EQ(s.programs[1][0], (Action{1, 0, Op::kF}));
  EXPECT_EQ(s.programs[1][2], (Action{1, -1, Op::kAllReduce}));
  // Written with PyTorch's name: its _Action.from_str has no ALLREDUCE.
  EXPECT_EQ(ToPytorchCsv(s), "0F0,0B0,0REDUCE_GRAD\n1F0,1B0,1REDUCE_GRAD\n");
  PS_EXPECT_OK(Validate(s));
}

// PyTorch's default dump (_dump_csv, format "compute_comms") of a schedule with several
// stages per rank: csv.writer's "\r\n", an empty cell per idle step, and FSDP's UNSHARD
// and RESHARD around each stage's work, FSDP or not. It loads as the same schedule as the
// compute-only file, and a quoting writer's "0F0" cells load too.
TEST(PytorchCsvTest, PytorchsCommsDumpLoadsAsItsComputeActions) {
  PS_ASSERT_OK_AND_ASSIGN(Schedule plain, GenerateSchedule("interleaved-1f1b", {2, 2, 2}));
  ASSERT_EQ(ToPytorchCsv(plain),
            "0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1\n1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1\n");
  const std::string dump =
      "0UNSHARD,2UNSHARD,0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1,0RESHARD,2RESHARD\r\n"
      ",1UNSHARD,3UNSHARD,1F0,1F1,3F0,,3B0,3F1,3B1,1B0,1B1,1RESHARD,3RESHARD\r\n";
  PS_ASSERT_OK_AND_ASSIGN(Schedule loaded, ParsePytorchCsv(dump));
  EXPECT_EQ(loaded.programs, plain.programs);
  EXPECT_EQ(loaded.placement.kind, PlacementKind::kLoop);
  EXPECT_EQ(loaded.num_chunks(), 2);
  PS_EXPECT_OK(Validate(loaded));
  EXPECT_EQ(ToPytorchCsv(loaded), ToPytorchCsv(plain));

  PS_ASSERT_OK_AND_ASSIGN(Schedule quoted, ParsePytorchCsv("\"0F0\",\"0F1\",\"0B0\",\"0B1\"\n"));
  EXPECT_EQ(ToPytorchCsv(quoted), "0F0,0F1,0B0,0B1\n");
  // The column of a bad quoted token is the token's own, inside the quote.
  EXPECT_THAT(
      ParsePytorchCsv("0F0,\"0X1\"\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("line 1, column 6: bad action \"0X1\""), HasSubstr("unknown op"))));
  // A comma inside quotes cuts the quoted cell in two: said so, not "no stage number".
  EXPECT_THAT(ParsePytorchCsv("\"0F0,0B0\"\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 1, column 1: bad action \"\\\"0F0\": a quote is not "
                                 "closed within its cell; a comma inside quotes is not read, so "
                                 "write one action per cell (0F0,0B0)")));
  // A marker names no micro-batch; one with a micro-batch is not PyTorch's and is refused.
  EXPECT_THAT(ParsePytorchCsv("0F0,0UNSHARD1,0B0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 1, column 5: bad action \"0UNSHARD1\"")));
  // A rank whose row holds only markers has no work.
  EXPECT_THAT(
      ParsePytorchCsv("0F0,0B0\n1UNSHARD,1RESHARD\n"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2 (rank 1) has no actions")));
}

TEST(PytorchCsvTest, LoweredActionsRoundTrip) {
  const std::string csv = "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n";
  PS_ASSERT_OK_AND_ASSIGN(Schedule s, ParsePytorchCsv(csv));
  EXPECT_EQ(s.programs[1][0], (Action{1, 0, Op::kRecvF}));
  EXPECT_EQ(ToPytorchCsv(s), csv);
}

TEST(PytorchCsvTest, OverlappedPairsAreReadAsTheirActionsInOrder) {
  // PyTorch's ScheduleDualPipeV writes a forward and a full backward issued together as
  // "(F;B)OVERLAP_F_B"; pipesched issues them one after the other. This is dualpipe-v's
  // P=2, M=4 program with its pairs written that way (line 2 spaced as a user might).
  const std::string overlapped =
      "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,"
      "(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,0I3,0W3\n"
      "1F0,2F0,1F1,2F1, (1F2; 2B0)OVERLAP_F_B ,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,"
      "(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,2W3,1W3\n";
  PS_ASSERT_OK_AND_ASSIGN(Schedule s, ParsePytorchCsv(overlapped));
  PS_ASSERT_OK_AND_ASSIGN(Schedule generated, GenerateSchedule("dualpipe-v", {2, 4, 0}));
  EXPECT_EQ(s.placement.kind, PlacementKind::kV);
  EXPECT_EQ(s.programs, generated.programs);
  PS_EXPECT_OK(Validate(s));
}

TEST(PytorchCsvTest, BadOverlappedPairsNameTheirCell) {
  EXPECT_THAT(ParsePytorchCsv("0F0,(0F1)OVERLAP_F_B\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "line 1, column 5: \"(0F1)OVERLAP_F_B\" overlaps fewer than two actions; "
                       "write the action alone, or pair a forward with a backward such as "
                       "\"(0F3;5B1)OVERLAP_F_B\""));
  EXPECT_THAT(ParsePytorchCsv("0F0,(0F1;0B0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "line 1, column 5: bad action \"(0F1;0B0\": a cell that starts with '(' "
                       "must be PyTorch's overlapped pair such as \"(0F3;5B1)OVERLAP_F_B\""));
  EXPECT_THAT(ParsePytorchCsv("0F0,(0F1;0B0)OVERLAP\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be PyTorch's")));
  EXPECT_THAT(ParsePytorchCsv("0F0,(0F1;0SEND_F0)OVERLAP_F_B\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "line 1, column 10: \"0SEND_F0\" in \"(0F1;0SEND_F0)OVERLAP_F_B\": an "
                       "overlapped pair holds compute actions (F, B, I, W) only"));
  // One forward with one backward, as PyTorch writes them; nothing else.
  EXPECT_THAT(ParsePytorchCsv("0F0,(0F1;0B0;0B1)OVERLAP_F_B\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "line 1, column 5: \"(0F1;0B0;0B1)OVERLAP_F_B\" overlaps 0F1 with 0B0 with "
                       "0B1; an overlapped pair is one forward (F) with one backward (B, I or W), "
                       "such as \"(0F3;5B1)OVERLAP_F_B\": write the others as cells of their own"));
  EXPECT_THAT(
      ParsePytorchCsv("0F0,0F1,(0B0;0B1)OVERLAP_F_B\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("line 1, column 9: \"(0B0;0B1)OVERLAP_F_B\" overlaps 0B0 with 0B1; "
                         "an overlapped pair is one forward")));
  EXPECT_THAT(ParsePytorchCsv("0F0,(0F1;0F2)OVERLAP_F_B\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps 0F1 with 0F2;")));
  // A bad sub-action is pointed at in its own column.
  EXPECT_THAT(
      ParsePytorchCsv("0F0,(0F1; 0X0)OVERLAP_F_B\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("line 1, column 11: bad action \"0X0\""), HasSubstr("unknown op"))));
}

TEST(PytorchCsvTest, BadTokenNamesLineColumnAndToken) {
  EXPECT_THAT(
      ParsePytorchCsv("0F0,0B0\n1F0,1X0,1B0\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("line 2, column 5"), HasSubstr("1X0"), HasSubstr("unknown op"))));
  EXPECT_THAT(ParsePytorchCsv("F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("line 1, column 1"), HasSubstr("F0"))));
  EXPECT_THAT(ParsePytorchCsv("0F\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro-batch")));
}

// A token is quoted cut to 40 bytes with its control bytes escaped: a 10 MB token was
// echoed whole, and a lone \r (old Mac line ends) or a NUL went to the terminal raw.
TEST(PytorchCsvTest, BadTokensAreQuotedShortAndEscaped) {
  absl::Status s = ParsePytorchCsv(std::string(10'000'000, 'x') + "\n").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("bad action \"" + std::string(40, 'x') + "...\"")));
  EXPECT_LT(s.message().size(), 400u);
  EXPECT_THAT(ParsePytorchCsv("0F0,0B0\r1F0,1B0\r"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 1, column 5: bad action \"0B0\\r1F0\"")));
  s = ParsePytorchCsv(std::string("0F0,0B0\0\x01\n", 11)).status();
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad action \"0B0\\x00\\x01\"")));
  EXPECT_THAT(ParsePytorchCsv("0F0,0" + std::string(1000, 'Q') + "0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown op \"" + std::string(40, 'Q') + "...\"")));
}

TEST(PytorchCsvTest, EmptyInputIsAnError) {
  for (const char* text : {"", "\n", " \r\n\r\n"}) {
    EXPECT_THAT(ParsePytorchCsv(text),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("empty"), HasSubstr("one row of actions per rank"))))
        << "'" << text << "'";
  }
  const std::string path = TempFile("empty.csv", "");
  EXPECT_THAT(LoadScheduleFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path + ": "), HasSubstr("is empty"))));
}

TEST(PytorchCsvTest, BlankRankRowIsAnError) {
  EXPECT_THAT(ParsePytorchCsv("0F0,0B0\n,,\n2F0,2B0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("line 2"), HasSubstr("no actions"))));
}

TEST(PytorchCsvTest, StageCountNotAMultipleOfRanks) {
  EXPECT_THAT(ParsePytorchCsv("0F0,2F0,2B0,0B0\n1F0,1B0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("3 stages"), HasSubstr("2 ranks"), HasSubstr("multiple"))));
}

TEST(PytorchCsvTest, ExplicitPlacementWhereNeitherLoopNorVFits) {
  // Stage 1 on rank 0 and stage 0 on rank 1: the ranks swapped.
  PS_ASSERT_OK_AND_ASSIGN(Schedule swapped, ParsePytorchCsv("1F0,1B0\n0F0,0B0\n"));
  EXPECT_EQ(swapped.placement.kind, PlacementKind::kExplicit);
  EXPECT_EQ(swapped.placement.stage_ranks, (std::vector<int>{1, 0}));
  EXPECT_EQ(swapped.placement.Describe(), "explicit(1,0)");
  EXPECT_TRUE(Validate(swapped).ok());

  // Block placement: rank 0 holds stages 0 and 1, rank 1 stages 2 and 3. Each rank runs
  // GPipe over its two stages; only boundary 1 -> 2 crosses ranks.
  const std::string block = "0F0,0F1,1F0,1F1,1B0,1B1,0B0,0B1\n2F0,2F1,3F0,3F1,3B0,3B1,2B0,2B1\n";
  PS_ASSERT_OK_AND_ASSIGN(Schedule s, ParsePytorchCsv(block));
  EXPECT_EQ(s.num_ranks(), 2);
  EXPECT_EQ(s.num_chunks(), 2);
  EXPECT_EQ(s.placement.stage_ranks, (std::vector<int>{0, 0, 1, 1}));
  PS_ASSERT_OK(Validate(s));
  // F 1, B 2, a transfer 0.5 across ranks and none within one: rank 1's forwards start at
  // 3.5 (1F0 ends at 3), its backwards end at 15.5; rank 0's 1B0 starts at 13.5 + 0.5 = 14
  // and its four backwards end at 22. With every boundary charged it would be longer.
  CostModel costs;
  costs.comm_uniform = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(SimResult sim, Simulate(s, costs));
  EXPECT_DOUBLE_EQ(sim.makespan, 22);

  // Written back, the same placement is inferred again; the JSON lists it.
  EXPECT_EQ(ToPytorchCsv(s), block);
  PS_ASSERT_OK_AND_ASSIGN(Schedule again, ParsePytorchCsv(ToPytorchCsv(s)));
  EXPECT_EQ(again.placement, s.placement);
  const std::string text = ToScheduleJson(s);
  EXPECT_THAT(text, HasSubstr("\"placement\": [0, 0, 1, 1],"));
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile back, ParseScheduleJson(text));
  EXPECT_EQ(back.schedule.placement, s.placement);
  EXPECT_EQ(back.schedule.programs, s.programs);
}

TEST(PytorchCsvTest, PlacementThatCannotBeInferredNamesTheStage) {
  // Stages 0 and 1 on both ranks: the first found is named.
  EXPECT_THAT(
      ParsePytorchCsv("0F0,0F1,1B0\n1F0,1F1,0B0\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("cannot infer the placement of 2 stages on 2 ranks"),
                     HasSubstr("stage 1 has actions on two ranks, \"1B0\" (line 1, "
                               "column 9, rank 0) and \"1F0\" (line 2, column 1, rank 1)"))));
  // Rank 0 holds three stages of four, rank 1 one.
  EXPECT_THAT(ParsePytorchCsv("0F0,1F0,2F0,2B0,1B0,0B0\n3F0,3B0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0 (line 1) holds 3 stages (0, 1, 2) where every rank must "
                                 "hold 4 / 2 = 2")));
  // A stage number far past the others: the stages without actions are found before any
  // table is sized by the stage count (10^8 stages took 1.2 GB, 2 x 10^9 about 24 GB).
  EXPECT_THAT(ParsePytorchCsv("99999999F0\n0F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot infer the placement of 100000000 stages on 2 ranks: "
                                 "stage 1 has no actions")));
  // Stage 2 has no action anywhere, and neither loop nor v fits the others.
  EXPECT_THAT(ParsePytorchCsv("1F0,1B0\n0F0,0B0,3F0,3B0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 2 has no actions, so no rank is known to hold it")));
}

TEST(ScheduleJsonTest, ExplicitPlacementIsChecked) {
  auto file = [](const std::string& placement) {
    return "{\"format\": \"pipesched-schedule\", \"version\": 1, \"stages\": 2, \"virtual\": 2, "
           "\"microbatches\": 1, \"placement\": " +
           placement +
           ", \"programs\": [[\"0F0\", \"1F0\", \"1B0\", \"0B0\"], [\"2F0\", \"3F0\", "
           "\"3B0\", \"2B0\"]]}";
  };
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile ok, ParseScheduleJson(file("[0, 0, 1, 1]")));
  EXPECT_EQ(ok.schedule.placement.kind, PlacementKind::kExplicit);
  EXPECT_EQ(ok.schedule.placement.stage_ranks, (std::vector<int>{0, 0, 1, 1}));
  PS_EXPECT_OK(Validate(ok.schedule));
  // The programs must agree with it: Validate names the misplaced action.
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile moved, ParseScheduleJson(file("[1, 0, 0, 1]")));
  EXPECT_THAT(Validate(moved.schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("action 0F0 is on rank 0 but stage 0 is placed on rank 1 "
                                 "(explicit(1,0,0,1) placement, P=2, V=2)")));
  EXPECT_THAT(ParseScheduleJson(file("[0, 0, 0, 1]")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"placement\": explicit placement puts stage 2 on rank 0, which "
                                 "holds V = 2 stages already")));
  EXPECT_THAT(ParseScheduleJson(file("[0, 1]")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lists 2 stage ranks for P x V = 2 x 2 = 4 stages")));
  EXPECT_THAT(ParseScheduleJson(file("[0, 2, 1, 1]")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key \"placement[1]\" must be an integer rank in [0, 1], got 2")));
  EXPECT_THAT(
      ParseScheduleJson(file("[0, 0, 1.0, 1]")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("key \"placement[2]\" must be an integer rank in [0, 1], got 1.0")));
  // A list that loop or v placement gives is that placement (a closed form may apply).
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile loop, ParseScheduleJson(file("[0, 1, 0, 1]")));
  EXPECT_EQ(loop.schedule.placement,
            (Placement{.kind = PlacementKind::kLoop, .num_ranks = 2, .num_chunks = 2}));
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile v, ParseScheduleJson(file("[0, 1, 1, 0]")));
  EXPECT_EQ(v.schedule.placement,
            (Placement{.kind = PlacementKind::kV, .num_ranks = 2, .num_chunks = 2}));
  EXPECT_THAT(ParseScheduleJson(file("\"block\"")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"loop\", \"v\" or an array of each virtual stage's rank")));
}

TEST(ScheduleJsonTest, RoundTripsWithAndWithoutCosts) {
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile csv, LoadScheduleFile(Shared("interop/pytorch/2-rank.csv")));
  const Schedule& s = csv.schedule;
  const std::string text = ToScheduleJson(s);
  EXPECT_THAT(text, HasSubstr("\"format\": \"pipesched-schedule\""));
  EXPECT_THAT(text, HasSubstr("\"version\": 1"));
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile back, ParseScheduleJson(text));
  EXPECT_EQ(back.schedule.name, s.name);
  EXPECT_EQ(back.schedule.num_ranks(), 2);
  EXPECT_EQ(back.schedule.num_chunks(), 2);
  EXPECT_EQ(back.schedule.num_microbatches, 8);
  EXPECT_EQ(back.schedule.placement.kind, PlacementKind::kLoop);
  EXPECT_EQ(back.schedule.programs, s.programs);
  EXPECT_FALSE(back.costs.has_value());
  EXPECT_EQ(ToScheduleJson(back.schedule), text);

  CostModel costs;
  costs.uniform.f = 1.5;
  costs.uniform.activation_bytes = 1 << 20;
  costs.uniform.workspace_bytes = 1 << 17;
  costs.stages.resize(4);
  costs.stages[1].activation_bytes = 1 << 18;
  costs.stages[1].input_bytes = 1 << 16;
  costs.stages[2].static_bytes = std::int64_t{3} << 30;
  costs.stages[3].b = 7.25;
  costs.comm = {0.1, 0.2, 0.3};
  costs.action_gap = 0.125;
  Schedule v = s;
  v.placement.kind = PlacementKind::kV;
  v.name = "odd \"name\"";
  const std::string with_costs = ToScheduleJson(v, &costs);
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile back2, ParseScheduleJson(with_costs));
  EXPECT_EQ(back2.schedule.name, "odd \"name\"");
  EXPECT_EQ(back2.schedule.placement.kind, PlacementKind::kV);
  ASSERT_TRUE(back2.costs.has_value());
  EXPECT_EQ(back2.costs->uniform.f, 1.5);
  EXPECT_EQ(back2.costs->uniform.activation_bytes, 1 << 20);
  EXPECT_EQ(back2.costs->uniform.workspace_bytes, 1 << 17);
  EXPECT_EQ(back2.costs->uniform.input_bytes, 0);
  EXPECT_EQ(back2.costs->stages[1].input_bytes, 1 << 16);
  EXPECT_EQ(back2.costs->stages[3].input_bytes, 0);
  EXPECT_EQ(back2.costs->stages[2].static_bytes, std::int64_t{3} << 30);
  EXPECT_EQ(back2.costs->stages[1].static_bytes, 0);
  // Only files that use input_bytes carry it, so that older builds still read the rest.
  costs.stages[1].input_bytes = 0;
  EXPECT_THAT(ToScheduleJson(v, &costs), Not(HasSubstr("input_bytes")));
  EXPECT_THAT(ToScheduleJson(v, &costs), HasSubstr("\"static_bytes\": 3221225472"));
  CostModel without_static = costs;
  without_static.stages[2].static_bytes = 0;  // and for static_bytes
  EXPECT_THAT(ToScheduleJson(v, &without_static), Not(HasSubstr("static_bytes")));
  EXPECT_THAT(ToScheduleJson(v, &costs), Not(HasSubstr("recompute_bytes")));  // and that
  CostModel recomputing = costs;
  recomputing.stages[1].recompute_bytes = 4096;
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile back3, ParseScheduleJson(ToScheduleJson(v, &recomputing)));
  EXPECT_EQ(back3.costs->stages[1].recompute_bytes, 4096);
  EXPECT_EQ(back3.costs->stages[0].recompute_bytes, 0);
  EXPECT_EQ(back2.costs->action_gap, 0.125);
  costs.action_gap = 0;  // the same for action_gap
  EXPECT_THAT(ToScheduleJson(v, &costs), Not(HasSubstr("action_gap")));
  ASSERT_EQ(back2.costs->stages.size(), 4u);
  EXPECT_EQ(back2.costs->stages[3].b, 7.25);
  EXPECT_EQ(back2.costs->comm, (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_EQ(ToScheduleJson(back2.schedule, &*back2.costs), with_costs);
  // The same costs as a cost-model file of their own.
  costs.action_gap = 0.375;
  PS_ASSERT_OK_AND_ASSIGN(CostModel file, ParseCostModelJson(ToCostModelJson(costs)));
  EXPECT_EQ(file.uniform.f, 1.5);
  EXPECT_EQ(file.uniform.workspace_bytes, 1 << 17);
  ASSERT_EQ(file.stages.size(), 4u);
  EXPECT_EQ(file.stages[3].b, 7.25);
  EXPECT_EQ(file.comm, (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_EQ(file.action_gap, 0.375);
  EXPECT_EQ(ToCostModelJson(file), ToCostModelJson(costs));
  // The time unit, only when it is not the abstract unit (builds predating it read the
  // rest), and back.
  EXPECT_THAT(ToCostModelJson(costs), Not(HasSubstr("time_unit")));
  CostModel measured = costs;
  measured.time_unit = "us";
  EXPECT_THAT(ToCostModelJson(measured), HasSubstr("\"time_unit\": \"us\""));
  PS_ASSERT_OK_AND_ASSIGN(CostModel measured_back, ParseCostModelJson(ToCostModelJson(measured)));
  EXPECT_EQ(measured_back.time_unit, "us");
  // The per-step zero_grad and optimizer times, likewise only in files that use them.
  EXPECT_THAT(ToCostModelJson(costs), Not(HasSubstr("optimizer")));
  costs.stages[2].optimizer = 2.5;
  costs.uniform.zero_grad = 0.25;
  PS_ASSERT_OK_AND_ASSIGN(CostModel step, ParseCostModelJson(ToCostModelJson(costs)));
  EXPECT_EQ(step.stages[2].optimizer, 2.5);
  EXPECT_EQ(step.stages[1].optimizer, 0);
  EXPECT_EQ(step.uniform.zero_grad, 0.25);
  EXPECT_EQ(step.stages[0].zero_grad, 0);  // written per stage, not taken from the default
  EXPECT_EQ(ToCostModelJson(step), ToCostModelJson(costs));
}

// Recomputation is per entry: an entry's own recompute_bytes decides over the default's,
// and a stage that recomputes with nothing to rebuild keeps saying so through a file.
TEST(ScheduleJsonTest, RecomputationRoundTripsPerStage) {
  PS_ASSERT_OK_AND_ASSIGN(
      const CostModel old,
      ParseCostModelJson(R"({"default": {"activation_bytes": 100, "recompute_bytes": 4000},
                             "stages": [{}, {"recompute_bytes": 0}]})"));
  EXPECT_TRUE(old.stages[0].recomputes());
  EXPECT_FALSE(old.stages[1].recomputes());
  PS_ASSERT_OK_AND_ASSIGN(
      const CostModel flagged,
      ParseCostModelJson(
          R"({"default": {"recompute": true}, "stages": [{"f": 2}, {"recompute": false}]})"));
  EXPECT_TRUE(flagged.stages[0].recomputes());
  EXPECT_FALSE(flagged.stages[1].recomputes());
  CostModel mixed;
  mixed.uniform.recompute_bytes = 4000;
  mixed.stages.resize(3, mixed.uniform);
  mixed.stages[1].recompute_bytes = 0;  // does not recompute
  mixed.stages[2].recompute_bytes = 0;
  mixed.stages[2].recompute = true;  // recomputes, with nothing to rebuild
  for (const CostModel* costs : std::vector<const CostModel*>{&old, &flagged, &mixed}) {
    PS_ASSERT_OK_AND_ASSIGN(const CostModel back, ParseCostModelJson(ToCostModelJson(*costs)));
    ASSERT_EQ(back.stages.size(), costs->stages.size());
    EXPECT_EQ(back.uniform.recomputes(), costs->uniform.recomputes());
    for (std::size_t s = 0; s < costs->stages.size(); ++s) {
      EXPECT_EQ(back.stages[s].recomputes(), costs->stages[s].recomputes()) << s;
    }
  }
  // The key is written only where bytes cannot say it, so older files keep their form.
  EXPECT_THAT(ToCostModelJson(old), Not(HasSubstr("\"recompute\"")));
  EXPECT_THAT(ToCostModelJson(mixed), HasSubstr("\"recompute\": true"));
  EXPECT_THAT(ToCostModelJson(mixed), HasSubstr("\"recompute\": false"));
}

TEST(ScheduleJsonTest, LoadDetectsJsonAndNamesFromTheFileWhenUnnamed) {
  const std::string path =
      TempFile("tiny.json",
               "  {\"format\": \"pipesched-schedule\", \"version\": 1, \"stages\": 1, "
               "\"microbatches\": 1, \"programs\": [[\"0F0\", \"0B0\"]]}");
  PS_ASSERT_OK_AND_ASSIGN(ScheduleFile file, LoadScheduleFile(path));
  EXPECT_EQ(file.schedule.name, "formats_test_tiny");
  EXPECT_EQ(file.schedule.num_chunks(), 1);
  EXPECT_EQ(file.schedule.placement.kind, PlacementKind::kLoop);
  PS_EXPECT_OK(Validate(file.schedule));
}

struct BadJson {
  std::string text;
  std::string message;
};

class ScheduleJsonBadInputTest : public ::testing::TestWithParam<BadJson> {};

TEST_P(ScheduleJsonBadInputTest, InvalidArgumentNamingTheProblem) {
  EXPECT_THAT(ParseScheduleJson(GetParam().text),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

#define PS_HEAD "\"format\": \"pipesched-schedule\", \"version\": 1"
INSTANTIATE_TEST_SUITE_P(
    Cases, ScheduleJsonBadInputTest,
    ::testing::Values(
        BadJson{"{\"format\": ", "malformed"}, BadJson{"{" PS_HEAD ", \"stages\": 1,}", "line 1"},
        BadJson{"[1, 2]", "an object"},
        BadJson{"{" PS_HEAD ", \"stages\": 2, \"stages\": 4}",
                "key \"stages\" is given twice in one object; give each key once"},
        BadJson{"{\"version\": 1, \"stages\": 1}", "\"format\" must be \"pipesched-schedule\""},
        BadJson{"{\"format\": \"pipesched-schedule\", \"version\": 2}",
                "unsupported \"version\" 2; this build reads version 1"},
        BadJson{"{\"format\": \"pipesched-schedule\"}", "unsupported \"version\" (missing)"},
        BadJson{"{" PS_HEAD ", \"stagse\": 1}", "unknown key \"stagse\""},
        BadJson{"{" PS_HEAD ", \"microbatches\": 1, \"programs\": [[]]}", "missing key \"stages\""},
        BadJson{"{" PS_HEAD ", \"stages\": 0, \"microbatches\": 1}",
                "\"stages\" must be an integer in [1, 16777216], got 0"},
        BadJson{"{" PS_HEAD ", \"stages\": 1.5, \"microbatches\": 1}", "got 1.5"},
        BadJson{"{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1, \"placement\": \"zigzag\"}",
                "\"placement\" must be \"loop\", \"v\" or an array of each virtual stage's rank, "
                "like [0, 1, 1, 0], got \"zigzag\""},
        BadJson{"{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1}", "missing key \"programs\""},
        BadJson{"{" PS_HEAD ", \"stages\": 2, \"microbatches\": 1, \"programs\": [[\"0F0\"]]}",
                "has 1 rows but \"stages\" is 2"},
        BadJson{"{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1, \"programs\": [[\"0F0\", 7]]}",
                "\"programs[0][1]\" must be an action string"},
        BadJson{"{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1, \"programs\": [[\"0Q0\"]]}",
                "key \"programs[0][0]\": bad action \"0Q0\""},
        BadJson{"{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1, \"programs\": [\"0F0\"]}",
                "\"programs[0]\" must be an array"},
        BadJson{"{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1, \"programs\": [[\"0F0\"]], "
                "\"costs\": {\"default\": {\"f\": -1}}}",
                "key \"costs\""},
        BadJson{"{" PS_HEAD ", \"name\": 3, \"stages\": 1}", "\"name\" must be a string"}));

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Deep values crashed the error path (a recursive dump() of "version", "format" or
// "stages" into the message); now the parse stops at 64 levels.
TEST(ScheduleJsonTest, DeepNestingIsRefusedBeforeItIsQuoted) {
  for (int depth : {100000, 10000, 65}) {
    for (const std::string& json :
         {"{\"format\": \"pipesched-schedule\", \"version\": " + Nested(depth) + "}",
          "{\"format\": " + Nested(depth) + "}",
          "{" PS_HEAD ", \"microbatches\": 1, \"stages\": " + Nested(depth) + "}",
          "{" PS_HEAD ", \"costs\": {\"comm\": " + Nested(depth) + "}}"}) {
      EXPECT_THAT(ParseScheduleJson(json),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("schedule JSON is malformed: nested deeper than 64 levels")))
          << depth;
    }
  }
  const absl::Status s =
      ParseScheduleJson("{" PS_HEAD ", \"microbatches\": 1, \"stages\": " + Nested(60) + "}")
          .status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("\"stages\" must be an integer in [1, 16777216], got [[[[")));
  EXPECT_LT(s.message().size(), 200u);
}

// The limits are in the message: "must be a positive integer" never said 2^24.
TEST(ScheduleJsonTest, CountsAndNamesStateTheirLimits) {
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"stages\": 1099511627776}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key \"stages\" must be an integer in [1, 16777216], got "
                                 "1099511627776")));
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"stages\": 1, \"microbatches\": 16777217}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"microbatches\" must be an integer in [1, 16777216]")));
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"name\": \"" + std::string(100000, 'n') + "\"}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"name\" must be a string of at most 255 bytes without "
                                 "control characters, got \"nnnn")));
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"name\": \"a\\rb\"}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got \"a\\rb\"")));
  // C1 controls (U+0085, U+009B: a terminal's CSI) too.
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"name\": \"a\\u009b31mb\"}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"name\" must be a string of at most 255 bytes without "
                                 "control characters")));
  // Each count within its bound, their product not: 256 x 2^24 = 2^32 virtual stages
  // overflowed Schedule::num_stages() for whoever used the schedule next.
  std::string rows = "[]";
  for (int r = 1; r < 256; ++r) rows += ", []";
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"stages\": 256, \"virtual\": 16777216, "
                                "\"microbatches\": 1, \"programs\": [" +
                                rows + "]}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("schedule JSON: \"stages\" x \"virtual\" = 256 x 16777216 = "
                                 "4294967296 virtual stages, more than the 16777216 a file may "
                                 "give; give fewer ranks or chunks per rank")));
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"stages\": 2, \"virtual\": 8388609}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("= 2 x 8388609 = 16777218 virtual stages")));
  // At the bound the shape is read (and the missing programs are what is wrong).
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"stages\": 2, \"virtual\": 8388608, "
                                "\"microbatches\": 1}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing key \"programs\"")));
  // A "costs" object is held to the cost files' bounds.
  EXPECT_THAT(ParseScheduleJson("{" PS_HEAD ", \"stages\": 1, \"microbatches\": 1, "
                                "\"programs\": [[\"0F0\", \"0B0\"]], \"costs\": "
                                "{\"default\": {\"b\": 1e308}}}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key \"costs\": cost model: \"default.b\" must be a number in "
                                 "[0, 1e+15]")));
}

TEST(LoadScheduleFileTest, MissingFileNamesThePath) {
  absl::StatusOr<ScheduleFile> file = LoadScheduleFile("/nonexistent/dir/s.csv");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("/nonexistent/dir/s.csv"));
}

TEST(LoadScheduleFileTest, EmptyJsonAndJsonArraysAreNamedForWhatTheyAre) {
  const std::string empty = ::testing::TempDir() + "/empty.json";
  std::ofstream(empty) << "\n";
  EXPECT_THAT(LoadScheduleFile(empty),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       empty + ": the file is empty; a pipesched JSON schedule is an object "
                               "{\"format\": \"pipesched-schedule\", \"version\": 1, ...} "
                               "(docs/schedules.md)"));
  const std::string array = ::testing::TempDir() + "/array.json";
  std::ofstream(array) << "[[\"0F0\", \"0B0\"]]\n";
  EXPECT_THAT(LoadScheduleFile(array),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(": the file starts with '[', but a pipesched JSON schedule is an "
                                 "object")));
  // An empty file of another name is still an empty CSV.
  const std::string csv = ::testing::TempDir() + "/empty.csv";
  std::ofstream(csv) << "";
  EXPECT_THAT(LoadScheduleFile(csv),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the CSV schedule is empty")));
}

TEST(LoadScheduleFileTest, CsvErrorsStartWithThePath) {
  const std::string path = TempFile("bad.csv", "0F0,0B0\n1F0,1ZZ0\n");
  EXPECT_THAT(
      LoadScheduleFile(path),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(::testing::StartsWith(path + ": line 2, column 5"), HasSubstr("1ZZ0"))));
}

}  // namespace
}  // namespace pipesched::scheduler
