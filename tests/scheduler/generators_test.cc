// Golden tests: each generator's program for a small case, written as the same picture
// that its source file carries in a comment, plus the properties users rely on (peak
// live activations, placement) and the error sentences for bad parameters.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/schedule.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// "\n" + the grid, so that the expected pictures below can start on their own line.
std::string Picture(std::string_view name, int p, int m, int v = 0) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule(name, {p, m, v});
  if (!schedule.ok()) return std::string(schedule.status().message());
  return "\n" + RenderProgramGrid(*schedule);
}

TEST(GeneratorGoldenTest, GPipeP4M8) {
  EXPECT_EQ(Picture("gpipe", 4, 8), R"(
rank 0 | 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0B0 0B1 0B2 0B3 0B4 0B5 0B6 0B7
rank 1 | 1F0 1F1 1F2 1F3 1F4 1F5 1F6 1F7 1B0 1B1 1B2 1B3 1B4 1B5 1B6 1B7
rank 2 | 2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 2B0 2B1 2B2 2B3 2B4 2B5 2B6 2B7
rank 3 | 3F0 3F1 3F2 3F3 3F4 3F5 3F6 3F7 3B0 3B1 3B2 3B3 3B4 3B5 3B6 3B7
)");
}

TEST(GeneratorGoldenTest, OneFOneBP4M8) {
  EXPECT_EQ(Picture("1f1b", 4, 8), R"(
rank 0 | 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7
rank 1 | 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7
rank 2 | 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7
rank 3 | 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7
)");
}

TEST(GeneratorGoldenTest, Interleaved1F1BP2V2M4) {
  EXPECT_EQ(Picture("interleaved-1f1b", 2, 4, 2), R"(
rank 0 | 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
rank 1 | 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
)");
}

TEST(GeneratorGoldenTest, InterleavedZbP2V2M4) {
  // interleaved_zb.cc draws the same program in two halves of 12 actions.
  EXPECT_EQ(Picture("interleaved-zb", 2, 4, 2), R"(
rank 0 | 0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3
rank 1 | 1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3
)");
}

TEST(GeneratorGoldenTest, LoopedBfsP2V2M4) {
  EXPECT_EQ(Picture("looped-bfs", 2, 4, 2), R"(
rank 0 | 0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0 0B3 0B2 0B1 0B0
rank 1 | 1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 3B3 3B2 3B1 3B0 1B3 1B2 1B1 1B0
)");
}

TEST(GeneratorGoldenTest, ZbH1P4M6) {
  EXPECT_EQ(Picture("zb-h1", 4, 6), R"(
rank 0 | 0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5
rank 1 | 1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1I4 1W3 1I5 1W4 1W5
rank 2 | 2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2I5 2W3 2W4 2W5
rank 3 | 3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3W3 3W4 3W5
)");
}

TEST(GeneratorGoldenTest, ZbVP2M3) {
  EXPECT_EQ(Picture("zb-v", 2, 3), R"(
rank 0 | 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2
rank 1 | 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2
)");
}

TEST(GeneratorGoldenTest, DualPipeVP2M4) {
  // Rank 0 (tail P-1-r = 1): 0F0 0F1 | 0F2 3F0 | 3I0 3W0 3F1 | 0F3 3B1 3F2 0B0 | 3B2 3F3 0B1 |
  // 3B3 0I2 | 0W2 0I3 | 0W3. Rank 1 has no tail: two pairs, two rounds of four, then
  // 2B2 1B2 (full) and 2I3 1I3 (split, rank 1 odd), then the W's oldest first.
  EXPECT_EQ(Picture("dualpipe-v", 2, 4), R"(
rank 0 | 0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3
rank 1 | 1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3
)");
}

