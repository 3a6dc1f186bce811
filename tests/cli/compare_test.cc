// `pipesched compare` in-process: the ranking at equal work, the memory column against
// --device-memory, per-stage cost files, the outputs, and one-line errors.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/cli_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipesched::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCli;
using testing::RunResult;
using testing::Slurp;
using testing::WithFlags;

std::string TempPath(const std::string& name) {
  return testing::TempPath("pipesched_compare_", name);
}

// The schedule names of the table's rows, top to bottom.
std::vector<std::string> Ranking(const std::string& out) {
  std::vector<std::string> names;
  std::istringstream lines(out);
  std::string line;
  bool table = false;
  while (std::getline(lines, line)) {
    if (line.rfind("schedule ", 0) == 0) {
      table = true;
    } else if (table && !line.empty() && line.rfind("skipped", 0) != 0 &&
               line.rfind("peak act", 0) != 0) {
      names.push_back(line.substr(0, line.find(' ')));
    } else {
      table = false;
    }
  }
  return names;
}

TEST(CompareTest, RanksEveryScheduleByStepAtEqualWork) {
  RunResult r = RunCli({"compare", "--stages=4", "--microbatches=8"});
  ASSERT_EQ(r.code, 0) << r.err;
  // Unit costs per stage: the zero-bubble pair idles (P-1)(F+I-W)/V, ZB-H1 V times that
  // (the searched zb-1p and zb-2p find nothing shorter: zb-h1's order, after it in the
  // registry's order; zb-v-1p and interleaved-zb-1p likewise keep zb-v's and interleaved-zb's),
  // interleaved 1F1B (P-1)(F+B)/V; gpipe and 1f1b
  // tie, 1f1b first for its memory. zb-v-half and zb-v-min trade time for memory: 3 and 2
  // stages' activations against 1F1B's 4, both still shorter than 1F1B. dualpipe-v ties with
  // zb-v at 4.5 stages' worth, so it comes after the four that hold 4.
  EXPECT_THAT(Ranking(r.out), ::testing::ElementsAre(
                                  "interleaved-zb", "zb-v", "zb-v-1p", "interleaved-zb-1p",
                                  "dualpipe-v", "zb-h1", "zb-1p", "zb-2p", "zb-v-half",
                                  "interleaved-1f1b", "looped-bfs", "zb-v-min", "1f1b", "gpipe"));
  EXPECT_THAT(r.out, HasSubstr("zb-v-half          2          28          28    1.098   14.29%   "
                               "     -        3.0\n"));
  EXPECT_THAT(r.out, HasSubstr("zb-v-min           2        29.5        29.5    1.157   18.64%   "
                               "     -        2.0\n"));
  EXPECT_THAT(r.out, HasSubstr("interleaved-zb     2        25.5        25.5    1.000    5.88%    "
                               "5.88%        4.0\n"));
  EXPECT_THAT(r.out, HasSubstr("interleaved-1f1b   2        28.5        28.5    1.118   15.79%   "
                               "15.79%        5.5\n"));
  EXPECT_THAT(r.out, HasSubstr("gpipe              1          33          33    1.294   27.27%   "
                               "27.27%        8.0\n"));
  EXPECT_THAT(r.out, HasSubstr("dualpipe-v         2        25.5        25.5    1.000    5.88%   "
                               "     -        4.5\n"));
  EXPECT_THAT(r.out,
              HasSubstr("fastest: interleaved-zb (V=2), tied with zb-v (V=2), zb-v-1p (V=2), "
                        "interleaved-zb-1p (V=2), dualpipe-v (V=2)\n"));
}

