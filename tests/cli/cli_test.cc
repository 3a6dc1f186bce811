// Drives the pipesched program in-process: exit codes, one-line errors, outputs.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/cli_runner.h"
#include "cli/command.h"
#include "cli/job.h"
#include "cli/planning.h"
#include "cli/training.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/host_memory.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/model/synthetic.h"
#include "pipesched/version.h"
#include "testing/scoped_environment.h"
#include "testing/status_matchers.h"

namespace pipesched::cli {
namespace {

using testing::RunCli;
using testing::RunResult;
using testing::Slurp;
using testing::WithFlags;

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) { return testing::TempPath("pipesched_cli_", name); }

std::string Shared(const std::string& rel) { return std::string(PIPESCHED_SHARED_DIR) + "/" + rel; }

int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(CliTest, SchedulesListsEveryGeneratorWithConstraints) {
  RunResult r = RunCli({"schedules"});
  EXPECT_EQ(r.code, 0);
  for (const char* name :
       {"gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "looped-bfs", "zb-h1", "zb-v"}) {
    EXPECT_THAT(r.out, HasSubstr(name));
  }
  EXPECT_THAT(r.out, HasSubstr("constraints:"));
}

TEST(CliTest, VersionAndDashDashVersionPrintTheVersion) {
  for (const char* spelling : {"version", "--version"}) {
    RunResult r = RunCli({spelling});
    EXPECT_EQ(r.code, 0) << spelling;
    EXPECT_EQ(r.out, absl::StrCat("pipesched ", PIPESCHED_VERSION_STRING, "\n")) << spelling;
    EXPECT_EQ(r.err, "") << spelling;
  }
}

TEST(CliTest, MarkdownCellsKeepTheirTable) {
  EXPECT_EQ(MarkdownCell("x,y\"z|w"), "x,y\"z\\|w");  // a schedule file's name
  EXPECT_EQ(MarkdownCell("a\nb\rc"), "a b c");
  EXPECT_EQ(MarkdownCell("1f1b"), "1f1b");
}

TEST(CliTest, AHugeValueIsCutInTheMiddleOfItsErrorLine) {
  const std::string name(100000, 'x');
  RunResult r = RunCli({"simulate", "--schedule=" + name + "END"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(CountLines(r.err), 1);
  EXPECT_LT(r.err.size(), 1100u) << r.err.size();
  EXPECT_THAT(r.err, ::testing::StartsWith("pipesched: unknown schedule \"xxx"));
  EXPECT_THAT(r.err, HasSubstr(" bytes cut ...] "));
  EXPECT_THAT(r.err, HasSubstr("known schedules: gpipe, 1f1b"));  // the end of the line is kept
  // Cut at a character's start: a multi-byte character stays whole (each 0xc3 is followed
  // by its 0xa9), and bytes that only continue (not UTF-8) do not stop the cut.
  std::string accents;
  for (int k = 0; k < 2000; ++k) accents += "\xc3\xa9";
  r = RunCli({"simulate", "--schedule=" + accents});
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.err.size(), 1100u) << r.err.size();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\xc3'),
            std::count(r.err.begin(), r.err.end(), '\xa9'));
  r = RunCli({"simulate", "--schedule=" + std::string(3000, '\xa0')});
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.err.size(), 1100u) << r.err.size();
  EXPECT_EQ(CountLines(r.err), 1);
}

TEST(CliTest, Simulate1F1BPrintsClosedFormNextToSimulated) {
  RunResult r = RunCli({"simulate", "--schedule=1f1b", "--stages=4", "--microbatches=8"});
  ASSERT_EQ(r.code, 0) << r.err;
  // (P-1)/(M+P-1) = 3/11 = 0.2727 both ways; makespan (M+P-1)(F+B) = 33.
  EXPECT_THAT(r.out, HasSubstr("makespan 33"));
  EXPECT_THAT(r.out, HasSubstr("bubble fraction 0.2727 (simulated)   0.2727 (closed form)"));
}

TEST(CliTest, SimulateWritesJsonWithTheDocumentedKeys) {
  std::string json_path = TempPath("stats.json");
  RunResult r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=4",
                        "--json=" + json_path, "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(json_path));
  EXPECT_EQ(j["schedule"], "gpipe");
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["virtual"], 1);
  EXPECT_EQ(j["microbatches"], 4);
  EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 15.0);  // (M+P-1)(F+B) = 5 x 3
  EXPECT_DOUBLE_EQ(j["bubble_fraction"].get<double>(), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(j["formula_bubble_fraction"].get<double>(), 1.0 / 5.0);
  EXPECT_EQ(j["peak_activations"], nlohmann::json::array({4, 4}));  // GPipe holds M
  EXPECT_EQ(j["recompute_stages"], nlohmann::json::array());
  EXPECT_TRUE(j["recompute_plan"].is_null()) << j["recompute_plan"].dump();
}

// GPipe, P=2, M=4: every rank holds 4 stashes at its first B, which also holds the
// workspace: 4 x 100 + 1000.
TEST(CliTest, SimulateAddsTheWorkspaceToThePeakBytes) {
  std::string json_path = TempPath("ws.json");
  RunResult r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=4",
                        "--activation-bytes=100", "--workspace-bytes=1000", "--json=" + json_path,
                        "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(json_path));
  EXPECT_EQ(j["peak_activation_bytes"], nlohmann::json::array({1400, 1400}));
  EXPECT_EQ(j["peak_activations"], nlohmann::json::array({4, 4}));
  // Workspace alone still prints the bytes column.
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4",
              "--workspace-bytes=2048", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("peak act bytes"));
  EXPECT_THAT(r.out, HasSubstr("2.0 KiB"));
  // The received input (--input-bytes, part of --activation-bytes) is live from the
  // action before its F: rank 1 of 1F1B holds one stash and the next F's input.
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4",
              "--activation-bytes=100", "--input-bytes=10", "--json=" + json_path, "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(Slurp(json_path));
  EXPECT_EQ(j["peak_activation_bytes"], nlohmann::json::array({200, 110}));
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4",
              "--activation-bytes=100", "--input-bytes=101", "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --input-bytes=101 exceeds the activation bytes 100: the received input "
            "is part of a micro-batch's activations; give --activation-bytes of at least "
            "--input-bytes\n");
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4",
              "--workspace-bytes=-1", "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--workspace-bytes=-1 is negative; use a byte count in [0, "
                               "1125899906842624] (2^50, 1 PiB)"));
}