TEST(GeneratorGoldenTest, DualPipeVSplitsTheLaterHalfOfItsLastBackwards) {
  // After its last forward, rank r of P=4, M=8 finishes phase 5 (P-1-r rounds ending in a
  // chunk-0 B), then phase 6's r+1 rounds: rank 2 (even) splits from round 1's chunk-0
  // backward, rank 3 (odd) from round 2's chunk-1 one; phase 7 alternates the oldest W
  // with a split chunk-0 backward, phase 8 issues the W's left. Rank r splits 2P-1-r
  // backwards in all (phases 3, 6 and 7), so it issues as many W's.
  absl::StatusOr<Schedule> schedule = GenerateSchedule("dualpipe-v", {4, 8, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto after_last_forward = [&](int r) {
    const auto& program = schedule->programs[r];
    std::size_t last_f = 0;
    for (std::size_t k = 0; k < program.size(); ++k) {
      if (program[k].op == Op::kF) last_f = k;
    }
    std::string ops;
    for (std::size_t k = last_f + 1; k < program.size(); ++k) ops += ToString(program[k]) + " ";
    return ops;
  };
  EXPECT_EQ(after_last_forward(2), "2B3 5B5 2B4 5B6 2I5 5I7 2I6 2W5 2I7 5W7 2W6 2W7 ");
  EXPECT_EQ(after_last_forward(3), "3B3 4B4 3B4 4B5 3B5 4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7 ");
  for (int r = 0; r < 4; ++r) {
    int ws = 0;
    for (const Action& action : schedule->programs[r]) ws += action.op == Op::kW;
    EXPECT_EQ(ws, 2 * 4 - 1 - r) << "rank " << r;
  }
}

TEST(GeneratorGoldenTest, DefaultChunksAreTheRegisteredOnes) {
  for (const ScheduleInfo& info : AllSchedules()) {
    absl::StatusOr<Schedule> schedule = GenerateSchedule(info.name, {4, 8, 0});
    ASSERT_TRUE(schedule.ok()) << info.name << ": " << schedule.status();
    EXPECT_EQ(schedule->num_chunks(), info.default_chunks) << info.name;
    EXPECT_EQ(schedule->name, info.name);
    EXPECT_EQ(schedule->num_ranks(), 4);
    EXPECT_EQ(schedule->num_microbatches, 8);
    EXPECT_EQ(schedule->SplitsBackward(),
              info.name == "zb-h1" || info.name == "zb-v" || info.name == "interleaved-zb" ||
                  info.name == "zb-1p" || info.name == "zb-2p" || info.name == "zb-v-1p" ||
                  info.name == "zb-v-half" || info.name == "zb-v-min" ||
                  info.name == "interleaved-zb-1p" || info.name == "dualpipe-v")
        << info.name;
  }
}

TEST(GeneratorGoldenTest, PlacementKinds) {
  absl::StatusOr<Schedule> zbv = GenerateSchedule("zb-v", {4, 8, 0});
  ASSERT_TRUE(zbv.ok()) << zbv.status();
  EXPECT_EQ(zbv->placement.KindName(), "v");
  absl::StatusOr<Schedule> interleaved = GenerateSchedule("interleaved-1f1b", {4, 8, 0});
  ASSERT_TRUE(interleaved.ok()) << interleaved.status();
  EXPECT_EQ(interleaved->placement.KindName(), "loop");
  EXPECT_EQ(interleaved->NumActions(), 2u * 4 * 2 * 8);
  EXPECT_EQ(zbv->NumActions(), 3u * 4 * 2 * 8);
}

// Peak number of micro-batches whose forward ran and whose backward (B or I) has not,
// per rank, counting in program order.
std::vector<int> PeakLiveActivations(const Schedule& schedule) {
  std::vector<int> peaks;
  for (const auto& program : schedule.programs) {
    int live = 0;
    int peak = 0;
    for (const Action& action : program) {
      if (action.op == Op::kF) peak = std::max(peak, ++live);
      if (action.op == Op::kB || action.op == Op::kI) --live;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

TEST(GeneratorMemoryTest, OneFOneBHoldsMinOfPMinusRAndM) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (std::string_view name : {"1f1b", "zb-h1"}) {
        absl::StatusOr<Schedule> schedule = GenerateSchedule(name, {p, m, 0});
        ASSERT_TRUE(schedule.ok()) << schedule.status();
        const std::vector<int> peaks = PeakLiveActivations(*schedule);
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(peaks[r], std::min(p - r, m)) << name << " P=" << p << " M=" << m << " r=" << r;
        }
      }
    }
  }
}

TEST(GeneratorMemoryTest, GPipeHoldsAllMicrobatches) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule("gpipe", {4, 8, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_THAT(PeakLiveActivations(*schedule), ::testing::ElementsAre(8, 8, 8, 8));
}

TEST(GeneratorMemoryTest, ZbVHoldsAtMostOneFOneBsPeak) {
  // ZB-V's point: no bubble at 1F1B's memory. Each rank holds two half-size chunks, so
  // 2P live chunk activations match 1F1B's P full-stage ones on rank 0.
  for (int p = 1; p <= 8; ++p) {
    for (int m : {1, 2 * p, 4 * p}) {
      absl::StatusOr<Schedule> schedule = GenerateSchedule("zb-v", {p, m, 0});
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      for (int peak : PeakLiveActivations(*schedule)) {
        EXPECT_LE(peak, std::min(2 * p, 2 * m)) << "P=" << p << " M=" << m;
      }
    }
  }
}

TEST(GeneratorMemoryTest, DualPipeVHoldsOneChunkMoreThanZbV) {
  // DeepSeek's DualPipeV holds 2P+1 chunk activations on every rank (zb-v at most 2P).
  for (int p = 1; p <= 8; ++p) {
    for (int m : {2 * p, 2 * p + 3, 5 * p}) {
      absl::StatusOr<Schedule> schedule = GenerateSchedule("dualpipe-v", {p, m, 0});
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      EXPECT_THAT(PeakLiveActivations(*schedule), ::testing::Each(2 * p + 1))
          << "P=" << p << " M=" << m;
    }
  }
}

TEST(PlacementTest, LoopAndV) {
  Placement loop{PlacementKind::kLoop, 4, 2};
  Placement v{PlacementKind::kV, 4, 2};
  std::vector<int> loop_ranks;
  std::vector<int> v_ranks;
  for (int s = 0; s < 8; ++s) {
    loop_ranks.push_back(loop.RankOf(s));
    v_ranks.push_back(v.RankOf(s));
  }
  EXPECT_THAT(loop_ranks, ::testing::ElementsAre(0, 1, 2, 3, 0, 1, 2, 3));
  EXPECT_THAT(v_ranks, ::testing::ElementsAre(0, 1, 2, 3, 3, 2, 1, 0));
  Placement v3{PlacementKind::kV, 2, 3};
  EXPECT_EQ(v3.RankOf(4), 0);  // chunk 2 goes down again
  EXPECT_EQ(v3.RankOf(5), 1);
  EXPECT_EQ(loop.RankOf(8), -1);
  EXPECT_EQ(loop.RankOf(-1), -1);
  EXPECT_EQ(loop.KindName(), "loop");
  EXPECT_EQ(v.KindName(), "v");
}

TEST(RenderProgramGridTest, MarksACellWithAnArrow) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule("1f1b", {2, 2, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ("\n" + RenderProgramGrid(*schedule, 1, 2), R"(
rank 0 |  0F0  0F1  0B0  0B1
rank 1 |  1F0  1B0 [1F1] 1B1
       |            ^^^ rank 1, step 2
)");
}

TEST(RenderProgramGridTest, CutsWideGridsAroundTheMark) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule("gpipe", {2, 20, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const std::string grid = RenderProgramGrid(*schedule, 0, 20);
  EXPECT_THAT(grid, HasSubstr("rank 0 | ...  0F10  0F11"));
  EXPECT_THAT(grid, HasSubstr("[0B0]"));
  EXPECT_THAT(grid, HasSubstr("0B10 ...\n"));
  EXPECT_THAT(grid, HasSubstr("^^^ rank 0, step 20"));
  EXPECT_THAT(grid, ::testing::Not(HasSubstr("0F9 ")));
  // Unmarked grids are never cut.
  EXPECT_THAT(RenderProgramGrid(*schedule), ::testing::Not(HasSubstr("...")));
}

TEST(RenderProgramGridTest, MarkPastTheEndOfAProgram) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule("gpipe", {1, 1, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ("\n" + RenderProgramGrid(*schedule, 0, 2), R"(
rank 0 |  0F0  0B0
       |            ^ rank 0, step 2 (after the last action)
)");
  // Far past it: the same picture (the arrow line was sized by the step: gigabytes).
  EXPECT_EQ(RenderProgramGrid(*schedule, 0, std::numeric_limits<int>::max()),
            RenderProgramGrid(*schedule, 0, 2));
}

TEST(RegistryTest, UnknownScheduleListsTheKnownOnes) {
  EXPECT_THAT(GenerateSchedule("2f2b", {4, 8, 0}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("\"2f2b\""), HasSubstr("gpipe"), HasSubstr("1f1b"),
                             HasSubstr("interleaved-1f1b"), HasSubstr("zb-v"))));
  EXPECT_EQ(FindSchedule("nope"), nullptr);
  ASSERT_NE(FindSchedule("zb-h1"), nullptr);
  EXPECT_EQ(FindSchedule("zb-h1")->name, "zb-h1");
}

TEST(RegistryTest, EveryEntryIsDescribed) {
  ASSERT_EQ(AllSchedules().size(), 14u);
  for (const ScheduleInfo& info : AllSchedules()) {
    EXPECT_FALSE(info.summary.empty()) << info.name;
    EXPECT_FALSE(info.constraints.empty()) << info.name;
    EXPECT_NE(info.generate, nullptr) << info.name;
  }
}

struct BadCase {
  const char* schedule;
  GeneratorParams params;
  const char* message;
};

TEST(GeneratorErrorTest, BadParametersGetASentence) {
  const BadCase cases[] = {
      {"gpipe",
       {0, 8, 0},
       "gpipe needs at least one pipeline rank (got P=0); use --stages=1 or more"},
      {"1f1b",
       {4, 0, 0},
       "1f1b needs at least one micro-batch (got M=0); use --microbatches=1 or more"},
      {"zb-h1", {4, 8, -1}, "zb-h1 needs a non-negative number of chunks per rank (got V=-1)"},
      {"gpipe", {4, 8, 2}, "gpipe runs exactly 1 chunk per rank (got V=2); use --virtual=1"},
      {"1f1b", {4, 8, 4}, "1f1b runs exactly 1 chunk per rank (got V=4); use --virtual=1"},
      {"zb-h1", {4, 8, 2}, "zb-h1 runs exactly 1 chunk per rank (got V=2); use --virtual=1"},
      {"zb-v", {4, 8, 1}, "zb-v runs exactly 2 chunks per rank (got V=1); use --virtual=2"},
      {"zb-v", {4, 8, 4}, "zb-v runs exactly 2 chunks per rank (got V=4); use --virtual=2"},
      {"dualpipe-v",
       {4, 8, 3},
       "dualpipe-v runs exactly 2 chunks per rank (got V=3); use --virtual=2"},
      {"dualpipe-v",
       {4, 7, 0},
       "dualpipe-v needs M >= 2P = 8 micro-batches (got M=7, P=4); use --microbatches=8 or more, "
       "or zb-v, which takes any M"},
      {"interleaved-1f1b",
       {4, 8, 1},
       "interleaved-1f1b needs V >= 2 chunks per rank (got V=1); use --virtual=2 or more"},
      {"interleaved-1f1b",
       {4, 9, 2},
       "interleaved-1f1b needs M to be a multiple of its number of rounds max(1, M / P) = 2 "
       "(got M=9, P=4); use --microbatches=8 or --microbatches=10"},
      {"interleaved-1f1b",
       {4, 13, 2},
       "max(1, M / P) = 3 (got M=13, P=4); use --microbatches=12 or --microbatches=15"},
      {"interleaved-zb",
       {4, 8, 1},
       "interleaved-zb needs V >= 2 chunks per rank (got V=1); use --virtual=2 or more, or zb-h1 "
       "for one chunk"},
      {"interleaved-zb",
       {4, 9, 2},
       "interleaved-zb needs M to be a multiple of its number of rounds max(1, M / P) = 2 "
       "(got M=9, P=4); use --microbatches=8 or --microbatches=10"},
      {"looped-bfs", {-3, 8, 2}, "looped-bfs needs at least one pipeline rank (got P=-3)"},
      {"gpipe", {100000, 8, 0}, "gpipe supports at most 65536 ranks (got P=100000)"},
      {"1f1b", {4096, 1 << 20, 0}, "the limit is 16777216"},
  };
  for (const BadCase& c : cases) {
    EXPECT_THAT(GenerateSchedule(c.schedule, c.params),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.schedule << " P=" << c.params.num_ranks << " M=" << c.params.num_microbatches
        << " V=" << c.params.num_chunks;
  }
}

TEST(GeneratorErrorTest, InterleavedAcceptsMNotAMultipleOfPWhenRoundsSplitEvenly) {
  // PyTorch's rule: M splits into max(1, M / P) equal rounds.
  for (int m : {1, 2, 3, 5, 6, 7, 10, 12, 15}) {
    EXPECT_TRUE(GenerateSchedule("interleaved-1f1b", {4, m, 2}).ok()) << "M=" << m;
  }
  for (int m : {9, 11, 13, 14}) {
    EXPECT_FALSE(GenerateSchedule("interleaved-1f1b", {4, m, 2}).ok()) << "M=" << m;
  }
}

}  // namespace
}  // namespace pipesched::scheduler