TEST(CompareTest, EqualStepsTieAndRankByMemory) {
  // V=3: interleaved 1F1B and looped BFS both take 27, their chunk sums rounding apart in
  // the 15th digit; the tie is reported and the lighter schedule comes first.
  RunResult r = RunCli({"compare", "--stages=4", "--microbatches=8", "--virtual=3",
                        "--schedules=looped-bfs,interleaved-1f1b"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Ranking(r.out), ::testing::ElementsAre("interleaved-1f1b", "looped-bfs"));
  EXPECT_THAT(r.out, HasSubstr("fastest: interleaved-1f1b (V=3), tied with looped-bfs (V=3)\n"));
}

TEST(CompareTest, BAloneSplitsEvenlyIntoIAndW) {
  // --cost-b=4 without I and W: I = W = 2, so 1F1B's (M+P-1)(F+B) = 55 and ZB-H1's
  // M(F+I+W) + (P-1) max(F, I) = 46 (W > F: no closed form) run the same work.
  RunResult r =
      RunCli({"compare", "--stages=4", "--microbatches=8", "--cost-b=4", "--schedules=1f1b,zb-h1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("costs per pipeline stage: F 1, B 4 (I 2, W 2), transfer 0;"));
  EXPECT_THAT(r.out, HasSubstr("zb-h1              1          46"));
  EXPECT_THAT(r.out, HasSubstr("1f1b               1          55"));
  RunResult uneven = RunCli({"compare", "--stages=4", "--microbatches=8", "--cost-b=4",
                             "--cost-i=1", "--schedules=1f1b,zb-h1"});
  EXPECT_EQ(uneven.code, 2);
  EXPECT_EQ(uneven.err,
            "pipesched: cost model: B=4 is not I + W = 2 (I=1, W=1): schedules that split the "
            "backward would do other work than those that do not; give I and W that add up to "
            "B\n");
}

// A costs file whose I and W do not add up to B: refused when a compared schedule splits
// the backward, and beside the point (not read) when none does.
TEST(CompareTest, ACostFilesSplitMattersOnlyToSchedulesThatSplit) {
  const std::string path = ::testing::TempDir() + "/compare_b3.json";
  {
    std::ofstream out(path);
    out << R"({"version": 1, "default": {"f": 1, "b": 3}})";
  }
  RunResult plain = RunCli({"compare", "--stages=4", "--microbatches=8",
                            absl::StrCat("--costs=", path), "--schedules=1f1b,gpipe"});
  EXPECT_EQ(plain.code, 0) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("1f1b               1          44"));
  RunResult split = RunCli({"compare", "--stages=4", "--microbatches=8",
                            absl::StrCat("--costs=", path), "--schedules=1f1b,zb-h1"});
  EXPECT_EQ(split.code, 2);
  EXPECT_THAT(split.err, HasSubstr("B=3 is not I + W = 2"));
  // Costs so small that the step is subnormal: ranked, not a crash.
  RunResult tiny = RunCli({"compare", "--stages=2", "--microbatches=4", "--cost-f=1e-310",
                           "--cost-b=2e-310", "--schedules=1f1b,gpipe"});
  EXPECT_EQ(tiny.code, 0) << tiny.err;
  EXPECT_THAT(tiny.out, HasSubstr("fastest: "));
  std::filesystem::remove(path);
}

TEST(CompareTest, MarksWhatFitsTheDeviceMemory) {
  // 64 MiB per stage and micro-batch: 1F1B and the zero-bubble schedules hold 4 stages'
  // worth (256 MiB), dualpipe-v 4.5 (the fastest with these transfers), interleaved 1F1B
  // 5.5, GPipe and looped BFS all 8.
  RunResult r = RunCli({"compare", "--stages=4", "--microbatches=8", "--cost-comm=0.05",
                        "--activation-bytes=67108864", "--device-memory=270MiB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("interleaved-1f1b   2        29.2        29.2    1.119   17.81%   "
                               "     -        5.5  352.00 MiB    no\n"));
  EXPECT_THAT(r.out, HasSubstr("dualpipe-v         2        26.1        26.1    1.000    8.05%   "
                               "     -        4.5  288.00 MiB    no\n"));
  EXPECT_THAT(r.out, HasSubstr("zb-v               2       26.15       26.15    1.002    8.22%   "
                               "     -        4.0  256.00 MiB   yes\n"));
  EXPECT_THAT(r.out, HasSubstr("fastest: dualpipe-v (V=2); fastest that fits in "
                               "--device-memory=270MiB: zb-v (V=2), 1.002 x the fastest's step"));
  RunResult tight =
      RunCli({"compare", "--stages=4", "--microbatches=8", "--schedules=gpipe,1f1b,zb-v",
              "--activation-bytes=67108864", "--device-memory=100MiB"});
  ASSERT_EQ(tight.code, 0) << tight.err;
  EXPECT_THAT(tight.out, HasSubstr("; none fits in --device-memory=100MiB\n"));
  RunResult unsized = RunCli({"compare", "--stages=4", "--microbatches=8", "--device-memory=1GiB"});
  EXPECT_EQ(unsized.code, 2);
  EXPECT_THAT(unsized.err, HasSubstr("--device-memory needs the activations' sizes"));
}

// --recompute: every stage keeps only its 4 MiB input of its 64 MiB per micro-batch, and
// B and I run F again. In 150 MiB 1F1B (4 x 4 + 60 rebuilt) and interleaved 1F1B now fit
// at 1.257 and 1.086 x zb-v's step; zb-h1 does not: its deferred W's each hold a rebuilt
// 60 MiB until they run.
TEST(CompareTest, RecomputeTradesAForwardPerBackwardForMemory) {
  const std::string json = TempPath("recompute.json");
  const std::vector<std::string> request = {"compare",
                                            "--stages=4",
                                            "--microbatches=8",
                                            "--schedules=1f1b,gpipe,zb-h1,zb-v,interleaved-1f1b",
                                            "--activation-bytes=67108864",
                                            "--input-bytes=4194304",
                                            "--device-memory=150MiB",
                                            "--json=" + json};
  RunResult r = RunCli(request);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("; none fits in --device-memory=150MiB\n"));
  r = RunCli(WithFlags(request, {"--recompute"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("costs per pipeline stage: F 1, B 3 (I 2, W 1), transfer 0, with "
                               "activation recomputation (B and I include F again)"));
  EXPECT_THAT(r.out, HasSubstr("1f1b               1          44          44    1.257   27.27%   "
                               "27.27%        4.0   76.00 MiB   yes\n"));
  EXPECT_THAT(r.out, HasSubstr("zb-h1              1          38          38    1.086   15.79%   "
                               "15.79%        4.0  260.00 MiB    no\n"));
  EXPECT_THAT(r.out, HasSubstr("fastest that fits in --device-memory=150MiB: interleaved-1f1b "
                               "(V=2), 1.086 x the fastest's step"));
  const nlohmann::json j = nlohmann::json::parse(Slurp(json));
  EXPECT_EQ(j["recompute"], true);
  // Interleaved chunks each keep a whole 4 MiB input: rank 0 holds 11 chunk inputs, one
  // chunk's rebuilt rest of its 32 MiB share (28 MiB) and the next F's input.
  for (const nlohmann::json& row : j["ranked"]) {
    if (row["schedule"] == "interleaved-1f1b") {
      EXPECT_EQ(row["peak_activation_bytes"][0], (11 * 4 + 28 + 4) << 20);
    }
  }
}

// zb-2p holds 2P = 8 micro-batches at P=4 with transfers of half an F: in 5 MiB (1 MiB
// each) it gets a second row, searched within 5, which fits and still beats 1F1B.
TEST(CompareTest, SearchedSchedulesAreHeldToTheDeviceMemory) {
  const std::string json = TempPath("fit.json");
  RunResult r = RunCli({"compare", "--stages=4", "--microbatches=16", "--cost-comm=0.5",
                        "--activation-bytes=1048576", "--device-memory=5MiB",
                        "--schedules=1f1b,zb-2p", "--json=" + json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Ranking(r.out), (std::vector<std::string>{"zb-2p", "zb-2p@5", "1f1b"}));
  EXPECT_THAT(r.out, HasSubstr("zb-2p              1        52.5        52.5    1.000    8.57%   "
                               "     -        8.0    8.00 MiB    no\n"));
  EXPECT_THAT(r.out, HasSubstr("zb-2p@5            1          55          55    1.048   12.73%   "
                               "     -        5.0    5.00 MiB   yes\n"));
  EXPECT_THAT(r.out, HasSubstr("NAME@X: the searched schedule NAME held to X stages' worth of "
                               "activations per rank, the loosest whose order fits in "
                               "--device-memory=5MiB (zb-2p@5)\n"));
  EXPECT_THAT(r.out, HasSubstr("fastest that fits in --device-memory=5MiB: zb-2p@5 (V=1), 1.048 "
                               "x the fastest's step"));
  const nlohmann::json j = nlohmann::json::parse(Slurp(json));
  ASSERT_EQ(j["ranked"].size(), 3u);
  EXPECT_EQ(j["ranked"][1]["schedule"], "zb-2p");
  EXPECT_EQ(j["ranked"][1]["label"], "zb-2p@5");
  EXPECT_EQ(j["ranked"][1]["max_activations"], 5.0);
  EXPECT_EQ(j["ranked"][1]["fits"], true);
  EXPECT_TRUE(j["ranked"][0]["max_activations"].is_null());

  // A limit of the user's own is kept as it is.
  RunResult held = RunCli({"compare", "--stages=4", "--microbatches=16", "--cost-comm=0.5",
                           "--activation-bytes=1048576", "--device-memory=5MiB",
                           "--schedules=1f1b,zb-2p", "--max-activations=6"});
  ASSERT_EQ(held.code, 0) << held.err;
  EXPECT_EQ(Ranking(held.out), (std::vector<std::string>{"zb-2p", "1f1b"}));

  // On zb-v's placement limits move by half a stage; in 100 MiB of 64 MiB stages only
  // the searched schedules fit, held to 1.5 stages' worth (zb-1p and zb-2p to 1).
  RunResult tight = RunCli({"compare", "--stages=4", "--microbatches=8",
                            "--activation-bytes=67108864", "--device-memory=100MiB"});
  ASSERT_EQ(tight.code, 0) << tight.err;
  EXPECT_THAT(tight.out, HasSubstr("fastest that fits in --device-memory=100MiB: zb-v-1p@1.5 "
                                   "(V=2), 1.843 x the fastest's step"));
  EXPECT_THAT(tight.out, HasSubstr("zb-1p@1                1          72          72    2.824   "
                                   "66.67%        -        1.0   64.00 MiB   yes\n"));

  // Nothing fits: said per schedule, and the own rows stay.
  RunResult none =
      RunCli({"compare", "--stages=4", "--microbatches=16", "--cost-comm=0.5",
              "--activation-bytes=1048576", "--device-memory=0.5MiB", "--schedules=1f1b,zb-2p"});
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(Ranking(none.out), (std::vector<std::string>{"zb-2p", "1f1b"}));
  EXPECT_THAT(none.out, HasSubstr("zb-2p does not fit in 512.0 KiB per device even when searched "
                                  "within one stage's worth of activations per rank (1 chunk "
                                  "activation): rank 0 peaks at 1.00 MiB; give more memory or "
                                  "smaller activations\n"));
  EXPECT_THAT(none.out, HasSubstr("; none fits in --device-memory=0.5MiB\n"));
}

TEST(CompareTest, PerStageCostFilesDescribeTheOneChunkCut) {
  const std::string costs = TempPath("costs.json");
  // Stage 1 twice as slow as stage 0. 1F1B keeps the cut, so rank 1's M (F + B) = 24 of
  // work bounds its step. ZB-V cuts each stage in two chunks in model order and places
  // chunks 0 and 3 on rank 0, 1 and 2 on rank 1: each rank runs half of each stage,
  // 4 x (1.5 + 3) = 18, and the imbalance is gone.
  std::ofstream(costs) << R"({"version": 1, "stages": [{"f": 1, "b": 2, "i": 1, "w": 1},
                                                      {"f": 2, "b": 4, "i": 2, "w": 2}]})";
  RunResult r = RunCli({"compare", "--stages=2", "--microbatches=4", "--schedules=1f1b,zb-v",
                        "--costs=" + costs, "--json=" + TempPath("out.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("costs per pipeline stage from " + costs +
                               " (2 stages, transfer 0); a schedule with V chunks"));
  nlohmann::json j = nlohmann::json::parse(Slurp(TempPath("out.json")));
  ASSERT_EQ(j["ranked"].size(), 2u);
  EXPECT_EQ(j["ranked"][0]["schedule"], "zb-v");
  EXPECT_EQ(j["ranked"][0]["virtual"], 2);
  EXPECT_EQ(j["ranked"][0]["step_time"], 19);  // 18 of work, one chunk F of fill
  EXPECT_EQ(j["ranked"][1]["schedule"], "1f1b");
  EXPECT_EQ(j["ranked"][1]["step_time"], 27);  // 24, stage 0's first F and last B
  EXPECT_EQ(j["ranked"][0]["vs_best"], 1.0);
  EXPECT_TRUE(j["skipped"].empty());

  std::ofstream(costs) << R"({"version": 1, "stages": [{"f": 1}, {"f": 2}, {"f": 3}, {"f": 4}]})";
  RunResult four = RunCli({"compare", "--stages=2", "--microbatches=4", "--costs=" + costs});
  EXPECT_EQ(four.code, 2);
  EXPECT_EQ(four.err, "pipesched: " + costs +
                          ": cost model: \"stages\" has 4 entries; comparing schedules takes one "
                          "per pipeline stage of a one-chunk cut (P=2), or none for uniform "
                          "costs\n");
  // B must be I + W, or the split schedules would run other work.
  std::ofstream(costs) << R"({"version": 1, "stages": [{"b": 2}, {"b": 3}]})";
  RunResult split = RunCli({"compare", "--stages=2", "--microbatches=4", "--costs=" + costs});
  EXPECT_EQ(split.code, 2);
  EXPECT_THAT(split.err, HasSubstr(": cost model: stage 1: B=3 is not I + W = 2 (I=1, W=1)"));
}

TEST(CompareTest, WritesTheRankingAsJsonMarkdownAndPictures) {
  const std::string json = TempPath("r.json"), md = TempPath("r.md"), svg = TempPath("r.svg");
  RunResult r = RunCli({"compare", "--stages=2", "--microbatches=4", "--schedules=gpipe,zb-h1",
                        "--json=" + json, "--md=" + md, "--svg=" + svg});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(json));
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["microbatches"], 4);
  ASSERT_EQ(j["ranked"].size(), 2u);
  EXPECT_EQ(j["ranked"][0]["schedule"], "zb-h1");  // (P-1)(F+I-W) = 1 against 3
  EXPECT_EQ(j["ranked"][0]["makespan"], 13);
  EXPECT_EQ(j["ranked"][1]["makespan"], 15);
  EXPECT_DOUBLE_EQ(j["ranked"][1]["vs_best"].get<double>(), 15.0 / 13);
  EXPECT_EQ(j["ranked"][1]["peak_activations"], nlohmann::json::array({4, 4}));
  // Without activation sizes there is no bytes column (0 B would read as no memory).
  EXPECT_THAT(Slurp(md), HasSubstr("| zb-h1 | 1 | 13 | 13 | 1.000 | 7.69% | 7.69% | 2.0 |\n"));
  EXPECT_THAT(Slurp(md), Not(HasSubstr("peak bytes")));
  const std::string picture = Slurp(svg);
  EXPECT_THAT(picture, HasSubstr("zb-h1 V=1: step 13, bubble 7.7%"));
  EXPECT_THAT(picture, HasSubstr("gpipe V=1: step 15, bubble 20.0%"));
  EXPECT_LT(picture.find("zb-h1 V=1"), picture.find("gpipe V=1"));  // fastest first
}

