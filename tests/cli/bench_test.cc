// `pipesched bench` in-process: a tiny sweep, its CSV/JSON/Markdown/SVG outputs, skipped
// configurations with their reasons, and the exit codes.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli_runner.h"
#include "cli/command.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/strings.h"

namespace pipesched::cli {
namespace {

using testing::RunCli;
using testing::RunResult;
using testing::Slurp;
using testing::WithFlags;

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  return testing::TempPath("pipesched_bench_", name);
}

// Tiny shapes: the sweep runs in well under a second (also under sanitizers).
std::vector<std::string> Tiny(std::vector<std::string> more) {
  return WithFlags({"bench", "--hidden=8", "--layers=4", "--inputs=6", "--classes=4",
                    "--microbatch-size=2", "--warmup=1", "--steps=2", "--backend=host"},
                   more);
}

TEST(BenchTest, TinySweepWritesOneRowPerConfiguration) {
  const std::string csv = TempPath("sweep.csv"), json = TempPath("sweep.json"),
                    md = TempPath("sweep.md"), svg = TempPath("sweep.svg");
  // dualpipe-v needs M >= 2P = 4: skipped at both M.
  RunResult r = RunCli(Tiny({"--schedules=1f1b,zb-v,dualpipe-v", "--stages=2", "--microbatches=2,3",
                             "--csv=" + csv, "--json=" + json, "--md=" + md, "--svg=" + svg}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("4 of 6 configurations ran, 2 skipped"));
  EXPECT_THAT(r.out, HasSubstr("skipped: dualpipe-v needs M >= 2P = 4 micro-batches"));

  nlohmann::json j = nlohmann::json::parse(Slurp(json));
  EXPECT_EQ(j["host_cpus"], HostCpuCount());
  ASSERT_EQ(j["configurations"].size(), 6u);
  int ok = 0;
  for (const nlohmann::json& c : j["configurations"]) {
    if (c["status"] != "ok") {
      EXPECT_EQ(c["schedule"], "dualpipe-v");
      EXPECT_EQ(c["status"], "skipped");
      EXPECT_THAT(c["reason"].get<std::string>(), HasSubstr("use --microbatches=4 or more"));
      continue;
    }
    ++ok;
    EXPECT_EQ(c["stages"], 2);
    EXPECT_EQ(c["virtual"], c["schedule"] == "zb-v" ? 2 : 1);
    EXPECT_GT(c["step_ms"].get<double>(), 0);
    EXPECT_GT(c["samples_per_s"].get<double>(), 0);
    for (const char* k :
         {"bubble_simulated", "bubble_simulated_spread", "bubble_replayed", "bubble_measured"}) {
      EXPECT_GE(c[k].get<double>(), 0) << k;
      EXPECT_LT(c[k].get<double>(), 1) << k;
    }
    // 1F1B has a closed form, ZB-V has none.
    EXPECT_EQ(c["bubble_closed_form"].is_null(), c["schedule"] == "zb-v");
    // The decomposition explains the measured idle time.
    const double parts = c["idle_dependency_us"].get<double>() +
                         c["idle_transfer_us"].get<double>() +
                         c["idle_allreduce_us"].get<double>() + c["idle_host_us"].get<double>() +
                         c["idle_imbalance_us"].get<double>();
    EXPECT_NEAR(parts, c["idle_us"].get<double>(), 1e-6 * c["idle_us"].get<double>() + 1e-6);
    EXPECT_NEAR(c["idle_explained"].get<double>(), 1.0, 1e-9);
    // Every measured step, each simulated with its own costs; the median step's entry
    // is the row itself.
    ASSERT_EQ(c["steps"].size(), 2u);
    int same = 0;
    for (const nlohmann::json& st : c["steps"]) {
      same += st["step_ms"] == c["step_ms"] && st["bubble_measured"] == c["bubble_measured"] &&
              st["bubble_simulated"] == c["bubble_simulated"] &&
              st["bubble_replayed"] == c["bubble_replayed"];
    }
    EXPECT_GE(same, 1) << c["steps"].dump();
    EXPECT_TRUE(c["slow_stage"].is_null());  // no --slow-stage
    // Null when no consumer waited on another rank in the step (tiny work can finish first).
    if (!c["handoff_us"].is_null()) {
      EXPECT_GT(c["handoff_us"].get<double>(), 0);
    }
    // The stream gap between actions: null when no action had everything it needed when
    // its rank's previous one ended (with tiny work the host may issue each action only
    // after the previous one is done), else a part of the step.
    if (!c["action_gap_us"].is_null()) {
      EXPECT_GE(c["action_gap_us"].get<double>(), 0);
      EXPECT_LT(c["action_gap_us"].get<double>(), 1000 * c["makespan_ms"].get<double>());
    }
    // Whole steps: the replay and the simulation add each rank's measured zero-grad and
    // optimizer step to their makespans; the measured step (host wall time) holds them.
    EXPECT_GT(c["simulated_step_ms"].get<double>(), c["simulated_makespan_ms"].get<double>());
    EXPECT_GT(c["replayed_step_ms"].get<double>(), c["replayed_makespan_ms"].get<double>());
    EXPECT_GE(c["step_ms"].get<double>(), c["makespan_ms"].get<double>());
    EXPECT_EQ(c["peak_activation_bytes"].size(), 2u);
    // Measured in an exact-accounting step, it is what the simulator predicts, byte for
    // byte (stashes, boundary buffers and each backward's workspace).
    EXPECT_EQ(c["peak_activation_bytes"], c["simulated_peak_activation_bytes"]);
    // The table gives each rank's peak in a unit that fits it (in MiB these KiB read 0.0).
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat(
                           "  ", HumanBytes(c["peak_activation_bytes"][0].get<std::int64_t>()), "/",
                           HumanBytes(c["peak_activation_bytes"][1].get<std::int64_t>()), "\n")));
  }
  EXPECT_EQ(ok, 4);