// --device-memory asks whether every rank's activation peak fits one device: GPipe
// holds all 8 micro-batches of 12 GiB (96 GiB, exit 2 naming what would fit), 1F1B at
// most P = 4 (48 GiB, fits); without activation sizes there is nothing to check.
TEST(CliTest, SimulateChecksTheActivationPeakAgainstTheDeviceMemory) {
  auto run = [](const std::string& schedule, const std::vector<std::string>& more) {
    std::vector<std::string> args = {"simulate", "--nogrid"};
    if (!schedule.empty()) {
      args.insert(args.end(), {"--schedule=" + schedule, "--stages=4", "--microbatches=8"});
    }
    args.insert(args.end(), more.begin(), more.end());
    return RunCli(args);
  };
  const std::string twelve_gib = "--activation-bytes=" + std::to_string(std::int64_t{12} << 30);
  RunResult gpipe = run("gpipe", {twelve_gib, "--device-memory=80GiB"});
  EXPECT_EQ(gpipe.code, 2);
  EXPECT_THAT(gpipe.out, HasSubstr("96.00 GiB"));  // the per-rank table still printed
  EXPECT_EQ(gpipe.err,
            "pipesched: gpipe's activations do not fit in one device (--device-memory=80GiB): at "
            "its peak the plan holds 96.00 GiB there (1 rank(s); rank 0 alone 96.00 GiB with 8 "
            "of M = 8 micro-batches in flight) but 80.00 GiB is available; use smaller "
            "--activation-bytes or --workspace-bytes, fewer --microbatches, a schedule that "
            "keeps fewer micro-batches in flight (1f1b: at most P = 4 on a rank), or more "
            "--stages (fewer layers on each device)\n");
  // A byte short: the two sizes would read alike rounded, so the bytes are given too.
  RunResult short_by_one = run("1f1b", {"--activation-bytes=1048576", "--device-memory=4194303"});
  EXPECT_EQ(short_by_one.code, 2);
  EXPECT_THAT(short_by_one.err,
              HasSubstr("the plan holds 4.00 MiB (4194304 B) there (1 rank(s); rank 0 alone "
                        "4.00 MiB with 4 of M = 8 micro-batches in flight) but 4.00 MiB "
                        "(4194303 B) is available"));
  RunResult one_f_one_b = run("1f1b", {twelve_gib, "--device-memory=80GiB"});
  EXPECT_EQ(one_f_one_b.code, 0) << one_f_one_b.err;
  EXPECT_THAT(one_f_one_b.out,
              HasSubstr("memory: every rank's activation peak fits in --device-memory=80GiB "
                        "(largest: rank 0, 48.00 GiB, 60%;"));
  RunResult unknown = run("1f1b", {"--device-memory=80GiB"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("--device-memory needs the activations' sizes"));
  EXPECT_EQ(unknown.out, "");  // said before the grid and the table, not after them
  // Also before --recompute-stages=auto's line, which would say it fits.
  unknown = run("1f1b", {"--device-memory=80GiB", "--recompute-stages=auto"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("--device-memory needs the activations' sizes"));
  EXPECT_EQ(unknown.out, "");
  RunResult bad = run("1f1b", {twelve_gib, "--device-memory=lots"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--device-memory=lots: 'lots' is not a size"));
  EXPECT_EQ(CountLines(bad.err), 1);
}

// A searched schedule whose own order does not fit --device-memory is searched again
// within fewer activations (the loosest limit that fits), and says so; the order it runs
// is the one --max-activations would give. With a limit of the user's, or when nothing
// fits, the own order is checked as it is.
TEST(CliTest, SimulateHoldsASearchedScheduleToTheDeviceMemory) {
  const std::vector<std::string> zb2p = {
      "simulate",          "--nogrid",        "--schedule=zb-2p",          "--stages=4",
      "--microbatches=16", "--cost-comm=0.5", "--activation-bytes=1048576"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = zb2p;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  const std::string fitted_csv = TempPath("fitted.csv"), held_csv = TempPath("held.csv");
  RunResult fitted = RunCli(with({"--device-memory=5MiB", "--csv=" + fitted_csv}));
  ASSERT_EQ(fitted.code, 0) << fitted.err;
  EXPECT_THAT(fitted.out,
              HasSubstr("zb-2p: its own order peaks at 8.00 MiB, more than --device-memory=5MiB: "
                        "searched within 5 stages' worth of activations per rank instead "
                        "(--max-activations=5), the loosest that fits (4 searches)\n"));
  EXPECT_THAT(fitted.out, HasSubstr("makespan 55 "));
  EXPECT_THAT(fitted.out, HasSubstr("memory: every rank's activation peak fits in "
                                    "--device-memory=5MiB (largest: rank 0, 5.00 MiB, 100%;"));
  RunResult held = RunCli(with({"--max-activations=5", "--csv=" + held_csv}));
  ASSERT_EQ(held.code, 0) << held.err;
  EXPECT_EQ(Slurp(fitted_csv), Slurp(held_csv));

  RunResult own_limit = RunCli(with({"--device-memory=5MiB", "--max-activations=8"}));
  EXPECT_EQ(own_limit.code, 2);
  EXPECT_THAT(own_limit.out, Not(HasSubstr("searched within")));
  EXPECT_THAT(own_limit.err, HasSubstr("zb-2p's activations do not fit in one device "
                                       "(--device-memory=5MiB): at its peak the plan holds "
                                       "8.00 MiB"));
  RunResult none = RunCli(with({"--device-memory=0.5MiB"}));
  EXPECT_EQ(none.code, 2);
  EXPECT_THAT(none.err,
              HasSubstr("pipesched: note: zb-2p does not fit in 512.0 KiB per device even when "
                        "searched within one stage's worth of activations per rank (1 chunk "
                        "activation): rank 0 peaks at 1.00 MiB; give more memory or smaller "
                        "activations\n"));
  EXPECT_THAT(none.err, HasSubstr("pipesched: zb-2p's activations do not fit in one device"));
}

// --static-bytes: what each stage holds whatever the order (parameters, gradients,
// optimizer state) is a column of its own and comes off --device-memory first.
TEST(CliTest, SimulateCountsStaticBytesAgainstTheDeviceMemory) {
  const std::vector<std::string> base = {"simulate",
                                         "--nogrid",
                                         "--schedule=1f1b",
                                         "--stages=4",
                                         "--microbatches=8",
                                         "--activation-bytes=1048576",
                                         "--static-bytes=3145728"};
  std::vector<std::string> fits = base;
  fits.push_back("--device-memory=8MiB");
  RunResult ok = RunCli(fits);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("peak act   peak act bytes   static bytes\n"));
  EXPECT_THAT(ok.out, HasSubstr("   4.00 MiB   3.00 MiB\n"));
  EXPECT_THAT(ok.out, HasSubstr("memory: every rank's peak fits in --device-memory=8MiB "
                                "(largest: rank 0, 3.00 MiB static and 4.00 MiB of activations, "
                                "88%)\n"));
  std::vector<std::string> tight = base;
  tight.push_back("--device-memory=6MiB");
  RunResult over = RunCli(tight);
  EXPECT_EQ(over.code, 2);
  EXPECT_THAT(over.err, HasSubstr("pipesched: 1f1b's activations do not fit in one device "
                                  "(--device-memory=6MiB, 3.00 MiB of it static): at its peak the "
                                  "plan holds 4.00 MiB there"));
  EXPECT_THAT(over.err, HasSubstr("but 3.00 MiB is available"));
  // Exactly the static bytes leaves nothing for activations: said as such.
  std::vector<std::string> exact = base;
  exact.push_back("--device-memory=3MiB");
  RunResult full = RunCli(exact);
  EXPECT_EQ(full.code, 2);
  EXPECT_THAT(full.err, HasSubstr("(static_bytes) alone take 3.00 MiB, all of "
                                  "--device-memory=3MiB (3.00 MiB, none left for activations)"));
  std::vector<std::string> tiny = base;
  tiny.push_back("--device-memory=2MiB");
  RunResult none = RunCli(tiny);
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.err,
            "pipesched: rank 0's parameters, gradients and optimizer state (static_bytes) alone "
            "take 3.00 MiB, more than --device-memory=2MiB (2.00 MiB); give more memory, or more "
            "--stages (fewer layers on each device)\n");
}

TEST(CliTest, SimulateWritesPicturesAndCsv) {
  std::string svg = TempPath("t.svg"), trace = TempPath("t.json"), csv = TempPath("t.csv");
  RunResult r = RunCli({"simulate", "--schedule=zb-h1", "--stages=4", "--microbatches=8",
                        "--svg=" + svg, "--trace=" + trace, "--csv=" + csv, "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Slurp(svg), HasSubstr("<svg"));
  EXPECT_NO_THROW(nlohmann::json::parse(Slurp(trace)));
  EXPECT_EQ(CountLines(Slurp(csv)), 4);  // one row per rank
  EXPECT_THAT(r.out, HasSubstr("wrote " + svg));
}

TEST(CliTest, ValidateAcceptsPytorchFiles) {
  for (const char* f : {"interop/pytorch/2-rank.csv", "interop/pytorch/8-rank.csv"}) {
    RunResult r = RunCli({"validate", Shared(f), "--nogrid"});
    EXPECT_EQ(r.code, 0) << f << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr(": valid"));
  }
}

// A flag that cannot work is refused before any output, validate's verdict included: it
// printed "F: valid" and then the error.
TEST(CliTest, ValidateRefusesDeviceMemoryWithoutSizesBeforeItsVerdict) {
  RunResult r = RunCli(
      {"validate", Shared("interop/pytorch/2-rank.csv"), "--nogrid", "--device-memory=1GiB"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("--device-memory needs the activations' sizes"));
  // And with them, the verdict comes first.
  r = RunCli({"validate", Shared("interop/pytorch/2-rank.csv"), "--nogrid", "--device-memory=1GiB",
              "--activation-bytes=1024"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith(Shared("interop/pytorch/2-rank.csv") + ": valid\n"));
  // What would fit is said in a file's terms: its P and M are not flags here.
  r = RunCli({"validate", Shared("interop/pytorch/2-rank.csv"), "--nogrid", "--device-memory=4KiB",
              "--activation-bytes=1024"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("a schedule with more ranks (fewer layers on each device)"));
  EXPECT_THAT(r.err, Not(HasSubstr("--stages")));
  EXPECT_THAT(r.err, Not(HasSubstr("--microbatches")));
}

TEST(CliTest, ValidateRejectsADeadlockWithTheBlockedActions) {
  std::string path = TempPath("deadlock.csv");
  // Rank 0 waits for 1B0 before running 0F1; rank 1 runs 1F1 before 1B0... that needs 0F1.
  std::ofstream(path) << "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n";
  RunResult r = RunCli({"validate", path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("deadlock"));
  EXPECT_THAT(r.err, HasSubstr("rank 0"));
  EXPECT_THAT(r.err, HasSubstr("rank 1"));
}

struct BadInput {
  std::vector<std::string> args;
  std::string message;
};

class CliBadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInputTest, OneLineErrorAndExitTwo) {
  RunResult r = RunCli(GetParam().args);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr(GetParam().message));
  EXPECT_THAT(r.err, ::testing::StartsWith("pipesched: "));
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
}

std::string WriteTemp(const std::string& name, const std::string& content) {
  std::string path = TempPath(name);
  std::ofstream(path) << content;
  return path;
}

// A PyTorch file whose stages sit where neither loop nor v placement puts them (here
// block placement: rank 0 holds stages 0 and 1) simulates, trains and says its placement.
TEST(CliTest, ExplicitPlacementFromAFileIsSimulatedAndTrained) {
  const std::string csv =
      WriteTemp("block.csv", "0F0,0F1,1F0,1F1,1B0,1B1,0B0,0B1\n2F0,2F1,3F0,3F1,3B0,3B1,2B0,2B1\n");
  const std::string json_path = TempPath("block_stats.json");
  RunResult r = RunCli({"simulate", "--from=" + csv, "--cost-comm=0.5", "--json=" + json_path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("P=2 V=2 M=2  placement=explicit(0,0,1,1)  actions=16"));
  EXPECT_THAT(r.out, HasSubstr("makespan 22 "));  // one transfer each way, not three
  nlohmann::json j = nlohmann::json::parse(Slurp(json_path));
  EXPECT_EQ(j["placement"], "explicit");
  EXPECT_EQ(j["stage_ranks"], nlohmann::json::array({0, 0, 1, 1}));

  const std::string saved = TempPath("block_again.json");
  r = RunCli({"simulate", "--from=" + csv, "--nogrid", "--schedule-json=" + saved});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Slurp(saved), HasSubstr("\"placement\": [0, 0, 1, 1],"));

  r = RunCli({"train", "--from=" + saved, "--steps=2", "--hidden=16", "--layers=3",
              "--microbatch-size=4", "--backend=host"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 2/2"));
}

INSTANTIATE_TEST_SUITE_P(
    Flags, CliBadInputTest,
    ::testing::Values(
        BadInput{{"nosuchcommand"}, "unknown command 'nosuchcommand'"},
        BadInput{{"help", "nosuchcommand"}, "unknown command 'nosuchcommand'"},
        BadInput{{"simulate", "--schedule=x\ny"},
                 "argument 2, \"--schedule=x\\ny\", holds the control byte \"\\n\" at byte "
                 "13; flags and paths take none"},
        BadInput{{"validate", "f/\x1b[31mred.csv"}, "holds the control byte \"\\x1b\" at byte 3"},
        // Lists and RANK:FACTOR take decimal digits as the scalar flags do: no spaces, no hex.
        BadInput{{"simulate", "--nogrid", "--recompute-stages= 0,1"},
                 "--recompute-stages= 0,1: ' 0' is not an integer"},
        BadInput{{"train", "--partition= 1,2"}, "' 1' is not a positive layer count"},
        BadInput{{"bench", "--slow-stage=0:0x10"},
                 "--slow-stage=0:0x10: write RANK:FACTOR with a rank >= 0 and a factor from 1"},
        // launch -- train: pipesched's own flags, checked once by launch.
        BadInput{{"launch", "--processes=2", "--", "train", "--seed=1\n"},
                 "argument 5, \"--seed=1\\n\", holds the control byte"},
        BadInput{{"simulate",
                  "--json=a\x9b"
                  "b.json"},
                 "holds the control byte \"\\x9b\" at byte 9"},
        BadInput{{"simulate", "--json="},
                 "--json= has an empty value; give one, or leave the flag out for its default"},
        BadInput{{"train", "--save", ""}, "--save= has an empty value"},
        // `--json --stages=2` wrote a file named "--stages=2" and ran with the default P.
        BadInput{{"simulate", "--nogrid", "--json", "--stages=2"},
                 "flag --json needs a value, and the next argument, --stages=2, is a flag; give "
                 "--json=VALUE"},
        BadInput{{"version", "extra"}, "unexpected argument 'extra'; version takes no arguments"},
        BadInput{{"version", "--json=x"}, "unknown flag --json for 'version'; it takes no flags"},
        BadInput{{"simulate", "--schedule=my/order.csv"},
                 "--schedule=my/order.csv names a file, not a schedule generator; load a "
                 "schedule file with --from=my/order.csv"},
        BadInput{{"train", "--schedule=order.json", "--steps=1"},
                 "--schedule=order.json names a file, not a schedule generator"},
        BadInput{{"train", "--schedule=ORDER.CSV", "--steps=1"},
                 "--schedule=ORDER.CSV names a file, not a schedule generator"},
        BadInput{{"compare", "--schedules=1f1b,my/order.csv"},
                 "--schedules lists my/order.csv, a file, not a schedule generator; schedule "
                 "files are read by --from=FILE (bench, simulate, train) and by validate FILE"},
        BadInput{{"schedules", "x"}, "unexpected argument 'x'; schedules takes no arguments"},
        BadInput{{"simulate", "--nogrid=true"},
                 "--nogrid takes no value; use --nogrid (= --grid=false) or --grid"},
        BadInput{{"simulate", "--schedule=nope"}, "nope"},
        BadInput{{"simulate", "--stages=0"}, "--stages=0 is out of range"},
        // No work: no bubble to measure (makespan 0, or transfers alone: all idle).
        BadInput{{"simulate", "--cost-f=0", "--cost-b=0"},
                 "every action of the schedule takes 0 time, so there is no bubble to measure: "
                 "give the stages some work (--cost-f, --cost-b, or a --costs file with times)"},
        BadInput{{"simulate", "--cost-f=0", "--cost-b=0", "--cost-comm=1"},
                 "every action of the schedule takes 0 time"},
        // A fraction of a byte is not silently a byte less.
        BadInput{{"simulate", "--activation-bytes=1", "--device-memory=1.9"},
                 "--device-memory=1.9: '1.9' is not a size (a fraction of a byte)"},
        BadInput{{"simulate", "--stages=-3"}, "--stages=-3 is out of range"},
        BadInput{{"simulate", "--microbatches=0"}, "--microbatches=0 is out of range"},
        BadInput{{"simulate", "--stages=abc"}, "bad value 'abc' for --stages"},
        // Values are quoted short, with control bytes escaped.
        BadInput{{"simulate", "--stages=" + std::string(100000, '1')},
                 "bad value '" + std::string(60, '1') + "...' for --stages"},
        BadInput{{"simulate",
                  "--schedule=a\x01"
                  "b",
                  "--stages=x"},
                 "argument 2, \"--schedule=a\\x01b\", holds the control byte \"\\x01\" at byte "
                 "13"},
        BadInput{{"simulate", "--" + std::string(100000, 'z') + "=1"},
                 "unknown flag --" + std::string(60, 'z') + "... for 'simulate'"},
        BadInput{{"simulate", "--stages=2147483648"},
                 "bad value '2147483648' for --stages: far beyond any value it takes"},
        BadInput{{"simulate", "--bogus=1"}, "unknown flag --bogus"},
        BadInput{{"simulate", "--cost-f=-1"}, "--cost-f=-1 is not a valid time"},
        BadInput{{"simulate", "--schedule=1f1b", "--virtual=2"}, "1f1b"},
        BadInput{{"simulate", "--stages=4096", "--microbatches=1048576"}, "the planner handles"},
        BadInput{{"simulate", "--color=blue"}, "--color=blue"},
        // It colours the grid only: accepted with --nogrid, it did nothing.
        BadInput{{"simulate", "--nogrid", "--color=always"},
                 "--color=always colours the timeline grid, which --nogrid leaves out; drop one "
                 "of them"},
        BadInput{{"simulate", "--from=/nonexistent.csv"}, "/nonexistent.csv"},
        BadInput{{"validate"}, "validate takes one schedule file"},
        BadInput{{"validate", "/nonexistent.csv"}, "/nonexistent.csv"},
        // A repeated flag: the first value was silently dropped.
        BadInput{{"simulate", "--microbatches=4", "--microbatches=8"},
                 "--microbatches is given twice; give it once"},
        BadInput{{"simulate", "--cost_f=2", "--cost-f=3"}, "--cost-f is given twice; give it once"},
        // Numbers say what form they take; integers are decimal (not 0x10 = 16).
        BadInput{{"simulate", "--microbatches=1e3"},
                 "bad value '1e3' for --microbatches: expected a whole number in decimal "
                 "digits, such as 8"},
        BadInput{{"simulate", "--microbatches=0x10"}, "bad value '0x10' for --microbatches"},
        // The unsigned --seed too: 0x10 ran as seed 16, -1 got abseil's "Illegal value".
        BadInput{{"train", "--seed=0x10"},
                 "bad value '0x10' for --seed: expected a whole number in decimal digits, such "
                 "as 8"},
        BadInput{{"train", "--seed=-1"},
                 "bad value '-1' for --seed: expected a whole number from 0 up, in decimal "
                 "digits, such as 8"},
        BadInput{{"bench", "--seed=18446744073709551616"},
                 "bad value '18446744073709551616' for --seed: far beyond any value it takes"},
        BadInput{{"simulate", "--cost-f=1,5"},
                 "bad value '1,5' for --cost-f: expected a number such as 0.5 or 2"},
        // Hexadecimal ran as 16; inf and nan are no costs.
        BadInput{{"simulate", "--cost-f=0x10"},
                 "bad value '0x10' for --cost-f: expected a number such as 0.5 or 2"},
        BadInput{{"train", "--lr=inf"},
                 "bad value 'inf' for --lr: expected a number such as 0.5 or 2"},
        // Decimal, but beyond a double: it parsed as inf and was reported as "--lr=inf".
        BadInput{{"train", "--lr=1e400"},
                 "bad value '1e400' for --lr: beyond the range of a number (about 1.8e308); "
                 "give a smaller one"},
        BadInput{{"train", "--lr=1e-400"},
                 "bad value '1e-400' for --lr: too close to 0 for a number (below about "
                 "4.9e-324); give 0 or a larger one"},
        // Outputs are checked before the run, in one line naming what would work.
        BadInput{{"simulate", "--json=/nonexistent/dir/x.json"},
                 "--json=/nonexistent/dir/x.json: the directory /nonexistent/dir does not exist; "
                 "give a file path in a writable directory"},
        BadInput{{"simulate", "--svg=/"}, "--svg=/: is a directory"},
        // Caught only after the run before: access() says yes to root in /proc (and /sys),
        // and /dev/fd/987 is no descriptor at all.
        BadInput{{"simulate", "--json=/proc/x.json"}, "--json=/proc/x.json: the directory /proc "},
        BadInput{{"simulate", "--json=/dev/fd/987"},
                 "--json=/dev/fd/987: descriptor 987 is not open for writing; give a file path "
                 "in a writable directory"},
        BadInput{{"validate", Shared("interop/pytorch/2-rank.csv"), "--json=/nonexistent/x.json"},
                 "--json=/nonexistent/x.json: the directory /nonexistent does not exist"},
        BadInput{{"help", "simulate", "extra"},
                 "unexpected argument 'extra'; help takes one command: pipesched help simulate"},
        BadInput{{"simulate", "-nogrid"},
                 "unexpected argument '-nogrid'; flags start with two dashes: --nogrid"},
        BadInput{{"version", "-x"}, "flags start with two dashes: --x"},
        BadInput{{"train", "--schedule=1f1b", "--stages=2", "--microbatches=4", "--layers=4",
                  "--hidden=16", "--steps=1", "--microbatch-size=2", "--device-memory=1KiB"},
                 "the model does not fit the device memory cap of 1.0 KiB (--device-memory) "
                 "before any activation: host:0: cannot allocate"},
        // B that a split schedule would not use.
        BadInput{{"simulate", "--schedule=zb-h1", "--cost-b=3", "--cost-i=1", "--cost-w=1"},
                 "B=3 is not I + W = 2 (I=1, W=1): zb-h1 splits the backward into I and W, so "
                 "B would not be used; give I and W that add up to B (--cost-b alone sets I = "
                 "W = B/2)"},
        // I and W that a schedule running B would not use: --cost-i=3 changed nothing.
        BadInput{{"simulate", "--schedule=1f1b", "--cost-i=3"},
                 "B=2 is not I + W = 4 (I=3, W=1): 1f1b runs B, so --cost-i and --cost-w would "
                 "not be used; give --cost-b=4 too, or I and W that add up to B"}));

// --cost-b alone splits evenly into I and W, as compare does: zb-h1 ran B=100 as I = W = 1.
TEST(CliTest, CostBAloneSetsIAndWToHalfOfIt) {
  RunResult r = RunCli({"simulate", "--schedule=zb-h1", "--stages=2", "--microbatches=4",
                        "--cost-b=100", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  // M (F + I + W) + (P-1) max(F, I) = 4 x 101 + 50.
  EXPECT_THAT(r.out, HasSubstr("makespan 454 "));
  // A schedule without I and W runs B; I and W given with it must add up to it (refused
  // otherwise: CliBadInputTest), so that one set of flags means one backward everywhere.
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4", "--cost-b=3",
              "--cost-i=1", "--cost-w=2", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 20 "));
}

// A --costs file is read once: from a pipe (`--costs=<(...)`) the second read found it
// empty and simulate called valid costs "not valid JSON" (a named pipe hung there).
TEST(CliTest, SimulateReadsACostsPipeOnce) {
  const std::string costs = R"({"version": 1, "default": {"f": 2, "b": 4}})";
  for (const std::string schedule : {"1f1b", "zb-2p"}) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    ASSERT_EQ(::write(fds[1], costs.data(), costs.size()),
              static_cast<ssize_t>(costs.size()));  // fits the pipe's buffer
    ::close(fds[1]);
    RunResult r =
        RunCli({"simulate", "--schedule=" + schedule, "--stages=2", "--microbatches=4", "--nogrid",
                "--cost-i=2", "--cost-w=2", absl::StrCat("--costs=/dev/fd/", fds[0])});
    ::close(fds[0]);
    ASSERT_EQ(r.code, 0) << schedule << ": " << r.err;
    // 1f1b: (M + P - 1)(F + B) = 5 x 6; zb-2p: M (F + I + W) + (P - 1) F = 24 + 2.
    EXPECT_THAT(r.out, HasSubstr(schedule == "1f1b" ? "makespan 30 " : "makespan 26 "));
  }
}

// Bad cost files: one line, exit 2. Each was a crash (deep nesting), a hang (1e308), a
// wrong peak (2^62 bytes) or silently ignored (lists of the wrong length).
TEST(CliTest, BadCostFilesAreOneLineErrors) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  struct Case {
    std::string content;
    std::vector<std::string> flags;
    std::string message;
  } const cases[] = {
      {"{\"version\": " + deep + "}", {}, "nested deeper than 64 levels"},
      {"{\"stages\": " + deep + "}", {}, "nested deeper than 64 levels"},
      {R"({"version": 1, "default": {"f": 1e308, "b": 1e308}})",
       {},
       "\"default.b\" must be a number in [0, 1e+15], got 1e+308"},
      {R"({"version": 1, "comm": 1e308})", {}, "\"comm\" must be a number in [0, 1e+15]"},
      {R"({"version": 1, "default": {"activation_bytes": 4611686018427387904}})",
       {},
       "must be an integer in [0, 1125899906842624] (2^50)"},
      {R"({"version": 1, "comm": [5]})",
       {"--stages=4"},
       "\"comm\" has 1 entry but the schedule has 3 stage boundaries"},
      {R"({"version": 1, "stages": [{}, {}, {}, {}, {}]})",
       {},
       "\"stages\" has 5 entries but the schedule has 2 virtual stages (P=2 x V=1)"},
      {R"({"version": 1, "stages": [{"f": 2}]})", {}, "\"stages\" has 1 entry"},
      // The same for schedules searched for the costs, refused before the search.
      {R"({"version": 1, "stages": [{}, {}, {}, {}, {}]})",
       {"--schedule=zb-1p"},
       "\"stages\" has 5 entries but the schedule has 2 virtual stages (P=2 x V=1)"},
      {R"({"version": 1, "comm": [5]})",
       {"--schedule=zb-v-1p", "--stages=4"},
       "\"comm\" has 1 entry but the schedule has 7 stage boundaries"},
      // nlohmann kept the last of two values without a word (f = 5 here).
      {R"({"version": 1, "default": {"f": 1, "f": 5}})",
       {},
       "key \"f\" is given twice in one object; give each key once"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = WriteTemp("costs" + std::to_string(i++) + ".json", c.content);
    RunResult r = RunCli(WithFlags(
        {"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=2", "--costs=" + path},
        c.flags));
    EXPECT_EQ(r.code, 2) << c.message;
    EXPECT_THAT(r.err, ::testing::StartsWith("pipesched: " + path + ": cost model: "));
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(CountLines(r.err), 1) << r.err.substr(0, 300);
  }
  // The same lists in a schedule file's "costs" name that file.
  const std::string schedule =
      WriteTemp("costs_in_schedule.json",
                R"({"format": "pipesched-schedule", "version": 1, "stages": 2, "microbatches": 1,
          "programs": [["0F0", "0B0"], ["1F0", "1B0"]], "costs": {"comm": [1, 2]}})");
  RunResult r = RunCli({"validate", schedule});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr(schedule + ": key \"costs\": cost model: \"comm\" has 2 "
                                          "entries but the schedule has 1 stage boundaries"));
  // Lists that fit simulate.
  const std::string fits =
      WriteTemp("costs_fit.json", R"({"version": 1, "stages": [{"f": 2}, {}], "comm": [0.5]})");
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=2", "--costs=" + fits,
              "--nogrid"});
  EXPECT_EQ(r.code, 0) << r.err;
}

// Flags and files state the bound they break.
TEST(CliTest, LimitsAreStatedInTheMessage) {
  RunResult r = RunCli({"simulate", "--cost-f=1e16"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cost-f=1e+16 is not a valid time; use a number in [0, 1e+15]"));
  // Quoted in full: 6 digits made it "--cost-f=1e+15 is not ... in [0, 1e+15]".
  r = RunCli({"simulate", "--cost-f=1.0000001e15"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cost-f=1.0000001e+15 is not a valid time"));
  r = RunCli({"simulate", "--schedule=zb-1p", "--max-activations=65536.001"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-activations=65536.001 is out of range"));
  r = RunCli({"simulate", "--activation-bytes=4611686018427387904"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--activation-bytes=4611686018427387904 is too large; use a byte "
                               "count in [0, 1125899906842624]"));
  // zb-v runs V=2 when --virtual is not given; the message said V=1.
  r = RunCli({"simulate", "--schedule=zb-v", "--stages=4096", "--microbatches=4096"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("P=4096 x V=2 x M=4096 needs about 100663296 actions; the planner "
                               "handles up to 16777216 (P x V x M up to 5592405)"));
  // The generators' own limit: no size the check lets through is refused by them.
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=8", "--microbatches=699051"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("needs about 16777224 actions; the planner handles up to 16777216"));
  const std::string path = WriteTemp("huge_stages.json",
                                     R"({"format": "pipesched-schedule", "version": 1,
                                         "stages": 1099511627776})");
  r = RunCli({"validate", path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("\"stages\" must be an integer in [1, 16777216], got "
                               "1099511627776"));
}

// A file's name is not its order: GPipe's order saved as zb-h1.csv printed zb-h1's
// closed form, 0.1111, next to its simulated 0.2727 (and --json wrote both).
TEST(CliTest, AFilesClosedFormIsItsOrdersNotItsNames) {
  const std::string dir = TempPath("named");
  std::filesystem::create_directories(dir);
  const std::string misnamed = dir + "/zb-h1.csv";
  RunResult r = RunCli({"simulate", "--schedule=gpipe", "--stages=4", "--microbatches=8",
                        "--nogrid", "--csv=" + misnamed});
  ASSERT_EQ(r.code, 0) << r.err;
  r = RunCli({"validate", misnamed, "--nogrid"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("schedule zb-h1 "));
  EXPECT_THAT(r.out, HasSubstr("bubble fraction 0.2727 (simulated)   (no closed form for this "
                               "order and these costs)"));
  const std::string named = dir + "/gpipe.csv";
  r = RunCli({"simulate", "--schedule=gpipe", "--stages=4", "--microbatches=8", "--nogrid",
              "--csv=" + named});
  ASSERT_EQ(r.code, 0) << r.err;
  r = RunCli({"validate", named, "--nogrid"});
  EXPECT_THAT(r.out, HasSubstr("bubble fraction 0.2727 (simulated)   0.2727 (closed form)"));
}

// ZB-H1's closed form was printed where it does not hold (0.0000 against a simulated
// 0.0857 at W=2).
TEST(CliTest, ZbH1PrintsNoClosedFormWhereItDoesNotHold) {
  RunResult r = RunCli({"simulate", "--schedule=zb-h1", "--stages=4", "--microbatches=8",
                        "--cost-w=2", "--cost-b=3", "--nogrid"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bubble fraction 0.0857 (simulated)   (no closed form for this "
                               "order and these costs)"));
  r = RunCli({"simulate", "--schedule=zb-h1", "--stages=4", "--microbatches=8", "--nogrid"});
  EXPECT_THAT(r.out, HasSubstr("bubble fraction 0.1111 (simulated)   0.1111 (closed form)"));
}

// --cost-action-gap: the stream's overhead between two actions of a rank, not before a
// rank's first. GPipe P=2 M=2 (F=1, B=2) takes 9 without; with 0.5:
//   rank 0: F0 [0,1] F1 [1.5,2.5]                  B0 [6,8]     B1 [8.5,10.5]
//   rank 1:     F0 [1,2] F1 [2.5,3.5] B0 [4,6] B1 [6.5,8.5]
// (rank 0's B0 waits for rank 1's, which the gap covers). No closed form has a gap.
TEST(CliTest, SimulateWithAnActionGap) {
  RunResult r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=2",
                        "--cost-action-gap=0.5", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 10.5 "));
  EXPECT_THAT(r.out, HasSubstr("(no closed form for this order and these costs)"));
  r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=2",
              "--cost-action-gap=-1", "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cost-action-gap=-1 is not a valid time; use a number in [0, "));
}

// zb-1p and zb-2p are searched for the costs the flags give: with transfers of 0.5 zb-2p
// reaches the one-step bound 3 x 1.5 + 8 x 3 = 28.5 where zb-h1 takes 33; with unit
// costs both are zb-h1's order (27).
TEST(CliTest, SearchedSchedulesUseTheFlagsCosts) {
  auto makespan = [](const std::string& schedule, std::vector<std::string> more) {
    std::vector<std::string> args = {"simulate", "--nogrid"};
    if (!schedule.empty()) {
      args.insert(args.end(), {"--schedule=" + schedule, "--stages=4", "--microbatches=8"});
    }
    args.insert(args.end(), more.begin(), more.end());
    RunResult r = RunCli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    const std::size_t at = r.out.find("makespan ");
    return at == std::string::npos ? std::string("?")
                                   : r.out.substr(at, r.out.find(' ', at + 9) - at);
  };
  EXPECT_EQ(makespan("zb-2p", {"--cost-comm=0.5"}), "makespan 28.5");
  EXPECT_EQ(makespan("zb-1p", {"--cost-comm=0.5"}), "makespan 33");
  EXPECT_EQ(makespan("zb-h1", {"--cost-comm=0.5"}), "makespan 33");
  EXPECT_EQ(makespan("zb-2p", {}), "makespan 27");
  // --csv writes the searched order (rank 0 runs all eight forwards first), which
  // simulate --from and train --from then run as it is.
  const std::string csv = TempPath("zb2p.csv");
  ASSERT_EQ(RunCli({"simulate", "--schedule=zb-2p", "--stages=4", "--microbatches=8",
                    "--cost-comm=0.5", "--nogrid", "--csv=" + csv})
                .code,
            0);
  EXPECT_THAT(Slurp(csv), ::testing::StartsWith("0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,0I0,"));
  EXPECT_EQ(makespan("", {"--from=" + csv, "--cost-comm=0.5"}), "makespan 28.5");
}

// --max-activations holds the searched schedules to a memory of the user's choice, in
// stages' worth per rank; it is refused where it cannot apply.
TEST(CliTest, MaxActivationsHoldsTheSearchedSchedules) {
  RunResult r = RunCli({"simulate", "--schedule=zb-v-1p", "--stages=4", "--microbatches=16",
                        "--max-activations=3", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 104 "));  // zb-v-half's (52 at equal work)
  r = RunCli({"compare", "--stages=4", "--microbatches=16", "--schedules=zb-v-1p,zb-v",
              "--max-activations=3"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("zb-v-1p            2          52          52"));
  EXPECT_THAT(r.out, HasSubstr("zb-v               2        49.5        49.5"));
  EXPECT_THAT(r.out, HasSubstr("the searched schedules keep at most 3 stages' worth per rank "
                               "(--max-activations)\n"));
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=4", "--microbatches=8",
              "--max-activations=2", "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --max-activations applies to the searched schedules (zb-1p, zb-2p, "
            "zb-v-1p, interleaved-zb-1p, zb-v-half, zb-v-min), not to 1f1b, whose order fixes its "
            "memory; drop the flag or name a searched schedule\n");
  r = RunCli({"simulate", "--schedule=zb-2p", "--stages=4", "--microbatches=8",
              "--max-activations=0.5", "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --max-activations=0.5 is out of range: use 0 (each searched schedule's "
            "own limit) or 1 to 65536 stages' worth of activations per rank\n");
  r = RunCli({"train", "--from=" + Shared("interop/pytorch/2-rank.csv"), "--max-activations=2",
              "--steps=1", "--backend=host"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("not to a schedule file, whose order fixes its memory"));
  // --search-steps was silently unused for an order that is not searched.
  r = RunCli({"train", "--schedule=1f1b", "--search-steps=5", "--steps=1", "--backend=host"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --search-steps applies to the searched schedules (zb-1p, zb-2p, "
            "zb-v-1p, interleaved-zb-1p, zb-v-half, zb-v-min), not to 1f1b, whose order is "
            "given, not searched; drop the flag or name a searched schedule\n");
  r = RunCli({"train", "--from=" + Shared("interop/pytorch/2-rank.csv"), "--search-steps=2",
              "--steps=1", "--backend=host"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--search-steps applies to the searched schedules"));
  EXPECT_THAT(r.err, HasSubstr("not to a schedule file, whose order is given, not searched"));
  // And --momentum with AdamW, whose moments take no momentum: the runs were identical.
  r = RunCli({"train", "--optimizer=adamw", "--momentum=0.5", "--steps=1", "--backend=host"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --momentum is SGD's; --optimizer=adamw keeps its moments with beta1 = "
            "0.9 and beta2 = 0.999: drop --momentum, or use --optimizer=sgd\n");
  // 0 of either is what the run does anyway: a script that always passes it still runs.
  r = RunCli({"train", "--schedule=1f1b", "--optimizer=adamw", "--momentum=0", "--search-steps=0",
              "--steps=1", "--layers=3", "--hidden=16", "--backend=host"});
  EXPECT_EQ(r.code, 0) << r.err;
}

// --refine: the searched order improved by local search, with a line saying by how much;
// any other order with a split backward (a file, a handcrafted one) within its own peak;
// within --device-memory only where the refined order fits too.
TEST(CliTest, RefineImprovesTheSearchedOrderAndSaysByHowMuch) {
  const std::string costs = TempPath("uneven.json");
  std::ofstream(costs) << R"({"version": 1, "stages": [{"f": 1.2, "b": 2.3, "i": 1.4, "w": 0.9},
      {"f": 0.8, "b": 2.0, "i": 1.1, "w": 0.9}, {"f": 1.5, "b": 2.2, "i": 1.5, "w": 0.7},
      {"f": 1.0, "b": 1.8, "i": 1.0, "w": 0.8}], "comm": 0.1})";
  const std::vector<std::string> zb_1p = {"simulate",          "--schedule=zb-1p", "--stages=4",
                                          "--microbatches=12", "--costs=" + costs, "--nogrid"};
  RunResult r = RunCli(WithFlags(zb_1p, {"--refine"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith("zb-1p: --refine shortened the searched order's step "
                                           "from 48.9 to 48.2 (-1.43%)\n"));
  EXPECT_THAT(r.out, HasSubstr("makespan 48.2 "));
  RunResult plain = RunCli(zb_1p);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("makespan 48.9 "));
  // Unit costs: zb-h1's order already meets the one-step bound.
  r = RunCli(
      {"simulate", "--schedule=zb-1p", "--stages=4", "--microbatches=8", "--refine", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith(
                         "zb-1p: --refine found no shorter step than the searched order's 27\n"));
  r = RunCli(
      {"simulate", "--from=" + Shared("interop/pytorch/2-rank.csv"), "--refine", "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith("2-rank: --refine shortened its order's step from 50 "
                                           "to 49 (-2.00%), within its busiest rank's peak of "
                                           "live activations\n"));
  EXPECT_THAT(r.out, HasSubstr("makespan 49 "));
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=4", "--microbatches=8", "--refine"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: cannot refine 1f1b: rank 0 runs 0B0, and the refinement moves only F, I "
            "and W actions; give a schedule whose backward is split into I and W "
            "(scheduler::SplitBackward splits each B)\n");
  // Within a device: the order as searched fits 15 MiB (78.57), the refined one would not.
  const std::string sized = TempPath("sized.json");
  std::ofstream(sized) << R"({"version": 1, "stages": [
      {"f": 1.71, "i": 1.28, "w": 1.21, "b": 2.49, "activation_bytes": 4194304},
      {"f": 1.92, "i": 1.22, "w": 0.86, "b": 2.08, "activation_bytes": 2097152},
      {"f": 1.91, "i": 1.12, "w": 1.66, "b": 2.78, "activation_bytes": 4194304},
      {"f": 1.02, "i": 1.31, "w": 1.32, "b": 2.63, "activation_bytes": 3145728},
      {"f": 1.19, "i": 0.54, "w": 0.61, "b": 1.15, "activation_bytes": 2097152},
      {"f": 1.33, "i": 0.77, "w": 0.36, "b": 1.13, "activation_bytes": 3145728},
      {"f": 0.55, "i": 1.92, "w": 0.33, "b": 2.25, "activation_bytes": 1048576},
      {"f": 1.18, "i": 1.63, "w": 0.71, "b": 2.34, "activation_bytes": 3145728}]})";
  const std::vector<std::string> v_min = {
      "simulate",         "--schedule=zb-v-min",   "--stages=4", "--microbatches=8",
      "--costs=" + sized, "--device-memory=15MiB", "--nogrid"};
  r = RunCli(v_min);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 78.57 "));
  r = RunCli(WithFlags(v_min, {"--refine"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith("zb-v-min: --refine's order peaks above "
                                           "--device-memory=15MiB: kept the searched order\n"));
  EXPECT_THAT(r.out, HasSubstr("makespan 78.57 "));
  // A handcrafted order too: zb-v's refined order would take rank 0 above 40 MiB.
  const std::string zb_v_costs = TempPath("zb_v.json");
  std::ofstream(zb_v_costs) << R"({"version": 1, "stages": [
      {"f": 0.78, "i": 1.71, "w": 1.06, "b": 2.77, "activation_bytes": 6291456},
      {"f": 0.64, "i": 0.96, "w": 0.36, "b": 1.32, "activation_bytes": 1048576,
       "workspace_bytes": 2097152},
      {"f": 1.97, "i": 1.95, "w": 1.38, "b": 3.33, "activation_bytes": 6291456,
       "workspace_bytes": 2097152},
      {"f": 0.74, "i": 0.52, "w": 1.15, "b": 1.67, "activation_bytes": 1048576},
      {"f": 0.79, "i": 0.86, "w": 0.25, "b": 1.11, "activation_bytes": 4194304,
       "workspace_bytes": 1048576},
      {"f": 1.16, "i": 1.76, "w": 1.13, "b": 2.89, "activation_bytes": 3145728,
       "workspace_bytes": 1048576},
      {"f": 0.51, "i": 0.63, "w": 1.38, "b": 2.01, "activation_bytes": 4194304,
       "workspace_bytes": 2097152},
      {"f": 1.99, "i": 1.76, "w": 1.47, "b": 3.23, "activation_bytes": 3145728}],
      "comm": 0.5})";
  r = RunCli({"simulate", "--schedule=zb-v", "--stages=4", "--microbatches=5",
              "--costs=" + zb_v_costs, "--device-memory=40MiB", "--nogrid", "--refine"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith("zb-v: --refine's order peaks above "
                                           "--device-memory=40MiB: kept its order\n"));
  // train with --search-steps=0 runs the order as searched when the refined one does not fit.
  r = RunCli({"train", "--schedule=zb-v-min", "--stages=3", "--microbatches=3",
              "--microbatch-size=8", "--layers=12", "--hidden=64", "--inputs=512", "--classes=512",
              "--steps=1", "--backend=host", "--device-memory=950164", "--search-steps=0",
              "--refine"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("zb-v-min: --refine's order does not fit the devices' memory; "
                               "running the order as searched, which does\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("--search-steps=0: the order searched for unit costs")));
  // Without a memory limit it runs the refined unit-cost order, and says what it bought.
  r = RunCli({"train", "--schedule=zb-v-min", "--stages=3", "--microbatches=3",
              "--microbatch-size=8", "--layers=12", "--hidden=16", "--steps=1", "--backend=host",
              "--search-steps=0", "--refine"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\nzb-v-min: --search-steps=0: the order searched for unit costs, "
                               "with --refine: its unit-cost step 25 -> 23 (-8.00%)\n"));
  r = RunCli({"train", "--schedule=zb-1p", "--stages=2", "--layers=3", "--hidden=16", "--steps=1",
              "--backend=host", "--search-steps=0", "--refine"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\nzb-1p: --search-steps=0: the order searched for unit costs, "
                               "with --refine: no shorter unit-cost step than 25\n"));
  r = RunCli(
      {"train", "--schedule=gpipe", "--stages=2", "--steps=1", "--backend=host", "--refine"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("not to gpipe, whose order is given"));
  // train refines the order it searches for the measured costs.
  r = RunCli({"train", "--schedule=zb-2p", "--stages=2", "--microbatches=4", "--layers=3",
              "--hidden=16", "--steps=1", "--backend=host", "--refine"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("zb-2p: searched and refined (--refine) for the costs measured in "
                               "3 steps of its unit-cost order"));
}

// --recompute in simulate: an F keeps only its received input, B and I run F again. 1F1B
// P=4 M=8, 100 MiB per micro-batch of which 4 MiB is the received input: rank 0 held
// 4 x 100 MiB and now 4 x 4 MiB plus one rebuilt 96 MiB; every B takes F + B = 3.
TEST(CliTest, SimulateWithActivationRecomputation) {
  const std::string stats = TempPath("recompute_stats.json");
  const std::vector<std::string> one_f_one_b = {"simulate",
                                                "--schedule=1f1b",
                                                "--stages=4",
                                                "--microbatches=8",
                                                "--activation-bytes=104857600",
                                                "--input-bytes=4194304",
                                                "--nogrid",
                                                "--json=" + stats};
  RunResult r = RunCli(one_f_one_b);
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(stats));
  EXPECT_EQ(j["makespan"], 33);
  EXPECT_EQ(j["peak_activation_bytes"][0], 4 * 104857600);
  EXPECT_THAT(r.out, Not(HasSubstr("recomputation")));
  r = RunCli(WithFlags(one_f_one_b, {"--recompute"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("activation recomputation: an F keeps only its received input; "
                               "each B or I runs the F again first"));
  j = nlohmann::json::parse(Slurp(stats));
  EXPECT_EQ(j["makespan"], 44);  // 8 x (1 + 3) + 3 x (1 + 3)
  EXPECT_EQ(j["peak_activation_bytes"],
            nlohmann::json::array({4 * 4194304 + 100663296, 4 * 4194304 + 100663296,
                                   3 * 4194304 + 100663296, 2 * 4194304 + 100663296}));
  // A cost file measured with recomputation has it already.
  const std::string measured = TempPath("recomputed_costs.json");
  std::ofstream(measured) << R"({"default": {"f": 1, "b": 3, "i": 2, "w": 1,
      "activation_bytes": 4096, "recompute_bytes": 65536}})";
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4",
              "--costs=" + measured, "--nogrid", "--recompute"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "pipesched: " + measured +
                       ": the default costs recompute already (recompute_bytes 65536: measured "
                       "with recomputation, its B and I include the second forward); leave out "
                       "--recompute\n");
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4",
              "--costs=" + measured, "--nogrid", "--json=" + stats});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("activation recomputation"));
  j = nlohmann::json::parse(Slurp(stats));
  EXPECT_EQ(j["peak_activation_bytes"][0], 2 * 4096 + 65536);
}

// --recompute-stages: some stages recompute, listed or chosen (auto) to fit the device.
// Recomputation without activation sizes rebuilds nothing, but its B and I still run F
// again: the output says so, the JSON lists the stages, and a file written from it keeps
// it (so that recomputing again is refused, as for a measured file).
TEST(CliTest, RecomputationWithoutSizesIsStillSaidAndKept) {
  const std::string json = TempPath("recompute_unsized.json");
  const std::string saved = TempPath("recompute_unsized_schedule.json");
  RunResult r = RunCli({"simulate", "--recompute-stages=0", "--nogrid", "--json=" + json,
                        "--schedule-json=" + saved});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 38 "));  // 33 without: stage 0's B takes F longer
  EXPECT_THAT(r.out, HasSubstr("activation recomputation on stage 0 of 4: "));
  EXPECT_EQ(nlohmann::json::parse(Slurp(json))["recompute_stages"], nlohmann::json::array({0}));
  EXPECT_THAT(Slurp(saved), HasSubstr("\"recompute\": true"));
  r = RunCli({"simulate", "--from=" + saved, "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 38 "));
  EXPECT_THAT(r.out, HasSubstr("activation recomputation on stage 0 of 4: "));
  r = RunCli({"simulate", "--from=" + saved, "--nogrid", "--recompute"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("stage 0's costs recompute already (\"recompute\": true, its B "
                               "and I include the second forward); leave out --recompute"));
  r = RunCli({"compare", "--recompute", "--schedules=1f1b,gpipe"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("with activation recomputation"));
  const std::string contradiction = WriteTemp(
      "recompute_false.json", R"({"default": {"recompute": false, "recompute_bytes": 5}})");
  r = RunCli({"simulate", "--costs=" + contradiction, "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("default has recompute_bytes 5 but \"recompute\": false"));
}

// A closed form of 0 (one rank) prints as 0, not "-0", and so does a time given as -0.
TEST(CliTest, NoNegativeZeros) {
  const std::string json = TempPath("no_negative_zero.json");
  const std::string saved = TempPath("no_negative_zero_schedule.json");
  RunResult r =
      RunCli({"simulate", "--schedule=zb-h1", "--stages=1", "--microbatches=3", "--cost-w=5",
              "--cost-b=6", "--cost-comm=-0", "--cost-zero-grad=-0", "--cost-action-gap=-0",
              "--nogrid", "--json=" + json, "--schedule-json=" + saved});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(" 0.0000 (closed form)"));
  EXPECT_THAT(r.out, Not(HasSubstr("-0")));
  EXPECT_THAT(Slurp(json), Not(HasSubstr(": -0")));
  // The times as given, written into the schedule's cost model.
  EXPECT_THAT(Slurp(saved), HasSubstr("\"comm\": 0.0"));
  EXPECT_THAT(Slurp(saved), Not(HasSubstr("-0")));
}

TEST(CliTest, SimulateRecomputesTheStagesThatNeedIt) {
  const std::vector<std::string> one_f_one_b = {
      "simulate",         "--schedule=1f1b",        "--stages=4",
      "--microbatches=8", "--activation-bytes=100", "--input-bytes=10",
      "--nogrid"};
  const std::string plan_json = TempPath("recompute_plan.json");
  RunResult r = RunCli(WithFlags(
      one_f_one_b, {"--device-memory=250", "--recompute-stages=auto", "--json=" + plan_json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith(
                         "1f1b: recomputing stages 0,1 of 4 fits --device-memory=250: the busiest "
                         "rank peaks at 210 B instead of 400 B; step 40 instead of 33 (+21.21%) "
                         "(--recompute-stages=0,1); of every set that fits, the shortest step\n"));
  EXPECT_THAT(r.out, HasSubstr("activation recomputation on stages 0,1 of 4: "));
  EXPECT_THAT(r.out, HasSubstr("makespan 40 "));
  // --json says what auto chose and what it compared.
  nlohmann::json plan = nlohmann::json::parse(Slurp(plan_json))["recompute_plan"];
  EXPECT_EQ(plan["stages"], nlohmann::json::array({0, 1}));
  EXPECT_DOUBLE_EQ(plan["step_time_without"].get<double>(), 33);
  EXPECT_DOUBLE_EQ(plan["step_time_with"].get<double>(), 40);
  EXPECT_EQ(plan["peak_bytes_without"][0], 400);  // 1F1B: 4 stashes of 100 B on rank 0
  EXPECT_EQ(plan["peak_bytes_with"].size(), 4u);
  EXPECT_EQ(*std::max_element(plan["peak_bytes_with"].begin(), plan["peak_bytes_with"].end()), 210);
  EXPECT_EQ(plan["exhaustive"], true);
  // 16 stages on ranks that do not fit: too many sets to try, the greedy rule says so.
  RunResult many =
      RunCli({"simulate", "--schedule=interleaved-1f1b", "--stages=8", "--virtual=2",
              "--microbatches=16", "--activation-bytes=100", "--input-bytes=10", "--nogrid",
              "--device-memory=1000", "--recompute-stages=auto", "--json=" + plan_json});
  ASSERT_EQ(many.code, 0) << many.err;
  plan = nlohmann::json::parse(Slurp(plan_json))["recompute_plan"];
  EXPECT_EQ(plan["stages"], nlohmann::json::array({0, 1, 2, 3, 4, 5, 6, 8, 9}));
  EXPECT_EQ(plan["exhaustive"], false);
  EXPECT_THAT(many.out,
              ::testing::StartsWith("interleaved-1f1b: recomputing stages 0,1,2,3,4,5,6,8,9 of 16 "
                                    "fits --device-memory=1000: the busiest rank peaks at 1000 B "
                                    "instead of 2.3 KiB; step 139 instead of 117 (+18.80%) "
                                    "(--recompute-stages=0,1,2,3,4,5,6,8,9); chosen greedily, not "
                                    "proven the shortest step\n"));
  r = RunCli(WithFlags(one_f_one_b, {"--device-memory=400", "--recompute-stages=auto"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::StartsWith(
                         "1f1b: fits --device-memory=400 without recomputing any stage\n"));
  const std::string stats = TempPath("recompute_stages.json");
  r = RunCli(WithFlags(one_f_one_b, {"--recompute-stages=0,1", "--json=" + stats}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 40 "));
  EXPECT_EQ(nlohmann::json::parse(Slurp(stats))["recompute_stages"], nlohmann::json::array({0, 1}));
  r = RunCli(WithFlags(one_f_one_b, {"--recompute-stages=2", "--json=" + stats}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("activation recomputation on stage 2 of 4: "));
  EXPECT_EQ(nlohmann::json::parse(Slurp(stats))["recompute_stages"], nlohmann::json::array({2}));
  // Without activation sizes the costs carry no recompute bytes, but the stages still
  // recompute (their B takes F longer): the list says so (it was empty).
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4", "--nogrid",
              "--recompute", "--json=" + stats});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 20 "));  // 15 without
  EXPECT_EQ(nlohmann::json::parse(Slurp(stats))["recompute_stages"], nlohmann::json::array({0, 1}));
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4", "--nogrid",
              "--recompute-stages=1", "--json=" + stats});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(Slurp(stats))["recompute_stages"], nlohmann::json::array({1}));
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--device-memory=100", "--recompute-stages=auto"},
       "pipesched: rank 0 does not fit in 100 B per device even with every stage of it "
       "recomputing its activations: it peaks at 130 B (0 B of it parameters, gradients and "
       "optimizer state); give more memory, smaller activations or more stages\n"},
      {{"--recompute-stages=auto"},
       "pipesched: --recompute-stages=auto chooses the stages that make each rank fit "
       "--device-memory: give --device-memory, or list the stages\n"},
      {{"--recompute-stages=4"},
       "pipesched: cannot recompute stage 4: the schedule has stages 0 to 3 (P x V)\n"},
      {{"--recompute-stages=0,x"},
       "pipesched: --recompute-stages=0,x: 'x' is not an integer; write e.g. 2,4\n"},
      {{"--recompute-stages=0", "--recompute"},
       "pipesched: give --recompute (every stage) or --recompute-stages (some), not both\n"}};
  for (const auto& [flags, err] : bad) {
    r = RunCli(WithFlags(one_f_one_b, flags));
    EXPECT_EQ(r.code, 2) << flags.back();
    EXPECT_EQ(r.err, err);
  }
  r = RunCli({"simulate", "--schedule=zb-1p", "--stages=4", "--microbatches=8", "--nogrid",
              "--recompute-stages=0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--recompute-stages applies to orders that are given, not to "
                               "zb-1p, which is searched for costs without it"));
}

// train --recompute trains the same numbers in less activation memory: rank 0 of 1F1B
// P=2 holds two micro-batches' stashes without it, one rebuilt stash with it.
TEST(CliTest, TrainWithActivationRecomputation) {
  const std::string with_json = TempPath("train_rc.json");
  const std::string without_json = TempPath("train_no_rc.json");
  const std::vector<std::string> train = {
      "train",       "--schedule=1f1b", "--stages=2",     "--microbatches=4", "--layers=4",
      "--hidden=32", "--steps=2",       "--backend=host", "--seed=5"};
  RunResult r = RunCli(WithFlags(train, {"--recompute", "--json=" + with_json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("activation recomputation: a stage keeps only the micro-batch's "
                               "input and boundary buffers from its F to its backward"));
  r = RunCli(WithFlags(train, {"--json=" + without_json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("recomputation")));
  const nlohmann::json with = nlohmann::json::parse(Slurp(with_json));
  const nlohmann::json without = nlohmann::json::parse(Slurp(without_json));
  EXPECT_EQ(with["recompute"], true);
  EXPECT_EQ(without["recompute"], false);
  EXPECT_EQ(with["losses"], without["losses"]);
  EXPECT_LT(with["ranks"][0]["planned_peak_activation_bytes"].get<std::int64_t>(),
            without["ranks"][0]["planned_peak_activation_bytes"].get<std::int64_t>());
  EXPECT_EQ(with["recompute_stages"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(without["recompute_stages"], nlohmann::json::array());
  // Some stages only: stage 0, the one that holds two micro-batches.
  r = RunCli(WithFlags(train, {"--recompute-stages=0", "--json=" + with_json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("activation recomputation on stage 0 of 2: "));
  const nlohmann::json some = nlohmann::json::parse(Slurp(with_json));
  EXPECT_EQ(some["recompute_stages"], nlohmann::json::array({0}));
  EXPECT_EQ(some["losses"], without["losses"]);
  EXPECT_EQ(some["ranks"][1]["planned_peak_activation_bytes"],
            without["ranks"][1]["planned_peak_activation_bytes"]);
  // auto: in a device size that rank 0's two stashes do not fit but one rebuilt one does,
  // stage 0 alone recomputes; rank 1 fits as it is.
  r = RunCli(WithFlags(
      train, {"--recompute-stages=auto", "--device-memory=64MiB", "--json=" + with_json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--recompute-stages=auto: no stage needs to recompute; planned "
                               "activations of what each memory has for them: host:0 "));
  const nlohmann::json roomy = nlohmann::json::parse(Slurp(with_json));
  EXPECT_EQ(roomy["recompute_stages"], nlohmann::json::array());
  std::vector<std::int64_t> state(2);
  for (const nlohmann::json& place : roomy["recompute_plan"]["places"]) {
    for (int rank = 0; rank < 2; ++rank) {
      if (place["name"] == "host:" + std::to_string(rank)) {
        state[rank] = 64 * (std::int64_t{1} << 20) - place["available_bytes"].get<std::int64_t>();
        EXPECT_EQ(place["planned_bytes_without"],
                  without["ranks"][rank]["planned_peak_activation_bytes"]);
      }
    }
  }
  ASSERT_GT(state[0], 0);
  ASSERT_GT(state[1], 0);
  const std::int64_t rebuilt0 = with["ranks"][0]["planned_peak_activation_bytes"];
  const std::int64_t plain0 = without["ranks"][0]["planned_peak_activation_bytes"];
  const std::int64_t plain1 = without["ranks"][1]["planned_peak_activation_bytes"];
  const std::int64_t size = std::max(state[0] + rebuilt0, state[1] + plain1);
  ASSERT_LT(size, state[0] + plain0);
  r = RunCli(WithFlags(train, {"--recompute-stages=auto", "--device-memory=" + std::to_string(size),
                               "--json=" + with_json}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--recompute-stages=auto: recomputing stage 0 of 2 (of every set "
                               "that fits, the shortest step); "));
  EXPECT_THAT(r.out, HasSubstr("activation recomputation on stage 0 of 2: "));
  const nlohmann::json chosen = nlohmann::json::parse(Slurp(with_json));
  EXPECT_EQ(chosen["recompute_stages"], nlohmann::json::array({0}));
  EXPECT_EQ(chosen["recompute_plan"]["peak_bytes_with"], nlohmann::json::array({rebuilt0, plain1}));
  EXPECT_EQ(chosen["recompute_plan"]["exhaustive"], true);
  EXPECT_EQ(chosen["losses"], without["losses"]);
  // A schedule searched after the choice would change the order it was made for.
  r = RunCli({"train", "--schedule=zb-1p", "--stages=2", "--microbatches=4", "--layers=4",
              "--hidden=32", "--steps=1", "--backend=host", "--recompute-stages=auto",
              "--device-memory=64MiB"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --recompute-stages=auto chooses for the order that will run, and zb-1p's "
            "is searched afterwards for the costs its first steps measure (and fits the "
            "devices' memory by its own search): give --search-steps=0 to run its unit-cost "
            "order, or a --recompute-stages list\n");
  r = RunCli({"train", "--schedule=zb-1p", "--stages=2", "--microbatches=4", "--layers=4",
              "--hidden=32", "--steps=1", "--backend=host", "--recompute-stages=auto",
              "--device-memory=64MiB", "--search-steps=0"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--recompute-stages=auto: no stage needs to recompute"));
  r = RunCli(WithFlags(train, {"--recompute-stages=2"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot recompute stage 2: the pipeline has stages 0 to 1"));
}

// GPipe P=2 M=2 (makespan 9): zeroing gradients in 0.5 before and an optimizer step of
// 1.5 after make a step of 11; the bubble is the schedule's, closed form included.
TEST(CliTest, SimulateAWholeStepWithZeroGradAndOptimizer) {
  const std::string stats = TempPath("step_stats.json");
  RunResult r =
      RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=2",
              "--cost-zero-grad=0.5", "--cost-optimizer=1.5", "--nogrid", "--json=" + stats});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("makespan 9   bubble fraction 0.3333 (simulated)   0.3333 "
                               "(closed form)"));
  EXPECT_THAT(r.out, HasSubstr("step time 11   (makespan + zero-grad before + optimizer after)"));
  // The grid draws the whole step.
  r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=2",
              "--cost-zero-grad=0.5", "--cost-optimizer=1.5", "--color=never"});
  EXPECT_THAT(r.out, HasSubstr("(simulated), whole step: step time 11 unit"));
  EXPECT_THAT(r.out, HasSubstr("Z zero gradients  O optimizer step"));
  EXPECT_EQ(nlohmann::json::parse(Slurp(stats))["step_time"].get<double>(), 11);
  r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=2", "--nogrid"});
  EXPECT_THAT(r.out, Not(HasSubstr("step time")));  // only when there is more than the makespan
  r = RunCli({"simulate", "--schedule=gpipe", "--stages=2", "--microbatches=2",
              "--cost-optimizer=-1", "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cost-optimizer=-1 is not a valid time; use a number in [0, "));
}

// Costs of 1e-320 printed "1 column = 0 unit" over a broken one-column grid.
TEST(CliTest, TinyCostsDrawAGrid) {
  RunResult r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=2",
                        "--cost-f=1e-320", "--cost-b=1e-320"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("= 0 unit")));
  EXPECT_THAT(r.out, HasSubstr("rank 0 | F0 "));
  EXPECT_THAT(r.out, HasSubstr("bubble fraction 0.3333 (simulated)"));
}

// PyTorch semantics for lowered transfers: rank 0 waits for B0's gradient before it
// sends F0's activation. It used to validate (exit 0).
TEST(CliTest, ValidateRejectsTransfersThatDeadlockOrDoNotMatch) {
  RunResult r = RunCli({"validate", WriteTemp("dl.csv",
                                              "0RECV_B0,0F0,0SEND_F0,0B0\n"
                                              "1RECV_F0,1F0,1B0,1SEND_B0\n")});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("deadlock: no rank can run its next action; rank 0 blocked at "
                               "0RECV_B0 (waits for 1SEND_B0 on rank 1)"));
  r = RunCli({"validate", WriteTemp("nomatch.csv", "0F0,0SEND_F0,0B0\n1F0,1B0\n")});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("action 0SEND_F0 has no matching receive: missing action 1RECV_F0 "
                               "on rank 1"));
  r = RunCli(
      {"validate", WriteTemp("dupsend.csv", "0F0,0SEND_F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n")});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("action 0SEND_F0 is a duplicate"));
  r = RunCli({"validate",
              WriteTemp("lowered.csv",
                        "0F0,0SEND_F0,0RECV_B0,0B0\n"
                        "1RECV_F0,1F0,1B0,1SEND_B0\n"),
              "--nogrid"});
  EXPECT_EQ(r.code, 0) << r.err;
}

// File text in messages is short and on one line.
TEST(CliTest, ErrorsQuoteFileTextShortAndEscaped) {
  RunResult r = RunCli({"validate", WriteTemp("long_token.csv", std::string(10'000'000, 'x'))});
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.err.size(), 500u);
  EXPECT_EQ(CountLines(r.err), 1);
  r = RunCli({"validate", WriteTemp("cr.csv", "0F0,0B0\r1F0,1B0\r")});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("bad action \"0B0\\r1F0\""));
  EXPECT_EQ(CountLines(r.err), 1);
  // 100000 ranks with a duplicate on the last: the grid shows the 21 rows around it.
  std::string tall;
  for (int rank = 0; rank < 100000; ++rank) {
    tall += std::to_string(rank) + "F0," + std::to_string(rank) + "B0\n";
  }
  tall.insert(tall.size() - 1, ",99999B0");
  r = RunCli({"validate", WriteTemp("tall.csv", tall)});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("action 99999B0 is a duplicate"));
  EXPECT_THAT(r.err, HasSubstr("... 99979 ranks above not shown"));
  EXPECT_LT(CountLines(r.err), 30);
}

TEST(CliTest, HelpListsTheCommandsAndEachCommandsFlags) {
  RunResult all = RunCli({"help"});
  EXPECT_EQ(all.code, 0);
  for (const char* name : {"schedules", "simulate", "validate", "train", "bench", "version"}) {
    EXPECT_THAT(all.out, HasSubstr(std::string("\n  ") + name + "\t")) << name;
  }
  EXPECT_EQ(RunCli({"--help"}).out, all.out);
  EXPECT_EQ(RunCli({"help", "help"}).out, all.out);
  RunResult train = RunCli({"help", "train"});
  EXPECT_EQ(train.code, 0);
  // Every flag is optional: the usage gives the defaults, in brackets.
  EXPECT_THAT(train.out,
              ::testing::StartsWith("usage: pipesched train [--schedule=1f1b --stages=4]"));
  EXPECT_THAT(train.out, HasSubstr("[--microbatch-size=16 --layers=8 --hidden=256"));
  EXPECT_THAT(train.out, HasSubstr("[--from=SCHEDULE_FILE]"));
  // --help anywhere after the command, even after other flags.
  EXPECT_EQ(RunCli({"train", "--help"}).out, train.out);
  RunResult bench = RunCli({"bench", "--stages=2", "-h"});
  EXPECT_EQ(bench.code, 0);
  EXPECT_THAT(bench.out, ::testing::StartsWith("usage: pipesched bench"));
  // No command at all: the usage, on stderr, exit 2.
  RunResult none = RunCli({});
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.out, "");
  EXPECT_THAT(none.err, HasSubstr("usage: pipesched <command> [--flags]"));
}

// A file name is any bytes: one that is not UTF-8 (the schedule's name) made nlohmann's
// dump() throw, and the program abort, when a JSON output was asked for.
TEST(CliTest, NamesThatAreNotUtf8StillWriteJson) {
  const std::string csv =
      TempPath(std::string("x\xff"
                           "y.csv"));
  std::ofstream(csv) << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  const std::string json = TempPath("not-utf8.json"), schedule = TempPath("not-utf8-s.json");
  RunResult r = RunCli(
      {"simulate", "--from=" + csv, "--json=" + json, "--schedule-json=" + schedule, "--nogrid"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json stats = nlohmann::json::parse(Slurp(json));
  EXPECT_EQ(stats["schedule"], "pipesched_cli_x\xEF\xBF\xBDy");  // U+FFFD
  RunResult again = RunCli({"validate", schedule, "--nogrid"});
  EXPECT_EQ(again.code, 0) << again.err;
}

// An output that is an input (or another output) would destroy it: a data set replaced
// by a checkpoint, a schedule by its statistics.
TEST(CliTest, OutputsThatAreInputsAreRefused) {
  const std::string csv = TempPath("in.csv");
  std::ofstream(csv) << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  const std::string json = TempPath("twice.json");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } const cases[] = {
      {{"simulate", "--from=" + csv, "--json=" + csv},
       "--json=" + csv +
           " is also --from: writing it would replace that input; give --json "
           "another path"},
      {{"validate", csv, "--json=" + csv}, "--json=" + csv + " is also the schedule file"},
      {{"simulate", "--json=" + json, "--trace=" + json},
       "--json=" + json + " is also --trace: one would overwrite the other"},
  };
  for (const Case& c : cases) {
    RunResult r = RunCli(c.args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
  EXPECT_EQ(Slurp(csv), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  // A data set is not replaced by a checkpoint; the parameters file may be (in place).
  model::Dataset data{.d_in = 4, .num_classes = 2};
  data.x.assign(64 * 4, 0.5f);
  data.y.assign(64, 1);
  const std::string set = TempPath("set.safetensors");
  ASSERT_TRUE(model::SaveDataset(set, data).ok());
  const std::vector<std::string> tiny = {"train",      "--stages=1",          "--layers=2",
                                         "--hidden=8", "--inputs=4",          "--classes=2",
                                         "--steps=1",  "--microbatch-size=2", "--backend=host"};
  auto train = [&](std::vector<std::string> more) {
    std::vector<std::string> args = tiny;
    args.insert(args.end(), more.begin(), more.end());
    return RunCli(args);
  };
  RunResult d = train({"--data=" + set, "--save=" + set});
  EXPECT_EQ(d.code, 2);
  EXPECT_THAT(d.err, HasSubstr("--save=" + set + " is also --data"));
  const std::string params = TempPath("params.safetensors");
  ASSERT_EQ(train({"--save=" + params}).code, 0);
  RunResult in_place = train({"--init=" + params, "--save=" + params});
  EXPECT_EQ(in_place.code, 0) << in_place.err;
  RunResult report = train({"--init=" + params, "--json=" + params});
  EXPECT_EQ(report.code, 2);
  EXPECT_THAT(report.err, HasSubstr("--json=" + params + " is also --init"));
}

// --color=auto colours the grid on a terminal, unless NO_COLOR is set (no-color.org).
TEST(CliTest, ColorAutoFollowsTheTerminalAndNoColor) {
  auto run_on_terminal = [] {
    std::vector<std::string> args = {"pipesched", "simulate", "--stages=2", "--microbatches=2"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    absl::FlagSaver saver;
    std::ostringstream out, err;
    EXPECT_EQ(RunMain(static_cast<int>(argv.size()), argv.data(), out, err, true), 0) << err.str();
    return out.str();
  };
  const char* before = std::getenv("NO_COLOR");
  const std::string saved = before == nullptr ? "" : before;
  unsetenv("NO_COLOR");
  EXPECT_THAT(run_on_terminal(), HasSubstr("\x1b["));
  setenv("NO_COLOR", "", 1);  // empty: as if unset
  EXPECT_THAT(run_on_terminal(), HasSubstr("\x1b["));
  setenv("NO_COLOR", "1", 1);
  EXPECT_THAT(run_on_terminal(), Not(HasSubstr("\x1b[")));
  EXPECT_THAT(RunCli({"simulate", "--stages=2", "--microbatches=2"}).out, Not(HasSubstr("\x1b[")));
  if (before == nullptr) {
    unsetenv("NO_COLOR");
  } else {
    setenv("NO_COLOR", saved.c_str(), 1);
  }
}

TEST(CliTest, MalformedFilesAreBadInput) {
  struct Case {
    std::string content;
    std::string message;
  } const cases[] = {
      {"", "empty"},
      {"0F0,0X0\n", "0X0"},
      {"0F0,0B0\n1F0\n", "1B0"},  // missing action
      {"0F0,0F0,0B0\n", "0F0"},   // duplicate
      // A stage on two ranks (a stage on any one rank is an explicit placement).
      {"0F0,0F1,1B0\n1F0,1F1,0B0\n", "stage 1 has actions on two ranks"},
  };
  int i = 0;
  for (const Case& c : cases) {
    std::string path = WriteTemp("bad" + std::to_string(i++) + ".csv", c.content);
    RunResult r = RunCli({"validate", path});
    EXPECT_EQ(r.code, 2) << c.content;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.content;
  }
}

}  // namespace
}  // namespace pipesched::cli

namespace pipesched::cli {
namespace {

// --save-costs writes what train measured as a cost file: simulate with it and the same
// schedule gives train's "+hand-off" plan to the last digit, with another schedule of the
// same P x V a prediction for this machine, with another P x V a one-line error.
TEST(CliTrainTest, SavedCostsReproduceThePlanInSimulate) {
  const std::string costs = TempPath("measured_costs.json"), json = TempPath("costs_train.json"),
                    stats = TempPath("costs_sim.json"), trace = TempPath("costs_trace.json");
  RunResult r =
      RunCli({"train", "--schedule=zb-v", "--stages=2", "--microbatches=4", "--microbatch-size=4",
              "--layers=3", "--hidden=16", "--inputs=8", "--classes=4", "--steps=3",
              "--backend=host", "--json=" + json, "--save-costs=" + costs, "--trace=" + trace});
  ASSERT_EQ(r.code, 0) << r.err;
  // The trace draws whole steps, planned and measured: each of the 4 stages' zero-grad
  // and optimizer step, from the first zero-grad.
  int zero_grads = 0, optimizer_steps = 0;
  std::set<std::string> processes;
  const nlohmann::json events = nlohmann::json::parse(Slurp(trace))["traceEvents"];
  for (const nlohmann::json& e : events) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      processes.insert(e["args"]["name"].get<std::string>());
    }
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["ts"].get<double>(), 0) << e.dump();
    if (e["cat"] != "step") continue;
    const std::string name = e["name"].get<std::string>();
    zero_grads += name.find("ZERO_GRAD") != std::string::npos;
    optimizer_steps += name.find("OPTIMIZER") != std::string::npos;
  }
  EXPECT_EQ(optimizer_steps, 2 * 4);
  EXPECT_EQ(zero_grads, 2 * 4);
  EXPECT_THAT(absl::StrJoin(processes, "|"), HasSubstr("(measured, last step), whole step"));
  EXPECT_THAT(r.out, HasSubstr("wrote " + costs + " (measured costs in us, for simulate --costs)"));
  const nlohmann::json file = nlohmann::json::parse(Slurp(costs));
  ASSERT_EQ(file["stages"].size(), 4u);  // P x V virtual stages
  EXPECT_EQ(file["comm"].size(), 3u);    // their boundaries
  EXPECT_EQ(file["time_unit"], "us");
  // The measured gap, as train's JSON reports it (written only when there is one).
  const nlohmann::json gap = nlohmann::json::parse(Slurp(json))["action_gap_us"];
  if (!gap.is_null() && gap.get<double>() > 0) {
    EXPECT_EQ(file["action_gap"].get<double>(), gap.get<double>());
  } else {
    EXPECT_FALSE(file.contains("action_gap"));
  }
  // Each chunk's parameters, gradients and SGD momentum, fp32: blocks 8x16+16, 16x16+16
  // twice, head 16x4+4 = 756 parameters, 3 x 4 bytes each in all.
  std::int64_t static_bytes = 0;
  for (const nlohmann::json& stage : file["stages"]) {
    static_bytes += stage["static_bytes"].get<std::int64_t>();
  }
  EXPECT_EQ(static_bytes, 756 * 3 * 4);
  for (const nlohmann::json& stage : file["stages"]) {
    EXPECT_GT(stage["f"].get<double>(), 0);
    EXPECT_GT(stage["activation_bytes"].get<std::int64_t>(), 0);
    EXPECT_GT(stage.value("optimizer", -1.0), 0);  // the measured per-step work
    EXPECT_GE(stage.value("zero_grad", -1.0), 0);
  }
  const std::string sim_trace = TempPath("costs_sim_trace.json");
  r = RunCli({"simulate", "--schedule=zb-v", "--stages=2", "--microbatches=4", "--costs=" + costs,
              "--json=" + stats, "--nogrid", "--trace=" + sim_trace});
  ASSERT_EQ(r.code, 0) << r.err;
  // Drawn in the file's unit: the trace's times are the costs' microseconds, 1:1.
  EXPECT_THAT(nlohmann::json::parse(Slurp(sim_trace))["otherData"].dump(),
              HasSubstr("(time in us)"));
  const double plan =
      nlohmann::json::parse(Slurp(json))["planned_with_handoff_bubble_fraction"].get<double>();
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(Slurp(stats))["bubble_fraction"].get<double>(), plan);
  // ... and the whole step's time (makespan + zero-grad + optimizer), in us there.
  const double step_ms =
      nlohmann::json::parse(Slurp(json))["planned_with_handoff_step_ms"].get<double>();
  const double step_us = nlohmann::json::parse(Slurp(stats))["step_time"].get<double>();
  EXPECT_NEAR(step_us, 1000 * step_ms, 1e-9 * step_us);
  EXPECT_GT(step_us, nlohmann::json::parse(Slurp(stats))["makespan"].get<double>());
  r = RunCli({"simulate", "--schedule=interleaved-1f1b", "--virtual=2", "--stages=2",
              "--microbatches=4", "--costs=" + costs, "--nogrid"});
  EXPECT_EQ(r.code, 0) << r.err;
  r = RunCli({"simulate", "--schedule=1f1b", "--stages=2", "--microbatches=4", "--costs=" + costs,
              "--nogrid"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("\"stages\" has 4 entries but the schedule has 2 virtual stages"));
}

TEST(CliTrainTest, TrainsAndReportsMeasuredAndPlannedBubble) {
  std::string json_path = TempPath("train.json");
  std::string save_path = TempPath("train.safetensors");
  std::string svg_path = TempPath("train.svg");
  RunResult r =
      RunCli({"train", "--schedule=1f1b", "--stages=2", "--microbatches=4", "--microbatch-size=4",
              "--layers=3", "--hidden=16", "--inputs=8", "--classes=4", "--steps=30", "--lr=0.2",
              "--backend=host", "--json=" + json_path, "--save=" + save_path, "--svg=" + svg_path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 30/30"));
  EXPECT_THAT(r.out, HasSubstr("bubble fraction: measured"));
  EXPECT_THAT(r.out, HasSubstr("wrote " + save_path));
  nlohmann::json j = nlohmann::json::parse(Slurp(json_path));
  ASSERT_EQ(j["losses"].size(), 30u);
  EXPECT_LT(j["losses"][29].get<double>(), 0.9 * j["losses"][0].get<double>());
  EXPECT_EQ(j["global_batch"], 16);
  EXPECT_EQ(j["ranks"].size(), 2u);
  double planned = j["planned_bubble_fraction"].get<double>();
  EXPECT_GE(planned, 0.0);
  EXPECT_LT(planned, 1.0);
  double with_handoff = j["planned_with_handoff_bubble_fraction"].get<double>();
  EXPECT_GE(with_handoff, 0.0);
  EXPECT_LT(with_handoff, 1.0);
  // The expected bubble over the last step's spread of durations (1F1B at P=2 always has
  // one), printed as the JSON says.
  const double spread = j["planned_spread_bubble_fraction"].get<double>();
  EXPECT_GT(spread, 0.0);
  EXPECT_LT(spread, 1.0);
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("%.4f expected with the last step's spread of "
                                               "durations",
                                               spread)));
  // The last step replayed with its own action durations: each rank is busy exactly as
  // measured, so the replay lasts at least as long as the busiest rank's compute.
  const double replayed = j["last_step_replayed_bubble_fraction"].get<double>();
  EXPECT_GE(replayed, 0.0);
  EXPECT_LT(replayed, 1.0);
  double busiest_us = 0;
  for (const nlohmann::json& rank : j["ranks"]) {
    busiest_us = std::max(busiest_us, rank["measured_busy_us"].get<double>());
  }
  EXPECT_GE(j["last_step_replayed_makespan_ms"].get<double>() * 1000, busiest_us * (1 - 1e-9));
  EXPECT_LE(j["last_step_makespan_ms"].get<double>(), j["last_step_ms"].get<double>());
  // The picture draws the last step, and its headline's measured bubble is that step's.
  EXPECT_THAT(Slurp(svg_path), HasSubstr(absl::StrFormat(
                                   "measured %.1f%% (the last step, drawn)",
                                   100 * j["last_step_measured_bubble_fraction"].get<double>())));
  // The medians are of steps 2-30 (the first, a warm-up, left out), as the output says.
  EXPECT_EQ(j["median_of_steps"], nlohmann::json({2, 30}));
  {
    std::vector<double> counted = j["step_ms"].get<std::vector<double>>();
    ASSERT_EQ(counted.size(), 30u);
    counted.erase(counted.begin());
    std::sort(counted.begin(), counted.end());
    EXPECT_DOUBLE_EQ(j["median_step_ms"].get<double>(), counted[14]);  // 29 steps
  }
  EXPECT_THAT(r.out, HasSubstr("samples/s (steps 2-30); loss "));
  // Whole steps: the plan's and the replay's add the zero-grads and optimizer steps (the
  // MLP's SGD takes real time) to their makespans.
  const double planned_step = j["planned_step_ms"].get<double>();
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat(
                         "(median over steps 2-%d); planned %.3f ms, %.3f with "
                         "the hand-offs and gaps",
                         30, planned_step, j["planned_with_handoff_step_ms"].get<double>())));
  EXPECT_GT(j["last_step_replayed_step_ms"].get<double>(),
            j["last_step_replayed_makespan_ms"].get<double>());
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat(
                         "replayed %.3f ms (with its own zero-grads and optimizer steps)",
                         j["last_step_replayed_step_ms"].get<double>())));
  // Memory: the ranks' parameters, gradients and SGD momentum add up to the model's 756
  // parameters (8 x 16 + 16, 2 x (16 x 16 + 16), 16 x 4 + 4) x 3 buffers x 4 bytes; 1F1B
  // plans two micro-batches in flight on rank 0, one on rank 1.
  EXPECT_EQ(j["ranks"][0]["state_bytes"].get<std::int64_t>() +
                j["ranks"][1]["state_bytes"].get<std::int64_t>(),
            756 * 3 * 4);
  EXPECT_GT(j["ranks"][0]["planned_peak_activation_bytes"].get<std::int64_t>(),
            j["ranks"][1]["planned_peak_activation_bytes"].get<std::int64_t>());
  EXPECT_GT(j["ranks"][1]["planned_peak_activation_bytes"].get<std::int64_t>(), 0);
  EXPECT_THAT(r.out, HasSubstr("memory per rank: parameters, gradients and optimizer state "));
  // Resuming from the saved parameters starts where training ended.
  RunResult again =
      RunCli({"train", "--schedule=gpipe", "--stages=2", "--microbatches=4", "--microbatch-size=4",
              "--layers=3", "--hidden=16", "--inputs=8", "--classes=4", "--steps=1",
              "--backend=host", "--init=" + save_path, "--json=" + json_path});
  ASSERT_EQ(again.code, 0) << again.err;
  nlohmann::json k = nlohmann::json::parse(Slurp(json_path));
  EXPECT_LT(k["losses"][0].get<double>(), j["losses"][0].get<double>());
}

// A schedule file -- PyTorch's own CSV for 2 ranks x 2 chunks x 8 micro-batches, with
// split backwards -- trains as its generator would: the same losses as plain
// single-stage training on the same global batch and micro-batch split.
// train --schedule=zb-2p (or zb-v-min) first measures a few steps of its unit-cost order
// and runs the order searched for those costs; --search-steps=0 keeps the unit-cost order.
TEST(CliTrainTest, SearchedSchedulesAreSearchedForMeasuredCosts) {
  const std::vector<std::string> tiny = {
      "train",         "--schedule=zb-2p", "--stages=2", "--microbatches=4", "--microbatch-size=4",
      "--layers=3",    "--hidden=16",      "--inputs=8", "--classes=4",      "--steps=2",
      "--backend=host"};
  RunResult r = RunCli(tiny);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("zb-2p: searched for the costs measured in 3 steps of its "
                               "unit-cost order (zb-h1's): planned makespan "));
  // zb-v-min's unit-cost order is its own at P=4: zb-v's 8 chunk activations exceed its 4.
  RunResult min = RunCli({"train", "--schedule=zb-v-min", "--stages=4", "--microbatches=8",
                          "--microbatch-size=4", "--layers=8", "--hidden=16", "--inputs=8",
                          "--classes=4", "--steps=2", "--backend=host"});
  ASSERT_EQ(min.code, 0) << min.err;
  EXPECT_THAT(min.out, HasSubstr("zb-v-min: searched for the costs measured in 3 steps of its "
                                 "unit-cost order: planned makespan "));
  // interleaved-zb-1p's unit-cost order at P=2, M=4 is interleaved-zb's.
  RunResult loop = RunCli({"train", "--schedule=interleaved-zb-1p", "--stages=2",
                           "--microbatches=4", "--microbatch-size=4", "--layers=5", "--hidden=16",
                           "--inputs=8", "--classes=4", "--steps=1", "--backend=host"});
  ASSERT_EQ(loop.code, 0) << loop.err;
  EXPECT_THAT(loop.out, HasSubstr("interleaved-zb-1p: searched for the costs measured in 3 steps "
                                  "of its unit-cost order (interleaved-zb's): planned makespan "));
  // A configuration that cannot run says so as it would without the search.
  RunResult bad = RunCli(
      {"train", "--schedule=zb-v-half", "--stages=4", "--layers=3", "--steps=1", "--backend=host"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err,
            "pipesched: 3 blocks + head = 4 layers cannot fill 8 chunks (stages x virtual "
            "stages): every chunk needs at least one layer; use at least 7 blocks or fewer "
            "chunks\n");
  std::vector<std::string> args = tiny;
  args.push_back("--search-steps=1");
  r = RunCli(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("measured in 1 step of its unit-cost order"));
  args.back() = "--search-steps=0";
  r = RunCli(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("searched for")));
  args.back() = "--search-steps=-1";
  r = RunCli(args);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --search-steps=-1 is out of range: use 0 (keep the unit-cost "
            "order) to 100\n");
}

// CreateTrainer leaves the order it runs in the config: bench makes a second trainer from
// that config to measure the peak memory exactly, and it must run the same order (it ran
// the unit-cost one, whose peak differs, until 2026-12-02).
TEST(CliTrainTest, CreateTrainerLeavesTheSearchedOrderInTheConfig) {
  stages::TrainerConfig config;
  config.schedule = "zb-v-min";
  config.stages = 4;
  config.microbatches = 8;
  config.microbatch_size = 4;
  config.model = {.d_in = 8, .d_hidden = 16, .num_classes = 4, .num_layers = 8};
  config.backend = "host";
  std::string note;
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<stages::Trainer> trainer,
                          CreateTrainer(&config, 2, &note));
  EXPECT_THAT(note, HasSubstr("zb-v-min: searched for the costs measured in 2 steps"));
  ASSERT_TRUE(config.schedule_override.has_value());
  EXPECT_EQ(config.schedule_override->programs, trainer->schedule().programs);
  // Not searched: the config stays as it was.
  stages::TrainerConfig fixed = config;
  fixed.schedule = "zb-v";
  fixed.schedule_override.reset();
  PS_ASSERT_OK(CreateTrainer(&fixed, 2, &note).status());
  EXPECT_FALSE(fixed.schedule_override.has_value());
}

TEST(CliTrainTest, TrainsAScheduleFileLikePlainTraining) {
  const std::vector<std::string> model = {
      "--layers=4",          "--hidden=16", "--inputs=8",     "--classes=4",
      "--microbatch-size=2", "--steps=3",   "--backend=host", "--lr=0.1"};
  auto run = [&](std::vector<std::string> args, const std::string& json) {
    args.insert(args.begin(), "train");
    args.insert(args.end(), model.begin(), model.end());
    args.push_back("--json=" + json);
    return RunCli(args);
  };
  const std::string piped = TempPath("from.json"), plain = TempPath("plain.json");
  RunResult a = run({"--from=" + Shared("interop/pytorch/2-rank.csv")}, piped);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_THAT(a.out, HasSubstr("P=2 V=2 D=1 M=8 B=2  global batch 16"));
  RunResult b = run({"--schedule=gpipe", "--stages=1", "--microbatches=8"}, plain);
  ASSERT_EQ(b.code, 0) << b.err;
  const nlohmann::json x = nlohmann::json::parse(Slurp(piped));
  const nlohmann::json y = nlohmann::json::parse(Slurp(plain));
  ASSERT_EQ(x["losses"].size(), 3u);
  ASSERT_EQ(y["losses"].size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const double p = x["losses"][k].get<double>(), q = y["losses"][k].get<double>();
    EXPECT_NEAR(p, q, 1e-5 * q) << "step " << k + 1;
  }
  EXPECT_LT(x["losses"][2].get<double>(), x["losses"][0].get<double>());
  // The file fixes P, V and M: a flag that would change them is refused, by name.
  RunResult c = run({"--from=" + Shared("interop/pytorch/2-rank.csv"), "--microbatches=4"}, piped);
  EXPECT_EQ(c.code, 2);
  EXPECT_THAT(c.err, HasSubstr("takes P, V and M from the file; drop --microbatches"));
  EXPECT_EQ(CountLines(c.err), 1);
}

TEST(CliTrainTest, BadConfigurationsAreOneLineErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } const cases[] = {
      {{"train", "--stages=4", "--layers=2"}, "cannot fill"},
      {{"train", "--optimizer=lamb"}, "--optimizer=lamb is not one of sgd, adamw"},
      {{"train", "--backend=tpu"}, "--backend=tpu is not one of auto, host, cuda"},
      {{"train", "--lr=0"}, "--lr=0 must be a positive number"},
      // Past fp32's range the optimizer's values would be inf.
      {{"train", "--lr=1e39"}, "--lr=1e+39 must be a positive number that fp32 holds"},
      {{"train", "--weight-decay=1e39"},
       "--weight-decay=1e+39 must be >= 0 and a number that fp32 holds (at most 3.4e38)"},
      {{"train", "--classes=1"}, "--classes=1: a softmax over one class has nothing to learn"},
      {{"train", "--steps=0"}, "--steps=0 is out of range"},
      {{"train", "--replicas=0"}, "--replicas=0 is out of range"},
      {{"train", "--partition=2,x"}, "'x' is not a positive layer count"},
      {{"train", "--init=/nonexistent.safetensors", "--stages=1", "--steps=1"},
       "/nonexistent.safetensors"},
      {{"train", "--data=/nonexistent.safetensors", "--stages=1"}, "/nonexistent.safetensors"},
      {{"train", "--steps=1", "--json=/nonexistent/dir/train.json"},
       "--json=/nonexistent/dir/train.json: the directory /nonexistent/dir does not exist"},
      {{"train", "--steps=1", "--save=/nonexistent/dir/w.safetensors"},
       "--save=/nonexistent/dir/w.safetensors: the directory /nonexistent/dir does not exist"},
      // 64 inputs, 64 blocks of width 65536, 10 classes: 64 x 65536 + 65536 + 63 x (65536^2
      // + 65536) + 10 x 65536 + 10 parameters, x 3 (gradients, momentum) x 4 bytes; refused
      // before anything is allocated.
      {{"train", "--hidden=65536", "--layers=64", "--backend=host"},
       "the model does not fit in host memory: 270591983626 parameters x 1 replica(s), with "
       "gradients and SGD momentum, need 3024.10 GiB but the machine has "},
      // 8 global batches of 8 x 65536 samples of 4096 inputs, and a step's inputs twice:
      // (4194304 x 4097 + 2 x 524288 x 4096) x 4 bytes = 80.02 GiB.
      {{"train", "--microbatch-size=65536", "--inputs=4096", "--hidden=8", "--microbatches=8",
        "--backend=host"},
       "the synthetic data does not fit in host memory: 4194304 samples of 4096 inputs (8 global "
       "batches of replicas x microbatches x microbatch-size = 524288) and a step's inputs need "
       "80.02 GiB"},
      // GPipe holds all 256 micro-batches of 4096 samples on each rank: 288 GiB of
      // activations at its peak, refused before the data is made or a step runs.
      {{"train", "--schedule=gpipe", "--stages=2", "--microbatches=256", "--microbatch-size=4096",
        "--hidden=2048", "--layers=16", "--momentum=0", "--backend=host"},
       "gpipe's activations do not fit in host memory: at its peak the plan holds 288.39 GiB "
       "there (2 rank(s); rank 1 alone 152.11 GiB with 256 of M = 256 micro-batches in flight) "
       "but "},
      {{"train", "--device-memory=12parsecs"},
       "--device-memory=12parsecs: '12parsecs' is not a size (unknown unit 'parsecs'): write a "
       "number with an optional unit, e.g. 80GiB"},
  };
  for (const Case& c : cases) {
    RunResult r = RunCli(c.args);
    EXPECT_EQ(r.code, 2) << c.args.back() << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args.back();
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
  }
}

// A schedule file with more chunks than the model can ever have layers: the error says
// so, rather than suggesting more --layers than --layers takes.
TEST(CliTrainTest, ScheduleFileWithMoreChunksThanAnyModelIsOneLine) {
  const std::string path = TempPath("4100-chunks.json");
  RunResult made = RunCli({"simulate", "--schedule=looped-bfs", "--stages=2050", "--virtual=2",
                           "--microbatches=1", "--nogrid", "--schedule-json=" + path});
  ASSERT_EQ(made.code, 0) << made.err;
  RunResult r = RunCli({"train", "--from=" + path, "--backend=host", "--steps=1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "pipesched: --from=" + path +
                       ": the schedule has 4100 chunks (stages x virtual stages), but the model "
                       "has at most 4096 blocks + head = 4097 layers (--layers) and every chunk "
                       "needs one; use a schedule with at most 4097 chunks\n");
}

// An invalid schedule file: one line naming the file and the first problem (validate
// draws the grid); it printed the validator's grid and left out the file's name.
TEST(CliTrainTest, InvalidScheduleFileIsOneLineNamingIt) {
  const std::string path = TempPath("dup.csv");
  std::ofstream(path) << "0F0,0F0,0B0\n1F0,1B0\n";
  RunResult r = RunCli({"train", "--from=" + path, "--backend=host", "--steps=1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "pipesched: --from=" + path +
                       ": rank 0 step 1: action 0F0 is a duplicate (first at rank 0 step 0); "
                       "`pipesched validate " +
                       path + "` draws where\n");
}

// --device-memory gives each host device a GPU's memory: GPipe's 8 micro-batches in
// flight do not fit in 2 MiB per device (refused before the first step, exit 2); 1F1B's
// at most 2 do, and it trains (rank 1's peak: one micro-batch, 516 KiB, plus the next
// F's 64 KiB input received during the backward).
TEST(CliTrainTest, DeviceMemoryRefusesAPlanThatCannotFitAndRunsOneThatCan) {
  auto run = [](const std::string& schedule) {
    return RunCli({"train", "--schedule=" + schedule, "--stages=2", "--microbatches=8",
                   "--microbatch-size=128", "--layers=4", "--hidden=128", "--inputs=16",
                   "--classes=4", "--steps=2", "--backend=host", "--device-memory=2MiB"});
  };
  RunResult gpipe = run("gpipe");
  EXPECT_EQ(gpipe.code, 2) << gpipe.err;
  EXPECT_EQ(gpipe.err,
            "pipesched: gpipe's activations do not fit in host:0: at its peak the plan holds "
            "2.62 MiB there (1 rank(s); rank 0 alone 2.62 MiB with 8 of M = 8 micro-batches in "
            "flight) but 1.72 MiB is available; use a smaller --microbatch-size, --hidden or "
            "--layers, fewer --microbatches, a schedule that keeps fewer micro-batches in flight "
            "(1f1b: at most P = 2 on a rank), or more --stages (fewer layers on each device)\n");
  EXPECT_THAT(gpipe.out, Not(HasSubstr("step 1/")));
  RunResult one_f_one_b = run("1f1b");
  EXPECT_EQ(one_f_one_b.code, 0) << one_f_one_b.err;
  EXPECT_THAT(one_f_one_b.out, HasSubstr("activations at the planned peak 720.0 KiB / 580.0 KiB"));
}

// The placement line says how the (replica, rank) pairs map onto the devices asked for.
TEST(CliTrainTest, SaysWhereThePipelineRuns) {
  auto line = [](const std::string& devices) {
    RunResult r = RunCli({"train", "--stages=2", "--replicas=2", "--layers=3", "--hidden=8",
                          "--inputs=4", "--classes=2", "--microbatch-size=2", "--microbatches=2",
                          "--steps=1", "--backend=host", "--devices=" + devices});
    EXPECT_EQ(r.code, 0) << r.err;
    const std::size_t at = r.out.find("host backend: ");
    return at == std::string::npos ? r.out : r.out.substr(at, r.out.find('\n', at) - at);
  };
  EXPECT_EQ(line("0"), "host backend: 4 device(s) for P=2 x D=2");
  EXPECT_EQ(line("4"), "host backend: 4 device(s) for P=2 x D=2");
  EXPECT_EQ(line("6"), "host backend: 4 device(s) for P=2 x D=2 (2 of the 6 devices are not used)");
  EXPECT_EQ(line("3"),
            "host backend: 4 (replica, rank) pairs share 3 device(s) round-robin; each keeps its "
            "own streams");
}

// More busy host devices than CPU cores gets a note under the placement line; as many
// devices as cores, or pairs sharing fewer devices, do not.
TEST(CliTrainTest, SaysWhenHostDevicesOutnumberTheCores) {
  const int cpus = HostCpuCount();
  // One more device than cores: keep that small (and under the 1024-replica limit).
  if (cpus >= 64) GTEST_SKIP() << cpus << " CPUs: the test starts one device more than that";
  auto run = [](int replicas, int devices) {
    RunResult r = RunCli({"train", "--stages=1", "--replicas=" + std::to_string(replicas),
                          "--layers=3", "--hidden=8", "--inputs=4", "--classes=2",
                          "--microbatch-size=2", "--microbatches=2", "--steps=1", "--backend=host",
                          "--devices=" + std::to_string(devices)});
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  };
  EXPECT_THAT(run(cpus + 1, 0), HasSubstr(absl::StrCat(
                                    "host backend: ", cpus + 1, " device(s) for P=1 x D=", cpus + 1,
                                    "\nnote: the ", cpus + 1, " host devices compute on ", cpus,
                                    " CPU core(s): ranks computing at once slow each other down, "
                                    "which the plan does not model\n")));
  EXPECT_THAT(run(cpus, 0), Not(HasSubstr("note: the")));
  EXPECT_THAT(run(cpus + 1, cpus), Not(HasSubstr("note: the")));
}

TEST(CliTrainTest, DataFilesThatDisagreeWithTheFlagsAreOneLineErrors) {
  // 32 samples of 8 inputs, labels 1 but one 7; the file says how many classes it has.
  auto write = [](const std::string& name, int num_classes) {
    model::Dataset data{.d_in = 8, .num_classes = num_classes};
    data.x.assign(32 * 8, 0.5f);
    data.y.assign(32, 1);
    data.y[17] = 7;
    const std::string path = TempPath(name);
    EXPECT_TRUE(model::SaveDataset(path, data).ok()) << path;
    return path;
  };
  const std::string four = write("labels-4.safetensors", 4);   // label 7 of 4 classes
  const std::string eight = write("labels-8.safetensors", 8);  // consistent in itself
  auto run = [](const std::string& path, const std::string& inputs) {
    return RunCli({"train", "--stages=2", "--layers=3", "--hidden=16", "--classes=4", "--steps=1",
                   "--backend=host", "--data=" + path, inputs});
  };
  struct Case {
    RunResult r;
    std::string message;
  } const cases[] = {
      {run(four, "--inputs=8"),
       "data set '" + four + "': label 7 is out of range for num_classes 4"},
      {run(eight, "--inputs=8"), eight + ": label 7 in y is outside [0, 4) (--classes=4)"},
      {run(eight, "--inputs=16"),
       eight + ": x has 8 features per sample but the model takes 16 (--inputs)"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.r.code, 2) << c.r.err;
    EXPECT_THAT(c.r.err, HasSubstr(c.message));
    EXPECT_EQ(CountLines(c.r.err), 1) << c.r.err;
  }
  // Finite but huge inputs overflow the first forward pass: the message names the data,
  // not the learning rate (no update has happened yet).
  model::Dataset huge{.d_in = 8, .num_classes = 4};
  huge.x.assign(128 * 8, 3e38f);  // one step of the defaults: 8 x 16 samples
  huge.y.assign(128, 1);
  const std::string big = TempPath("huge-inputs.safetensors");
  ASSERT_TRUE(model::SaveDataset(big, huge).ok());
  RunResult overflow = run(big, "--inputs=8");
  EXPECT_EQ(overflow.code, 1) << overflow.err;
  EXPECT_THAT(overflow.err, HasSubstr("step 1: the loss is nan before any update: the forward "
                                      "pass overflows fp32"));
  EXPECT_THAT(overflow.err, HasSubstr("scale the inputs (--data) down"));
  // Large inputs that the first forward survives blow up the first update instead: the
  // message names the data besides the learning rate.
  model::Dataset large = huge;
  large.x.assign(128 * 8, 1e15f);
  const std::string large_path = TempPath("large-inputs.safetensors");
  ASSERT_TRUE(model::SaveDataset(large_path, large).ok());
  RunResult diverged =
      RunCli({"train", "--stages=2", "--layers=3", "--hidden=16", "--classes=4", "--steps=2",
              "--backend=host", "--data=" + large_path, "--inputs=8"});
  EXPECT_EQ(diverged.code, 1) << diverged.err;
  EXPECT_THAT(diverged.err, HasSubstr("step 2: the loss is nan; training diverged"));
  EXPECT_THAT(diverged.err, HasSubstr("lower --lr or --weight-decay, or scale the inputs (--data) "
                                      "down: large ones make large gradients"));
}

// --save / --resume: 6 steps straight equal 2 steps, a resume, and 4 more, bit for bit.
TEST(CliTest, TrainResumeEqualsTrainingStraightThrough) {
  const std::vector<std::string> common = {"train",          "--schedule=1f1b",
                                           "--stages=2",     "--microbatches=4",
                                           "--replicas=2",   "--layers=3",
                                           "--hidden=16",    "--inputs=8",
                                           "--classes=4",    "--microbatch-size=4",
                                           "--backend=host", "--optimizer=adamw",
                                           "--lr=0.01",      "--seed=3"};
  auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> args = common;
    args.insert(args.end(), more.begin(), more.end());
    return RunCli(args);
  };
  const std::string straight = TempPath("straight.safetensors");
  const std::string first = TempPath("first.safetensors");
  const std::string resumed = TempPath("resumed.safetensors");
  RunResult a = run({"--steps=6", "--save=" + straight});
  ASSERT_EQ(a.code, 0) << a.err;
  RunResult b = run({"--steps=2", "--save=" + first, "--save-every=1"});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_THAT(b.out, HasSubstr("saved " + first + " after step 1"));
  RunResult c = run({"--steps=4", "--resume=" + first, "--save=" + resumed, "--step-timeout=30"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_THAT(c.out, HasSubstr("resumed from " + first + " after step 2"));
  EXPECT_THAT(c.out, HasSubstr("(checkpoint after step 6)"));
  // The same file, byte for byte: parameters, optimizer state, step, data position.
  EXPECT_EQ(Slurp(straight), Slurp(resumed));
  EXPECT_GT(Slurp(straight).size(), 1000u);

  // A corrupted checkpoint is one line, exit 2, naming the problem.
  std::string bytes = Slurp(first);
  bytes[bytes.size() - 2] ^= 1;
  std::ofstream(first, std::ios::binary) << bytes;
  RunResult d = run({"--steps=1", "--resume=" + first});
  EXPECT_EQ(d.code, 2);
  EXPECT_THAT(d.err, HasSubstr("checksum mismatch"));
  EXPECT_EQ(CountLines(d.err), 1);
  RunResult e = run({"--steps=1", "--save-every=2"});
  EXPECT_EQ(e.code, 2);
  EXPECT_THAT(e.err, HasSubstr("--save-every needs --save"));
  RunResult f = run({"--steps=1", "--step-timeout=-1"});
  EXPECT_EQ(f.code, 2);
  EXPECT_THAT(f.err, HasSubstr("--step-timeout=-1 must be 0 (never) or at least 1 second"));
  RunResult g = run({"--steps=1", "--step-timeout=1e-06"});
  EXPECT_EQ(g.code, 2);
  EXPECT_THAT(g.err, HasSubstr("--step-timeout=1e-06 must be 0 (never) or at least 1 second"));
}

// train --processes: every flag that cannot make a job is refused before this process
// waits for any other, in one line with exit 2 (the two-process runs are the ctest
// CliMain.TwoProcessesTrainAsOneWithBothReplicas).
TEST(CliTest, TrainProcessFlagsAreCheckedBeforeJoining) {
  auto run = [](std::vector<std::string> flags) {
    std::vector<std::string> args = {"train",      "--stages=2", "--microbatches=2", "--layers=2",
                                     "--hidden=8", "--steps=1",  "--backend=host"};
    args.insert(args.end(), flags.begin(), flags.end());
    return RunCli(args);
  };
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / absl::StrCat("cli_rdv_", ::getpid())).string();
  std::filesystem::remove_all(dir);
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--processes=0"}, "--processes=0 is out of range: use 1 to 4096"},
      {{"--processes=2", "--process-rank=2", "--rendezvous=" + dir},
       "--process-rank=2 is out of range for --processes=2: use 0 to 1"},
      {{"--processes=2"},
       "--processes=2 needs --rendezvous=DIR: a path every process can see and that does not "
       "exist yet"},
      {{"--rendezvous=" + dir},
       "--rendezvous is for a job of several processes: give --processes=N (N > 1) too"},
      {{"--process-rank=0"}, "--process-rank is for a job of several processes"},
      {{"--processes=2", "--rendezvous=" + dir, "--rendezvous-timeout=0.5"},
       "--rendezvous-timeout=0.5 must be at least 1 second"},
      {{"--processes=2", "--rendezvous=" + dir, "--recompute-stages=auto"},
       "--recompute-stages=auto plans for this machine's memory, which may differ between "
       "processes"},
      {{"--processes=2", "--rendezvous=" + dir, "--schedule=zb-1p", "--search-steps=0", "--refine"},
       "--refine keeps a refined order only where it fits this machine's memory, which may "
       "differ between processes: refine once"},
      {{"--processes=2", "--rendezvous=" + dir, "--schedule=zb-1p"},
       "zb-1p's order is searched for the costs each process measures, which differ, and every "
       "process must run one order: give --search-steps=0"},
  };
  for (const auto& [flags, message] : refused) {
    RunResult r = run(flags);
    EXPECT_EQ(r.code, 2) << flags.front();
    EXPECT_THAT(r.err, HasSubstr(message)) << flags.front();
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir)) << flags.front() << " made the directory";
  }
  // A process other than 0 whose process 0 never comes gives up after the timeout.
  RunResult late =
      run({"--processes=2", "--process-rank=1", "--rendezvous=" + dir, "--rendezvous-timeout=1"});
  EXPECT_EQ(late.code, 1);
  EXPECT_THAT(late.err, HasSubstr("rank 0 did not create"));
  EXPECT_THAT(late.err,
              HasSubstr("within 1 s (is rank 0 running, with the same rendezvous path?)"));
  // A directory left by a run that was killed is refused, and said how to go on.
  std::filesystem::create_directory(dir);
  RunResult left = run({"--processes=2", "--rendezvous=" + dir});
  EXPECT_EQ(left.code, 2);
  EXPECT_THAT(
      left.err,
      HasSubstr("exists (an earlier run that did not close left it, or another job uses it?): "
                "remove it, or give every run a new path"));
  std::filesystem::remove_all(dir);
  // One process alone is a job too: --processes=1 is the default.
  EXPECT_EQ(run({"--processes=1"}).code, 0);
}

// --split-stages needs a job of processes to split across, and the host backend; both are
// refused before any process joins.
TEST(CliTest, TrainSplitStagesIsCheckedBeforeJoining) {
  const std::vector<std::string> common = {"train",         "--stages=2", "--microbatches=2",
                                           "--layers=2",    "--hidden=8", "--steps=1",
                                           "--split-stages"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = common;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  RunResult alone = RunCli(with({"--backend=host"}));
  EXPECT_EQ(alone.code, 2);
  EXPECT_EQ(alone.err,
            "pipesched: --split-stages splits the pipeline across the processes of a job: start "
            "them with `pipesched launch --processes=N -- pipesched train ...`, give each "
            "--processes, --process-rank and --rendezvous, or give --mpi under mpirun\n");
  const std::string dir = ::testing::TempDir() + "/split_stages_never_created";
  RunResult cuda = RunCli(with(
      {"--backend=cuda", "--processes=2", "--process-rank=0", absl::StrCat("--rendezvous=", dir)}));
  EXPECT_EQ(cuda.code, 2);
  EXPECT_THAT(cuda.err, HasSubstr("--split-stages runs on the host backend only"));
  RunResult many = RunCli(with(
      {"--backend=host", "--processes=3", "--process-rank=0", absl::StrCat("--rendezvous=", dir)}));
  EXPECT_EQ(many.code, 2);
  EXPECT_THAT(many.err,
              HasSubstr("--split-stages gives each process at least one pipeline rank: "
                        "--processes=3 is more than --stages=2; give at most 2 processes"));
  EXPECT_FALSE(std::filesystem::exists(dir)) << "joined before refusing";
}

// bench runs in a job as train does, and its job's flags are checked likewise before it
// joins: with the command's name in the advice.
TEST(CliTest, BenchJobFlagsAreCheckedBeforeJoining) {
  const std::string dir = ::testing::TempDir() + "/bench_job_never_created";
  const std::string rendezvous = absl::StrCat("--rendezvous=", dir);
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"bench", "--split-stages"},
       "pipesched: --split-stages splits the pipeline across the processes of a job: start them "
       "with `pipesched launch --processes=N -- pipesched bench ...`, give each --processes, "
       "--process-rank and --rendezvous, or give --mpi under mpirun\n"},
      {{"bench", "--processes=2"},
       "pipesched: --processes=2 needs --rendezvous=DIR: a path every process can see and that "
       "does not exist yet (process 0 creates it), the same for all\n"},
      {{"bench", "--rendezvous=x"},
       "pipesched: --rendezvous is for a job of several processes: give --processes=N (N > 1) "
       "too, or drop it\n"},
      {{"bench", "--processes=2", "--process-rank=2", rendezvous},
       "pipesched: --process-rank=2 is out of range for --processes=2: use 0 to 1\n"},
      {{"bench", "--processes=4", "--pipeline-processes=3", rendezvous},
       "pipesched: --pipeline-processes=3 does not divide --processes=4: give a divisor of 4 (the "
       "job runs N / K pipelines of K processes)\n"},
      {{"bench", "--processes=2", "--split-stages", "--pipeline-processes=2", rendezvous},
       "pipesched: give --split-stages (the job's processes split one pipeline) or "
       "--pipeline-processes=K (pipelines of K processes), not both\n"},
      {{"bench", "--processes=2", "--recompute-stages=auto", rendezvous},
       "pipesched: --recompute-stages=auto plans for this machine's memory, which may differ "
       "between processes: run bench as one process, or train with a --recompute-stages list\n"},
      {{"bench", "--processes=2", "--refine", rendezvous},
       "pipesched: --refine keeps a refined order only where it fits this machine's memory"},
  };
  for (const auto& [args, message] : refused) {
    RunResult r = RunCli(args);
    EXPECT_EQ(r.code, 2) << args[1];
    EXPECT_THAT(r.err, HasSubstr(message));
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "joined before refusing";
}

// PIPESCHED_RENDEZVOUS_EVENTS: 0 or 1, anything else refused in one line before joining;
// 0 still meets (a job of one process here: it joins, trains and leaves).
TEST(CliTest, TheRendezvousEventsVariableIsZeroOrOne) {
  const std::string dir = ::testing::TempDir() + "/events_never_created";
  const std::vector<std::string> args = {"train",
                                         "--stages=1",
                                         "--microbatches=1",
                                         "--layers=1",
                                         "--hidden=4",
                                         "--inputs=4",
                                         "--classes=2",
                                         "--microbatch-size=2",
                                         "--steps=1",
                                         "--backend=host",
                                         "--processes=2",
                                         "--process-rank=0",
                                         absl::StrCat("--rendezvous=", dir),
                                         "--rendezvous-timeout=1"};
  for (const char* bad : {"2", "", "yes", "00"}) {
    setenv(kRendezvousEventsVariable, bad, 1);
    RunResult r = RunCli(args);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_EQ(r.err, absl::StrCat("pipesched: PIPESCHED_RENDEZVOUS_EVENTS=\"", bad,
                                  "\" is not 0 or 1: give 1 (the default: a receive is woken when "
                                  "its message appears in the rendezvous directory) or 0 (it only "
                                  "looks)\n"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "joined before refusing";
  // 0: the job is joined (process 1 never comes: the rendezvous times out after 1 s).
  setenv(kRendezvousEventsVariable, "0", 1);
  RunResult r = RunCli(args);
  unsetenv(kRendezvousEventsVariable);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("waited 1 s"));
  std::filesystem::remove_all(dir);
}

// --pipeline-processes=K: K must divide the job and fit the pipeline, before joining.
TEST(CliTest, TrainPipelineProcessesIsCheckedBeforeJoining) {
  const std::string dir = ::testing::TempDir() + "/pipeline_processes_never_created";
  auto run = [&](std::vector<std::string> flags, bool job = true) {
    std::vector<std::string> args = {"train",      "--stages=2", "--microbatches=2",
                                     "--layers=2", "--hidden=8", "--steps=1"};
    if (flags.size() == 1) args.push_back("--backend=host");
    if (job) {
      for (const std::string& flag : {std::string("--processes=4"), std::string("--process-rank=0"),
                                      absl::StrCat("--rendezvous=", dir)}) {
        args.push_back(flag);
      }
    }
    args.insert(args.end(), flags.begin(), flags.end());
    return RunCli(args);
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--pipeline-processes=3"},
       "pipesched: --pipeline-processes=3 does not divide --processes=4: give a divisor of 4 (the "
       "job runs N / K pipelines of K processes)\n"},
      {{"--pipeline-processes=4"},
       "pipesched: --pipeline-processes=4 gives each process at least one pipeline rank, and "
       "there are --stages=2; give at most 2\n"},
      {{"--pipeline-processes=0"},
       "pipesched: --pipeline-processes=0 must be at least 1 (processes that split each "
       "pipeline)\n"},
      {{"--pipeline-processes=2", "--backend=cuda"},
       "pipesched: --pipeline-processes=2 runs on the host backend only (on CUDA the crossings "
       "need NCCL send/recv, not built yet): give --backend=host\n"},
      {{"--pipeline-processes=2", "--split-stages"},
       "pipesched: give --split-stages (the job's processes split one pipeline) or "
       "--pipeline-processes=K (pipelines of K processes), not both\n"},
  };
  for (const auto& [flags, error] : refused) {
    RunResult r = run(flags);
    EXPECT_EQ(r.code, 2) << flags[0];
    EXPECT_EQ(r.err, error) << flags[0];
  }
  RunResult alone = run({"--pipeline-processes=2"}, /*job=*/false);
  EXPECT_EQ(alone.code, 2);
  EXPECT_THAT(alone.err, HasSubstr("pipesched: --pipeline-processes splits the pipeline across "
                                   "the processes of a job: start them with `pipesched launch"));
  // K = 1 splits nothing: a process alone trains as without it.
  RunResult one = run({"--pipeline-processes=1"}, /*job=*/false);
  EXPECT_EQ(one.code, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("step 1/1"));
  EXPECT_FALSE(std::filesystem::exists(dir)) << "joined before refusing";
}

// train --mpi takes its job from MPI, so the flags that give a job otherwise are refused
// with it; and a process that an MPI launcher started as one of several, without --mpi,
// is refused rather than left to train alone (mpiexec runs are the ctest
// CliMain.MpiProcessesTrainAsOneWithBothReplicas).
TEST(CliTest, TrainMpiFlagsAreCheckedBeforeJoining) {
  auto run = [](std::vector<std::string> flags) {
    std::vector<std::string> args = {"train",      "--stages=2", "--microbatches=2", "--layers=2",
                                     "--hidden=8", "--steps=1",  "--backend=host"};
    args.insert(args.end(), flags.begin(), flags.end());
    return RunCli(args);
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--mpi", "--processes=2"},
       "--mpi takes the job from MPI (its processes and their ranks): drop --processes"},
      {{"--mpi", "--process-rank=1"},
       "--mpi takes the job from MPI (its processes and their "
       "ranks): drop --process-rank"},
      {{"--mpi", "--rendezvous=/tmp/x"}, "drop --rendezvous"},
      {{"--mpi", "--rendezvous-timeout=0.5"}, "--rendezvous-timeout=0.5 must be at least 1 second"},
      {{"--mpi", "--recompute-stages=auto"},
       "--recompute-stages=auto plans for this machine's memory, which may differ between "
       "processes"},
  };
  for (const auto& [flags, message] : refused) {
    RunResult r = run(flags);
    EXPECT_EQ(r.code, 2) << flags.back();
    EXPECT_THAT(r.err, HasSubstr(message)) << flags.back();
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
  }
  {
    pipesched::testing::ScopedEnvironment env(
        std::map<std::string, std::optional<std::string>>{{"OMPI_COMM_WORLD_SIZE", "4"}});
    RunResult alone = run({});
    EXPECT_EQ(alone.code, 2);
    EXPECT_EQ(alone.err,
              "pipesched: this process is one of 4 that an MPI launcher started "
              "(OMPI_COMM_WORLD_SIZE=4), and each would train alone: give --mpi to train as one "
              "job of 4 processes\n");
  }
  {
    // srun --mpi=pmix: PMIx's rank, and the size from Slurm's step.
    pipesched::testing::ScopedEnvironment env(std::map<std::string, std::optional<std::string>>{
        {"PMIX_RANK", "1"}, {"SLURM_STEP_NUM_TASKS", "3"}});
    RunResult alone = run({});
    EXPECT_EQ(alone.code, 2);
    EXPECT_THAT(alone.err, HasSubstr("this process is one of 3 that an MPI launcher started "
                                     "(SLURM_STEP_NUM_TASKS=3)"));
  }
  {
    pipesched::testing::ScopedEnvironment env(
        std::map<std::string, std::optional<std::string>>{{"MV2_COMM_WORLD_SIZE", "2"}});
    EXPECT_THAT(run({}).err, HasSubstr("(MV2_COMM_WORLD_SIZE=2)"));
  }
  {
    pipesched::testing::ScopedEnvironment env(
        std::map<std::string, std::optional<std::string>>{{"PMI_SIZE", "1"}});
    EXPECT_EQ(run({}).code, 0);  // a job of one process trains alone, as it is
  }
  {
    // A Slurm step of several tasks without PMIx (srun --mpi=none, or a batch script's own
    // step) says nothing of MPI: each process may mean to train alone.
    pipesched::testing::ScopedEnvironment env(
        std::map<std::string, std::optional<std::string>>{{"SLURM_STEP_NUM_TASKS", "4"}});
    EXPECT_EQ(run({}).code, 0);
  }
  {
    pipesched::testing::ScopedEnvironment env(
        std::map<std::string, std::optional<std::string>>{{"PIPESCHED_PROCESSES", "2"}});
    RunResult launched = run({"--mpi"});
    EXPECT_EQ(launched.code, 2);
    EXPECT_THAT(launched.err, HasSubstr("--mpi is given, but this process was started by "
                                        "`pipesched launch` (PIPESCHED_PROCESSES is set)"));
  }
  if (!comm::MpiBootstrapBuilt()) {
    RunResult none = run({"--mpi"});
    EXPECT_EQ(none.code, 2);
    EXPECT_THAT(none.err, HasSubstr("--mpi: this pipesched was built without MPI"));
  }
}

}  // namespace
}  // namespace pipesched::cli