TEST(CompareTest, ALongSearchIsAnnouncedSoItIsNotTakenForAHang) {
  // P=512, M=2048: the six searched schedules cover 31.5 million actions. (The output in a
  // directory that does not exist ends the run right after the note.)
  const std::string nowhere = "--json=/nonexistent/dir/compare.json";
  RunResult r = RunCli({"compare", "--stages=512", "--microbatches=2048", nowhere});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, ::testing::StartsWith(
                         "pipesched: note: the search for the searched schedules' orders covers "
                         "about 31.5 million actions (up to 27 passes of a list scheduler): "
                         "expect up to about 79 s on a 2-core machine; fewer micro-batches or "
                         "ranks search faster\n"
                         "pipesched: --json=/nonexistent/dir/compare.json:"));
  // With --device-memory an order over it is searched again, bisecting its limit: up to
  // 2 + 2 x 12 searches for V=1 (M=2048 chunk activations), 2 + 2 x 13 for V=2.
  r = RunCli({"compare", "--stages=512", "--microbatches=2048", "--device-memory=1GiB", nowhere});
  EXPECT_THAT(r.err,
              ::testing::StartsWith(
                  "pipesched: note: the search for the searched schedules' orders (each up "
                  "to 28 times, to fit --device-memory) covers about 868.2 million actions"));
  // A bad size is said first, without the note.
  RunResult size =
      RunCli({"compare", "--stages=512", "--microbatches=2048", "--device-memory=lots"});
  EXPECT_THAT(size.err, ::testing::StartsWith("pipesched: --device-memory=lots:"));
  RunResult small = RunCli({"compare", "--stages=4", "--microbatches=8", "--device-memory=lots"});
  EXPECT_THAT(small.err, ::testing::StartsWith("pipesched: --device-memory=lots:"));
}