  std::vector<std::string> lines = absl::StrSplit(Slurp(csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u + 6u);
  std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  EXPECT_EQ(header[0], "schedule");
  EXPECT_THAT(lines[0], HasSubstr("bubble_closed_form,bubble_simulated,bubble_simulated_plain,"
                                  "bubble_simulated_spread,bubble_replayed,bubble_measured"));
  for (std::size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].rfind("dualpipe-v,", 0) == 0) {
      EXPECT_THAT(lines[i], HasSubstr(",skipped,\"dualpipe-v needs M"));  // quoted: has commas
    } else {
      EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ',')).size(), header.size())
          << lines[i];
    }
  }
  const std::string markdown = Slurp(md);
  EXPECT_THAT(markdown, HasSubstr("| schedule | P | V | M |"));
  EXPECT_THAT(markdown, HasSubstr("| simulated | spread | replayed | measured |"));
  EXPECT_THAT(markdown, HasSubstr("| zb-v | 2 | 2 | 3 |"));
  EXPECT_THAT(markdown, HasSubstr("Skipped:"));
  const std::string picture = Slurp(svg);
  EXPECT_EQ(picture.rfind("<svg", 0), 0u);
  EXPECT_THAT(picture, HasSubstr("P=2: bubble fraction vs micro-batches"));
  EXPECT_THAT(picture, HasSubstr("simulated vs measured"));
}

// What does not apply is null in the JSON and empty in the CSV, never a -1 placeholder.
// A sweep whose largest configuration has more host devices than the process has CPU
// cores says so before its table; one that fits does not.
TEST(BenchTest, NotesWhenHostDevicesOutnumberTheCores) {
  const int cpus = HostCpuCount();
  // One more device than cores: keep that small (and under the 1024-replica limit).
  if (cpus >= 64) GTEST_SKIP() << cpus << " CPUs: the test starts one device more than that";
  const std::string note =
      absl::StrCat("note: ", cpus, " CPU core(s); configurations with more than ", cpus,
                   " devices (P x D) run ranks that slow each other");
  RunResult crowded = RunCli(Tiny({"--schedules=1f1b", "--stages=1", "--microbatches=2",
                                   "--replicas=" + std::to_string(cpus + 1)}));
  ASSERT_EQ(crowded.code, 0) << crowded.err << crowded.out;
  EXPECT_THAT(crowded.out, HasSubstr(note));
  RunResult fits = RunCli(Tiny({"--schedules=1f1b", "--stages=1", "--microbatches=2"}));
  ASSERT_EQ(fits.code, 0) << fits.err << fits.out;
  EXPECT_THAT(fits.out, Not(HasSubstr("note:")));
}

TEST(BenchTest, SearchedSchedulesRunTheirSearchedOrder) {
  const std::string json = TempPath("searched.json");
  RunResult r = RunCli(Tiny({"--schedules=zb-1p,zb-2p", "--stages=2", "--microbatches=4",
                             "--search-steps=2", "--json=" + json}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("2 of 2 configurations ran"));
  EXPECT_THAT(r.out, HasSubstr("\n  zb-1p: searched for the costs measured in 2 steps of its "
                               "unit-cost order (zb-h1's): planned makespan "));
  const nlohmann::json rows = nlohmann::json::parse(Slurp(json))["configurations"];
  ASSERT_EQ(rows.size(), 2u);
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["status"], "ok") << row.dump();
    EXPECT_THAT(row["search"].get<std::string>(),
                ::testing::StartsWith(row["schedule"].get<std::string>() +
                                      ": searched for the costs measured in 2 steps"));
    // The exact-accounting step runs the searched order too.
    EXPECT_EQ(row["peak_activation_bytes"], row["simulated_peak_activation_bytes"]) << row.dump();
  }
  r = RunCli(Tiny({"--schedules=zb-1p,1f1b", "--stages=2", "--microbatches=4", "--search-steps=0",
                   "--json=" + json}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json unsearched = nlohmann::json::parse(Slurp(json))["configurations"];
  for (const nlohmann::json& row : unsearched) EXPECT_EQ(row["search"], "") << row.dump();
  r = RunCli(Tiny({"--schedules=zb-1p", "--stages=2", "--microbatches=4", "--search-steps=101"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--search-steps=101 is out of range"));
}

TEST(BenchTest, WhatDoesNotApplyIsNullNotMinusOne) {
  const std::string csv = TempPath("p1.csv"), json = TempPath("p1.json");
  RunResult r = RunCli(Tiny(
      {"--schedules=1f1b", "--stages=1", "--microbatches=2", "--csv=" + csv, "--json=" + json}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json c = nlohmann::json::parse(Slurp(json))["configurations"][0];
  ASSERT_EQ(c["status"], "ok");
  EXPECT_TRUE(c["handoff_us"].is_null());  // one rank: no hand-off between ranks
  EXPECT_TRUE(c["slow_stage"].is_null());
  std::vector<std::string> lines = absl::StrSplit(Slurp(csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  const std::vector<std::string> row = absl::StrSplit(lines[1], ',');
  ASSERT_EQ(row.size(), header.size());
  for (std::size_t k = 0; k < header.size(); ++k) {
    if (header[k] == "handoff_us" || header[k] == "slow_stage") {
      EXPECT_EQ(row[k], "") << header[k];
    }
    EXPECT_NE(row[k], "-1") << header[k];
  }
  RunResult slow = RunCli(Tiny({"--schedules=1f1b", "--stages=2", "--microbatches=2",
                                "--slow-stage=1:1.5", "--json=" + json}));
  ASSERT_EQ(slow.code, 0) << slow.err;
  EXPECT_EQ(nlohmann::json::parse(Slurp(json))["configurations"][0]["slow_stage"], 1);
}

TEST(BenchTest, RanksSharingADeviceGetTheirPeakPerDevice) {
  // Two ranks on one device (--devices=1: round-robin, as on a single GPU): the runtime
  // measures the device, so the peak is reported per device, not as each rank's.
  const std::string json = TempPath("shared.json"), md = TempPath("shared.md");
  RunResult r = RunCli(Tiny({"--schedules=1f1b", "--stages=2", "--microbatches=4", "--devices=1",
                             "--json=" + json, "--md=" + md}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  nlohmann::json c = nlohmann::json::parse(Slurp(json))["configurations"][0];
  ASSERT_EQ(c["status"], "ok") << c.dump();
  EXPECT_TRUE(c["peak_activation_bytes"].is_null());
  ASSERT_EQ(c["peak_activation_bytes_per_device"].size(), 1u);
  // Both ranks' activations live on that device: more than either rank's alone.
  const auto sim = c["simulated_peak_activation_bytes"].get<std::vector<std::int64_t>>();
  ASSERT_EQ(sim.size(), 2u);
  EXPECT_GT(c["peak_activation_bytes_per_device"][0].get<std::int64_t>(), std::max(sim[0], sim[1]));
  EXPECT_THAT(Slurp(md), HasSubstr(" per device |"));
}

TEST(BenchTest, TracesWritesSimulatedAndMeasuredPerConfiguration) {
  const std::string dir = TempPath("traces"), json = TempPath("traces.json");
  std::filesystem::remove_all(dir);  // bench makes it
  RunResult r = RunCli(Tiny({"--schedules=1f1b,zb-v", "--stages=2", "--microbatches=4",
                             "--traces=" + dir, "--json=" + json}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json rows = nlohmann::json::parse(Slurp(json))["configurations"];
  ASSERT_EQ(rows.size(), 2u);
  int k = 0;
  for (const std::string stem : {"1f1b-p2-m4", "zb-v-p2-v2-m4"}) {
    EXPECT_THAT(r.out, HasSubstr("wrote " + dir + "/" + stem + ".json, .svg and .costs.json"));
    // The costs fed to the simulator: simulate with them gives the row's simulated bubble.
    const std::string stats = TempPath("traces_sim.json");
    RunResult sim =
        RunCli({"simulate", "--schedule=" + rows[k]["schedule"].get<std::string>(), "--stages=2",
                "--microbatches=4", "--costs=" + dir + "/" + stem + ".costs.json",
                "--json=" + stats, "--nogrid"});
    ASSERT_EQ(sim.code, 0) << sim.err;
    // Each stage's parameters, gradients and optimizer state come with the costs.
    const nlohmann::json saved = nlohmann::json::parse(Slurp(dir + "/" + stem + ".costs.json"));
    ASSERT_EQ(saved["stages"].size(), k == 0 ? 2u : 4u);
    for (const nlohmann::json& stage : saved["stages"]) {
      EXPECT_GT(stage["static_bytes"].get<std::int64_t>(), 0) << stem;
    }
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(Slurp(stats))["bubble_fraction"].get<double>(),
                     rows[k++]["bubble_simulated"].get<double>())
        << stem;
    nlohmann::json trace = nlohmann::json::parse(Slurp(dir + "/" + stem + ".json"));
    std::set<std::string> processes;
    int spans = 0;
    for (const nlohmann::json& e : trace["traceEvents"]) {
      if (e["ph"] == "X") ++spans;
      if (e["ph"] == "M" && e["name"] == "process_name") {
        processes.insert(e["args"]["name"].get<std::string>());
      }
    }
    // Both timelines, each with 2 ranks x 4 micro-batches x (F + B) compute spans at least,
    // and the whole step: each rank's zero-grad and optimizer step, measured and simulated.
    EXPECT_GE(spans, 2 * 16 + 2 * 4) << stem;
    int optimizer_steps = 0;
    for (const nlohmann::json& e : trace["traceEvents"]) {
      optimizer_steps += e["ph"] == "X" && e["cat"] == "step" &&
                         e["name"].get<std::string>().find("OPTIMIZER") != std::string::npos;
    }
    const int stages = stem.find("-v2-") != std::string::npos ? 4 : 2;  // P x V
    EXPECT_EQ(optimizer_steps, 2 * stages) << stem;  // one per stage in each timeline
    EXPECT_THAT(absl::StrJoin(processes, "|"), HasSubstr("(simulated from measured costs)"));
    EXPECT_THAT(absl::StrJoin(processes, "|"), HasSubstr("(measured, median step)"));
    EXPECT_THAT(Slurp(dir + "/" + stem + ".svg"), HasSubstr("</svg>")) << stem;
  }
  // With D = 2 the measured step has P x D rows; the trace keeps replica 0's P, the rows
  // the simulator plans.
  RunResult d2 = RunCli(Tiny(
      {"--schedules=1f1b", "--stages=2", "--microbatches=4", "--replicas=2", "--traces=" + dir}));
  ASSERT_EQ(d2.code, 0) << d2.err << d2.out;
  nlohmann::json trace = nlohmann::json::parse(Slurp(dir + "/1f1b-p2-m4.json"));
  std::set<std::string> processes;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      processes.insert(e["args"]["name"].get<std::string>());
    }
    if (e["ph"] == "X") {
      EXPECT_GE(e["ts"].get<double>(), 0) << e.dump();
    }
  }
  EXPECT_EQ(processes.size(), 4u) << absl::StrJoin(processes, "|");  // 2 timelines x 2 ranks
  EXPECT_THAT(absl::StrJoin(processes, "|"), ::testing::Not(HasSubstr("rank 2")));
}

// An output that cannot be written is refused before the sweep runs, not after it.
TEST(BenchTest, UnwritableOutputsFailBeforeTheSweep) {
  RunResult r = RunCli(Tiny(
      {"--schedules=1f1b", "--stages=2", "--microbatches=2", "--csv=/nonexistent/dir/sweep.csv"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --csv=/nonexistent/dir/sweep.csv: the directory /nonexistent/dir does not "
            "exist; give a file path in a writable directory\n");
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("1f1b")));  // nothing ran
}

TEST(BenchTest, UnsupportedCombinationsAreSkippedWithTheirReason) {
  // ZB-V takes V = 2 only (1F1B ignores --virtual); P=0 is out of range; a slow rank
  // beyond P=2's ranks only skips the configurations it does not fit.
  RunResult r = RunCli(Tiny({"--schedules=zb-v,1f1b", "--stages=0,2,3", "--microbatches=3",
                             "--virtual=3", "--slow-stage=2:1.5"}));
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("--stages=0 is out of range"));
  EXPECT_THAT(r.out, HasSubstr("cannot slow down rank 2"));
  EXPECT_THAT(r.out, HasSubstr("zb-v"));
  EXPECT_THAT(r.out, HasSubstr("1 of 6 configurations ran"));  // 1f1b P=3 only
}

// --recompute-stages=auto chooses per configuration: in a device that holds 1F1B's
// activations but not GPipe's (4 micro-batches per rank), GPipe recomputes and 1F1B does
// not. The sizes come from train's plan of the same tiny model.
TEST(BenchTest, RecomputeStagesAutoChoosesPerConfiguration) {
  const std::string plan_json = TempPath("plan.json"), json = TempPath("auto.json"),
                    csv = TempPath("auto.csv");
  const std::vector<std::string> model = {"--hidden=8",  "--layers=4",          "--inputs=6",
                                          "--classes=4", "--microbatch-size=2", "--backend=host",
                                          "--stages=2",  "--microbatches=4",    "--steps=1"};
  auto planned = [&](const std::string& schedule, const std::string& flag) {
    std::vector<std::string> args = {"train", "--schedule=" + schedule, flag,
                                     "--device-memory=64MiB", "--json=" + plan_json};
    args.insert(args.end(), model.begin(), model.end());
    RunResult r = RunCli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(Slurp(plan_json));
  };
  const nlohmann::json gpipe = planned("gpipe", "--recompute-stages=auto");
  const nlohmann::json gpipe_all = planned("gpipe", "--recompute");
  const nlohmann::json one_f_one_b = planned("1f1b", "--recompute-stages=auto");
  std::int64_t size = 0, gpipe_plain = 0;
  for (const nlohmann::json& place : gpipe["recompute_plan"]["places"]) {
    for (int rank = 0; rank < 2; ++rank) {
      if (place["name"] != "host:" + std::to_string(rank)) continue;
      const std::int64_t state =
          64 * (std::int64_t{1} << 20) - place["available_bytes"].get<std::int64_t>();
      size = std::max(
          {size,
           state + gpipe_all["ranks"][rank]["planned_peak_activation_bytes"].get<std::int64_t>(),
           state + one_f_one_b["recompute_plan"]["peak_bytes_without"][rank].get<std::int64_t>()});
      gpipe_plain =
          std::max(gpipe_plain, state + place["planned_bytes_without"].get<std::int64_t>());
    }
  }
  ASSERT_GT(size, 0);
  ASSERT_LT(size, gpipe_plain) << "the tiny model no longer tells the two apart";

  RunResult r = RunCli(
      Tiny({"--schedules=gpipe,1f1b", "--stages=2", "--microbatches=4", "--recompute-stages=auto",
            "--device-memory=" + std::to_string(size), "--json=" + json, "--csv=" + csv}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("; activation recomputation where the activations do not fit"));
  EXPECT_THAT(r.out, HasSubstr("\n  --recompute-stages=auto: recomputing stage"));
  EXPECT_THAT(r.out, HasSubstr("\n  --recompute-stages=auto: no stage needs to recompute"));
  const nlohmann::json rows = nlohmann::json::parse(Slurp(json))["configurations"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["schedule"], "gpipe");
  EXPECT_FALSE(rows[0]["recompute_stages"].empty()) << rows[0].dump();
  EXPECT_EQ(rows[1]["recompute_stages"], nlohmann::json::array()) << rows[1].dump();
  // The plan's peaks are what the exact-accounting step measured.
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["peak_activation_bytes"], row["simulated_peak_activation_bytes"]) << row.dump();
  }
  std::vector<std::string> lines = absl::StrSplit(Slurp(csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  const auto column = std::find(header.begin(), header.end(), "recompute_stages");
  ASSERT_NE(column, header.end());
  const std::vector<std::string> gpipe_row = absl::StrSplit(lines[1], ',');
  EXPECT_EQ(gpipe_row[column - header.begin()],
            absl::StrJoin(rows[0]["recompute_stages"].get<std::vector<int>>(), ";"));

  r = RunCli(Tiny({"--schedules=gpipe", "--stages=2", "--microbatches=4", "--recompute-stages=0"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "pipesched: --recompute-stages=0: bench takes auto (the stages chosen for each "
            "configuration to fit --device-memory); a list fits one configuration, so run it "
            "with train\n");
  // A searched schedule's order would change after the choice: skipped with the reason.
  r = RunCli(Tiny({"--schedules=zb-1p,1f1b", "--stages=2", "--microbatches=4",
                   "--recompute-stages=auto", "--device-memory=64MiB"}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("skipped: --recompute-stages=auto chooses for the order that will "
                               "run, and zb-1p's is searched afterwards"));
  EXPECT_THAT(r.out, HasSubstr("give --search-steps=0 to run its unit-cost order\n"));
  EXPECT_THAT(r.out, HasSubstr("1 of 2 configurations ran"));
}

// --from: each schedule file is a configuration with its own P, V and M, named as the file
// names it; with --schedules the generated ones run too, and a file named like one of
// them is told apart by its path (and shares its closed form only for the same order).
TEST(BenchTest, ScheduleFilesAreConfigurationsOfTheirOwn) {
  const std::filesystem::path dir = TempPath("from_files");
  std::filesystem::create_directories(dir);
  const std::string one_f_one_b = (dir / "1f1b.csv").string();
  const std::string mine = (dir / "mine.csv").string();
  std::ofstream(one_f_one_b) << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";           // 1F1B at P=2, M=2
  std::ofstream(mine) << "0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1F1,1F2,1B0,1B1,1B2\n";  // GPipe, M=3
  const std::string json = TempPath("from.json");
  const std::filesystem::path traces = dir / "traces";
  std::filesystem::remove_all(traces);
  RunResult r = RunCli(Tiny({"--from=" + mine + "," + one_f_one_b, "--schedules=1f1b", "--stages=2",
                             "--microbatches=2", "--json=" + json, "--traces=" + traces.string()}));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  // The traces of a row named with its path are files of the traces directory.
  std::string renamed = "1f1b (" + one_f_one_b + ")";
  std::replace_if(
      renamed.begin(), renamed.end(),
      [](char c) { return !std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-'; },
      '_');
  EXPECT_TRUE(std::filesystem::exists(traces / (renamed + "-p2-m2.svg"))) << r.out;
  EXPECT_TRUE(std::filesystem::exists(traces / "mine-p2-m3.json")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("3 of 3 configurations ran"));
  const nlohmann::json rows = nlohmann::json::parse(Slurp(json))["configurations"];
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["schedule"], "1f1b");
  EXPECT_TRUE(rows[0]["from"].is_null());
  EXPECT_EQ(rows[1]["schedule"], "mine");
  EXPECT_EQ(rows[1]["from"], mine);
  EXPECT_EQ(rows[1]["stages"], 2);
  EXPECT_EQ(rows[1]["microbatches"], 3);
  EXPECT_TRUE(rows[1]["bubble_closed_form"].is_null());  // no generator of that name
  EXPECT_EQ(rows[2]["schedule"], "1f1b (" + one_f_one_b + ")");
  EXPECT_FALSE(rows[2]["bubble_closed_form"].is_null());  // 1F1B's own order
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["status"], "ok") << row["schedule"];
    EXPECT_EQ(row["peak_activation_bytes"], row["simulated_peak_activation_bytes"]);
  }
  // GPipe's order, run from the file: every rank holds all 3 micro-batches at its peak,
  // more than 1F1B's file at M=2.
  EXPECT_GT(rows[1]["peak_activation_bytes"][1].get<std::int64_t>(),
            rows[2]["peak_activation_bytes"][1].get<std::int64_t>());

  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--from=" + mine, "--stages=2"},
       "pipesched: --stages applies to the generated schedules of --schedules; --from's files "
       "have their own P, V and M: give --schedules too, or drop --stages\n"},
      {{"--from=" + mine + "," + mine},
       "pipesched: --from lists " + mine + " twice; name each file once\n"},
      {{"--from=" + mine + "," + (dir / "." / "mine.csv").string()},
       "pipesched: --from lists " + mine + " twice (also as " + (dir / "." / "mine.csv").string() +
           ", the same file); name each file once\n"},
      {{"--from=" + mine, "--csv=" + mine},
       "pipesched: --csv=" + mine +
           " is also --from: writing it would replace that input; give "
           "--csv another path\n"},
      {{"--from=" + mine, "--max-activations=2"},
       "pipesched: --max-activations applies to the searched schedules (zb-1p, zb-2p, zb-v-1p, "
       "interleaved-zb-1p, zb-v-half, zb-v-min), not to a schedule file, whose order fixes its "
       "memory; drop the flag or name a searched schedule\n"}};
  for (const auto& [flags, message] : bad) {
    RunResult refused = RunCli(Tiny(flags));
    EXPECT_EQ(refused.code, 2) << flags.back();
    EXPECT_EQ(refused.err, message);
  }
}

TEST(BenchTest, NothingRunnableExitsTwo) {
  RunResult r = RunCli(Tiny({"--schedules=dualpipe-v", "--stages=2", "--microbatches=2"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("nothing in the sweep could run"));
  EXPECT_THAT(r.out, HasSubstr("skipped: dualpipe-v needs M >= 2P"));
}

TEST(BenchTest, UnknownOrRepeatedNamesAreRefusedBeforeTheSweep) {
  // A misspelt name is not a configuration to skip: nothing runs, and the line says why.
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--schedules=1f1b,nope"},
            "pipesched: --schedules: unknown schedule \"nope\"; known schedules: gpipe, 1f1b,"},
           {{"--schedules=1f1b,1f1b"}, "pipesched: --schedules lists 1f1b twice"},
           {{"--stages=2,2"}, "pipesched: --stages=2,2 lists 2 twice; name each value once\n"},
           {{"--schedules=1f1b,zb-h1", "--virtual=3"},
            "pipesched: --virtual=3 applies to the schedules with several chunks per rank "
            "(interleaved-1f1b, "},
           {{"--schedules=1f1b", "--max-activations=2"},
            "pipesched: --max-activations applies to the searched schedules"},
           // It was silently unused: no schedule of the sweep is searched.
           {{"--schedules=1f1b,gpipe", "--search-steps=5"},
            "pipesched: --search-steps applies to the searched schedules (zb-1p, zb-2p, "
            "zb-v-1p, interleaved-zb-1p, zb-v-half, zb-v-min), not to 1f1b, whose order is "
            "given, not searched; drop the flag or name a searched schedule\n"},
           {{"--schedules=1f1b", "--optimizer=adamw", "--momentum=0.5"},
            "pipesched: --momentum is SGD's; --optimizer=adamw keeps its moments with beta1 = "
            "0.9 and beta2 = 0.999: drop --momentum, or use --optimizer=sgd\n"}}) {
    RunResult r = RunCli(Tiny(flags));
    EXPECT_EQ(r.code, 2) << message;
    EXPECT_THAT(r.err, ::testing::StartsWith(message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(BenchTest, MalformedFlagsAreOneLineAndExitTwo) {
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"--slow-stage=1", "--slow-stage=1: write RANK:FACTOR"},
           {"--slow-stage=1:0.5", "--slow-stage=1:0.5: write RANK:FACTOR"},
           {"--slow-stage=x:2", "--slow-stage=x:2: write RANK:FACTOR"},
           {"--stages=2,x", "--stages=2,x: 'x' is not an integer"},
           {"--stages=99999999999", "'99999999999' is far too large; write e.g. 2,4"},
           {"--microbatches=", "--microbatches= has an empty value"},
           {"--warmup=-1", "--warmup=-1 is out of range"},
           {"--steps=0", "--steps=0 is out of range"},
           {"--backend=tpu", "--backend=tpu is not one of auto, host, cuda"},
           {"--traces=/proc/version/x",
            "--traces=/proc/version/x: /proc/version is not a directory; give a directory inside "
            "an existing one (bench creates only the last)"},
           // A mistyped parent is not created.
           {"--traces=/nonexistent-pipesched/a/b",
            "--traces=/nonexistent-pipesched/a/b: /nonexistent-pipesched/a does not exist"},
           {"--grid", "unknown flag --grid for 'bench'"}}) {
    RunResult r = RunCli(Tiny({flag}));
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_THAT(r.err, HasSubstr(message)) << flag;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace pipesched::cli