// --refine: the searched rows are the refined orders, and what the refinement bought is
// said under the table and kept in the JSON (zb_search_test's uneven stages).
TEST(CompareTest, RefineSaysWhatTheLocalSearchBought) {
  const std::string costs = TempPath("uneven.json"), json = TempPath("refined.json");
  std::ofstream(costs) << R"({"version": 1, "stages": [{"f": 1.2, "b": 2.3, "i": 1.4, "w": 0.9},
      {"f": 0.8, "b": 2.0, "i": 1.1, "w": 0.9}, {"f": 1.5, "b": 2.2, "i": 1.5, "w": 0.7},
      {"f": 1.0, "b": 1.8, "i": 1.0, "w": 0.8}], "comm": 0.1})";
  const std::string md = TempPath("refined.md");
  RunResult r =
      RunCli({"compare", "--stages=4", "--microbatches=12", "--costs=" + costs,
              "--schedules=1f1b,zb-1p,zb-2p", "--refine", "--json=" + json, "--md=" + md});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("zb-1p              1        48.2        48.2"));
  EXPECT_THAT(r.out, HasSubstr("--refine: the searched orders' steps before -> after local "
                               "search: zb-2p 46.8 -> 46.6 (-0.43%), zb-1p 48.9 -> 48.2 "
                               "(-1.43%)\n"));
  EXPECT_THAT(Slurp(md), HasSubstr("\n--refine: the searched orders' steps before -> after "
                                   "local search: zb-2p 46.8 -> 46.6 (-0.43%), zb-1p 48.9 -> "
                                   "48.2 (-1.43%).\n"));
  nlohmann::json j = nlohmann::json::parse(Slurp(json));
  ASSERT_EQ(j["ranked"].size(), 3u);
  EXPECT_EQ(j["ranked"][1]["schedule"], "zb-1p");
  EXPECT_NEAR(j["ranked"][1]["unrefined_step_time"].get<double>(), 48.9, 1e-9);
  EXPECT_NEAR(j["ranked"][1]["step_time"].get<double>(), 48.2, 1e-9);
  EXPECT_TRUE(j["ranked"][2]["unrefined_step_time"].is_null());  // 1f1b
  RunResult plain = RunCli(
      {"compare", "--stages=4", "--microbatches=12", "--costs=" + costs, "--schedules=zb-1p"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("zb-1p              1        48.9        48.9"));
  EXPECT_THAT(plain.out, Not(HasSubstr("--refine")));
  RunResult fixed =
      RunCli({"compare", "--stages=4", "--microbatches=12", "--schedules=1f1b,zb-v", "--refine"});
  EXPECT_EQ(fixed.code, 2);
  EXPECT_EQ(fixed.err,
            "pipesched: --refine applies to the searched schedules (zb-1p, zb-2p, zb-v-1p, "
            "interleaved-zb-1p, zb-v-half, zb-v-min), not to 1f1b, whose order is given, not "
            "searched; drop the flag or name a searched schedule\n");
}

// --refine with --device-memory: the fit chooses its limit from the orders as searched,
// and a refined order that would not fit where the searched one does is not kept.
TEST(CompareTest, RefineWithinADeviceNeverCostsTheFit) {
  const std::string costs = TempPath("sized.json"), json = TempPath("sized_out.json");
  std::ofstream(costs) << R"({"version": 1, "stages": [
      {"f": 1.66, "i": 0.98, "w": 0.93, "b": 1.91, "activation_bytes": 4194304},
      {"f": 1.8, "i": 1.68, "w": 1.69, "b": 3.37, "activation_bytes": 3145728},
      {"f": 0.67, "i": 1.38, "w": 1.87, "b": 3.25, "activation_bytes": 1048576},
      {"f": 1.36, "i": 0.84, "w": 0.35, "b": 1.19, "activation_bytes": 3145728}]})";
  const std::vector<std::string> base = {"compare",
                                         "--stages=4",
                                         "--microbatches=8",
                                         "--costs=" + costs,
                                         "--schedules=interleaved-zb-1p,zb-1p",
                                         "--device-memory=12MiB"};
  RunResult plain = RunCli(base);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("interleaved-zb-1p  2      35.505      35.505"));
  RunResult r = RunCli(WithFlags(base, {"--refine", "--json=" + json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("interleaved-zb-1p  2      35.505      35.505"));
  EXPECT_THAT(r.out, HasSubstr("--refine: the searched orders' steps before -> after local "
                               "search: zb-1p@3 45.37 -> 43.89 (-3.26%); no shorter step found "
                               "for zb-1p; refined orders that do not fit --device-memory, not "
                               "kept: interleaved-zb-1p\n"));
  // With a limit of the user's there is no fit, and the refined rows are held to the
  // device all the same.
  const std::string two = TempPath("two.json");
  std::ofstream(two) << R"({"version": 1, "stages": [
      {"f": 1.07, "i": 1.33, "w": 1.07, "b": 2.4, "activation_bytes": 6291456},
      {"f": 0.58, "i": 1.87, "w": 1.78, "b": 3.65, "activation_bytes": 3145728}], "comm": 0.5})";
  const std::vector<std::string> limited = {"compare",
                                            "--stages=2",
                                            "--microbatches=6",
                                            "--costs=" + two,
                                            "--device-memory=8MiB",
                                            "--max-activations=1.5",
                                            "--schedules=zb-v-1p,zb-v-half"};
  for (const std::vector<std::string>& args : {limited, WithFlags(limited, {"--refine"})}) {
    RunResult run = RunCli(args);
    ASSERT_EQ(run.code, 0) << run.err;
    EXPECT_THAT(run.out, HasSubstr("fastest that fits in --device-memory=8MiB: zb-v-1p (V=2)"));
  }
  EXPECT_THAT(RunCli(WithFlags(limited, {"--refine"})).out,
              HasSubstr("refined orders that do not fit --device-memory, not kept: zb-v-1p, "
                        "zb-v-half\n"));
  nlohmann::json j = nlohmann::json::parse(Slurp(json));
  ASSERT_EQ(j["ranked"].size(), 3u);
  for (const nlohmann::json& row : j["ranked"]) {
    EXPECT_EQ(row["refined_too_large"], row["label"] == "interleaved-zb-1p") << row["label"];
    if (row["label"] == "zb-1p") continue;  // its own order does not fit, refined or not
    EXPECT_TRUE(row["fits"].get<bool>()) << row["label"];
  }
}

TEST(CompareTest, BadRequestsAreOneLineErrors) {
  RunResult skipped = RunCli(
      {"compare", "--stages=4", "--microbatches=9", "--schedules=interleaved-zb,interleaved-1f1b"});
  EXPECT_EQ(skipped.code, 2);
  EXPECT_THAT(skipped.out, HasSubstr("skipped interleaved-zb: interleaved-zb needs M to be a "
                                     "multiple of its number of rounds"));
  EXPECT_THAT(skipped.err,
              ::testing::StartsWith("pipesched: no schedule could run P=4 M=9: interleaved-zb "
                                    "needs M to be a multiple of its number of rounds"));
  EXPECT_EQ(std::count(skipped.err.begin(), skipped.err.end(), '\n'), 1) << skipped.err;

  RunResult partly = RunCli({"compare", "--stages=4", "--microbatches=9"});
  EXPECT_EQ(partly.code, 0) << partly.err;
  EXPECT_THAT(partly.out, HasSubstr("skipped interleaved-1f1b:"));
  EXPECT_THAT(Ranking(partly.out), Not(::testing::Contains("interleaved-1f1b")));

  std::ofstream(TempPath("in.json")) << R"({"version": 1})";
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const Case cases[] = {
      {{"--schedules=1f1b,1f1b"}, "--schedules lists 1f1b twice; name each schedule once"},
      {{"--schedules=1f1b,"}, "--schedules=1f1b,: empty schedule name"},
      {{"--schedules=1f1b,nope"},
       "--schedules: unknown schedule \"nope\"; known schedules: gpipe, 1f1b, "},
      {{"--schedules=gpipe", "--max-activations=2"},
       "--max-activations applies to the searched schedules (zb-1p, "},
      {{"--stages=0"}, "--stages=0 is out of range: use 1 to 4096"},
      {{"--virtual=65"}, "--virtual=65 is out of range: use 0 to 64"},
      {{"--cost-f=-1"}, "--cost-f=-1 is not a valid time"},
      {{"--device-memory=lots"}, "--device-memory=lots:"},
      {{"--cost-f=0", "--cost-b=0"}, "every schedule's step is 0: give the stages some work"},
      // Transfers alone: all idle, no work (the bubble ratio would divide by 0).
      {{"--cost-f=0", "--cost-b=0", "--cost-comm=1"},
       "every action takes 0 time, so there is no bubble to compare: give the stages some work"},
      {{"--stages=2048", "--microbatches=2048"}, "the generators make up to 16777216"},
      {{"--from=x.csv"}, "unknown flag --from for 'compare'"},
      {{"extra"}, "unexpected argument 'extra'"},
      {{"--json=/nonexistent/x.json"},
       "--json=/nonexistent/x.json: the directory /nonexistent "
       "does not exist"},
      {{"--json=" + TempPath("in.json"), "--costs=" + TempPath("in.json")},
       "--json=" + TempPath("in.json") + " is also --costs"},
      {{"--json=a.json", "--md=a.json"}, "--md=a.json is also --json"},
  };
  for (const Case& c : cases) {
    RunResult r = RunCli(WithFlags({"compare", "--stages=4", "--microbatches=8"}, c.args));
    EXPECT_EQ(r.code, 2) << c.error;
    EXPECT_THAT(r.err, HasSubstr(c.error));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace pipesched::cli
