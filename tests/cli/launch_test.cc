// `pipesched launch`, driven in-process with small shell programs as its processes: each
// is told its rank and the rendezvous through the environment, their output is relayed
// line by line, one that fails stops the others (their own children too), and what the
// launcher cannot start is one line and exit 2. Launching `train` itself needs the
// pipesched program: CliMain.LaunchTrainsAsOneProcessWithBothReplicas (CMakeLists.txt).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/scoped_environment.h"

namespace pipesched::cli {
namespace {

// `launch -- train` starts the program it runs in, which here is this test: should the
// launcher's check that refuses a bad train command line before starting anything
// regress, each copy it started would run every test again. Such a copy exits at once,
// with code 3, which the test then sees as the processes' failure.
[[maybe_unused]] const bool kStartedAsTrain = [] {
  std::FILE* f = std::fopen("/proc/self/cmdline", "rb");
  if (f == nullptr) return false;
  char buffer[4096] = {};
  const std::size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
  std::fclose(f);
  const std::size_t first = std::strlen(buffer);  // argv[0], then argv[1]
  if (first + 1 < n && std::strcmp(buffer + first + 1, "train") == 0) std::_Exit(3);
  return false;
}();

using ::pipesched::cli::testing::RunCli;
using ::pipesched::cli::testing::RunResult;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// A fresh directory that stands for $TMPDIR while the test runs (the launcher makes its
// temporary rendezvous there), restored and removed afterwards.
class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("launch_test_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(tmp_);
    std::filesystem::create_directories(tmp_);
    tmpdir_.emplace(std::map<std::string, std::optional<std::string>>{{"TMPDIR", tmp_.string()}});
  }
  void TearDown() override {
    tmpdir_.reset();
    std::filesystem::remove_all(tmp_);
  }
  // What the launcher left in $TMPDIR.
  std::vector<std::string> Left() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(tmp_))
      names.push_back(entry.path().filename().string());
    return names;
  }
  std::filesystem::path tmp_;

 private:
  std::optional<pipesched::testing::ScopedEnvironment> tmpdir_;
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines;
}

TEST_F(LaunchTest, EachProcessIsToldItsRankAndItsOutputIsRelayed) {
  const std::string program = absl::StrCat(
      "echo rank $PIPESCHED_PROCESS_RANK of $PIPESCHED_PROCESSES timeout "
      "$PIPESCHED_RENDEZVOUS_TIMEOUT; echo \"$PIPESCHED_RENDEZVOUS\" > ",
      tmp_.string(),
      "/rdv.$PIPESCHED_PROCESS_RANK; echo warning $PIPESCHED_PROCESS_RANK >&2; "
      "printf 'no newline'");
  // Process 0's standard output as it is, everyone's errors after [RANK].
  RunResult first =
      RunCli({"launch", "--processes=3", "--rendezvous-timeout=40", "--", "sh", "-c", program});
  EXPECT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(first.out, "rank 0 of 3 timeout 40\nno newline");  // byte for byte
  EXPECT_THAT(Lines(first.err),
              UnorderedElementsAre("[0] warning 0", "[1] warning 1", "[2] warning 2"));
  // One rendezvous path for all, in a new directory of $TMPDIR that is gone afterwards.
  const std::string rdv = testing::Slurp((tmp_ / "rdv.0").string());
  EXPECT_THAT(rdv, HasSubstr((tmp_ / "pipesched-launch-").string()));
  EXPECT_THAT(rdv, HasSubstr("/rendezvous\n"));
  EXPECT_EQ(testing::Slurp((tmp_ / "rdv.2").string()), rdv);
  std::vector<std::string> left = Left();
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"rdv.0", "rdv.1", "rdv.2"}));
  // A line longer than 64 KiB arrives in pieces of 64 KiB, each after its prefix.
  RunResult long_line = RunCli({"launch", "--processes=2", "--output=all", "--", "sh", "-c",
                                "if [ $PIPESCHED_PROCESS_RANK = 1 ]; then head -c 150000 "
                                "/dev/zero | tr '\\0' a; echo; fi"});
  EXPECT_EQ(long_line.code, 0) << long_line.err;
  const std::string piece = "[1] " + std::string(65536, 'a') + "\n";
  EXPECT_EQ(long_line.out, piece + piece + "[1] " + std::string(150000 - 2 * 65536, 'a') + "\n");
  // A program of the user's takes arguments of any bytes: a script of two lines.
  RunResult script = RunCli({"launch", "--processes=2", "--", "sh", "-c", "echo one\necho two"});
  EXPECT_EQ(script.code, 0) << script.err;
  EXPECT_EQ(script.out, "one\ntwo\n");
  // Everyone's output, each line after [RANK]; a given --rendezvous is passed as it is.
  const std::string given = (tmp_ / "given").string();
  RunResult all = RunCli(
      {"launch", "--processes=2", "--output=all", "--rendezvous=" + given, "sh", "-c", program});
  EXPECT_EQ(all.code, 0) << all.err;
  EXPECT_THAT(Lines(all.out),
              UnorderedElementsAre("[0] rank 0 of 2 timeout 300", "[1] rank 1 of 2 timeout 300",
                                   "[0] no newline", "[1] no newline"));
  // launch creates the given directory (it must not exist), and the processes meet in it.
  EXPECT_EQ(testing::Slurp((tmp_ / "rdv.1").string()), given + "/rendezvous\n");
  EXPECT_FALSE(std::filesystem::exists(given));
}

TEST_F(LaunchTest, AFailedProcessStopsTheOthersAndWhatTheyStarted) {
  // Rank 1 fails at once; the others would run a minute, and each started a child that
  // writes a marker after a second unless it is stopped with its process.
  const std::string marker = (tmp_ / "marker.").string();
  const std::string program = absl::StrCat(
      "if [ $PIPESCHED_PROCESS_RANK = 1 ]; then echo cannot go on >&2; exit 3; fi; "
      "(sleep 1; touch ",
      marker, "$PIPESCHED_PROCESS_RANK) & sleep 60");
  const auto start = std::chrono::steady_clock::now();
  RunResult r = RunCli({"launch", "--processes=3", "--grace=0.2", "--", "sh", "-c", program});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("[1] cannot go on\n"));
  EXPECT_THAT(r.err, HasSubstr("pipesched launch: process 1 exited with code 3; the others get "
                               "0.2 s to stop\n"));
  EXPECT_THAT(r.err, HasSubstr("pipesched launch: stopping processes 0, 2: still running 0.2 s "
                               "after process 1 exited with code 3\n"));
  EXPECT_LT(seconds, 30) << "the others ran on";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(std::filesystem::exists(marker + "0")) << "process 0's child outlived it";
  EXPECT_FALSE(std::filesystem::exists(marker + "2")) << "process 2's child outlived it";
  EXPECT_TRUE(Left().empty());  // the temporary rendezvous is gone too

  // A process killed by a signal: the launch's code is 128 + the signal, as a shell's.
  RunResult killed = RunCli({"launch", "--processes=2", "--", "sh", "-c",
                             "if [ $PIPESCHED_PROCESS_RANK = 0 ]; then kill -9 $$; fi"});
  EXPECT_EQ(killed.code, 137);
  EXPECT_THAT(killed.err, HasSubstr("pipesched launch: process 0 was killed by signal 9"));

  // A process that ended well but left a child running, and another that failed: the
  // child is stopped with the job.
  RunResult leftover =
      RunCli({"launch", "--processes=2", "--grace=0.2", "--", "sh", "-c",
              absl::StrCat("if [ $PIPESCHED_PROCESS_RANK = 0 ]; then (sleep 1; touch ", marker,
                           "left) & exit 0; fi; sleep 0.3; exit 4")});
  EXPECT_EQ(leftover.code, 4);
  EXPECT_THAT(leftover.err, HasSubstr("pipesched launch: process 1 exited with code 4\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(std::filesystem::exists(marker + "left")) << "process 0's child outlived the job";

  // A process that stops (SIGTTIN when it reads the terminal from its background process
  // group; SIGSTOP here) would wait forever: a failure, and it is continued to be stopped.
  RunResult stopped = RunCli({"launch", "--processes=2", "--grace=0.2", "--", "sh", "-c",
                              "if [ $PIPESCHED_PROCESS_RANK = 1 ]; then kill -STOP $$; fi; "
                              "sleep 60"});
  EXPECT_EQ(stopped.code, 1);
  EXPECT_THAT(stopped.err,
              HasSubstr("pipesched launch: process 1 was stopped by signal 19 (Stopped (signal)): "
                        "launched processes have no terminal to read or write; the others get "
                        "0.2 s to stop\n"));
  EXPECT_THAT(stopped.err, HasSubstr("stopping processes 0, 1: still running 0.2 s after"));

  // Exit statuses are read even when the launcher was started with SIGCHLD ignored (which
  // makes the kernel reap children itself): a failure stays a failure.
  struct sigaction ignore = {}, old = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGCHLD, &ignore, &old);
  RunResult unreaped = RunCli({"launch", "--processes=2", "--", "sh", "-c", "exit 5"});
  sigaction(SIGCHLD, &old, nullptr);
  EXPECT_EQ(unreaped.code, 5) << unreaped.err;

  // A rendezvous that the processes made and left behind is removed.
  const std::string given = (tmp_ / "given").string();
  RunResult left = RunCli({"launch", "--processes=2", "--rendezvous=" + given, "--", "sh", "-c",
                           "mkdir -p \"$PIPESCHED_RENDEZVOUS\"; touch \"$PIPESCHED_RENDEZVOUS/x\"; "
                           "exit 1"});
  EXPECT_EQ(left.code, 1);
  EXPECT_FALSE(std::filesystem::exists(given));
}

// A pipesched train started by launch as a program (by its path, or from a script) finds
// its job in the environment, as any launched program does; process flags given to it
// there, without --processes, are refused rather than half used.
TEST_F(LaunchTest, TrainStartedByLaunchAsAProgramTakesItsJobFromTheEnvironment) {
  RunResult r;
  RunResult ranked;
  {
    pipesched::testing::ScopedEnvironment env(
        std::map<std::string, std::optional<std::string>>{{"PIPESCHED_PROCESSES", "2"}});
    r = RunCli({"train", "--stages=2", "--microbatches=2", "--layers=2", "--hidden=8", "--steps=1",
                "--backend=host", "--rendezvous=" + (tmp_ / "x").string()});
    ranked = RunCli({"train", "--stages=2", "--microbatches=2", "--layers=2", "--hidden=8",
                     "--steps=1", "--backend=host", "--process-rank=0"});
  }
  EXPECT_EQ(ranked.code, 2);
  EXPECT_THAT(ranked.err, HasSubstr("pipesched: --process-rank is given without --processes"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("pipesched: --rendezvous is given without --processes while "
                               "PIPESCHED_PROCESSES is set (this process was started by "
                               "`pipesched launch`, which gives the job in the environment): "
                               "give every process flag, or none"));
  EXPECT_TRUE(Left().empty());
}

TEST_F(LaunchTest, WhatCannotBeLaunchedIsOneLine) {
  const std::string existing = (tmp_ / "existing").string();
  std::filesystem::create_directories(existing);
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"launch", "--", "true"}, "launch needs --processes=N: how many processes to start"},
      {{"launch", "--processes=1", "--", "true"},
       "--processes=1 is out of range for launch: use 2 to 4096 (for one process, run the "
       "command itself)"},
      {{"launch", "--processes=2"}, "launch needs the command each process runs, after --"},
      {{"launch", "--processes=2", "--output=some", "--", "true"},
       "--output=\"some\" is not a choice: use first or all"},
      {{"launch", "--processes=2", "--grace=-1", "--", "true"},
       "--grace=-1 is out of range: give 0 to 86400 seconds"},
      {{"launch", "--processes=2", "--rendezvous-timeout=0.5", "--", "true"},
       "--rendezvous-timeout=0.5 must be at least 1 second"},
      {{"launch", "--processes=2", "--", "simulate", "--stages=2"},
       "'simulate' runs as one process; launch starts the processes of a training job: `-- "
       "train ...` or `-- bench ...`"},
      {{"launch", "--processes=2", "--", "train", "--process-rank=1"},
       "train's --process-rank is launch's to set (each process gets its own --process-rank): "
       "give --processes, --rendezvous and --rendezvous-timeout to launch, before --"},
      {{"launch", "--processes=2", "train", "--rendezvous", "x"},
       "train's --rendezvous is launch's"},
      {{"launch", "--processes=2", "--rendezvous=" + existing, "--", "true"},
       "exists already (an earlier run that did not end cleanly, or another job?): remove it, "
       "give a new path, or leave --rendezvous out for a temporary one"},
      {{"launch", "--processes=2", "--", "no-such-program-pipesched"},
       "cannot start \"no-such-program-pipesched\": No such file or directory; give a program on "
       "PATH or its path"},
      {{"launch", "--processes=2", "--stages=2", "--", "true"}, "unknown flag --stages"},
      {{"launch", "--processes=2", "--nodes=2", "--", "true"},
       "--nodes=2 needs --rendezvous=DIR: a path every host sees"},
      {{"launch", "--processes=2", "--node-rank=1", "--", "true"},
       "--node-rank is for a job on several hosts: give --nodes=K (K > 1) too, or drop it"},
      {{"launch", "--processes=2", "--nodes=2", "--node-rank=2", "--rendezvous=x", "--", "true"},
       "--node-rank=2 is out of range for --nodes=2: use 0 to 1"},
      {{"launch", "--processes=0", "--nodes=2", "--rendezvous=x", "--", "true"},
       "--processes=0 on each of --nodes=2 is out of range"},
      {{"launch", "--processes=2", "--nodes=0", "--", "true"}, "--nodes=0 is out of range"},
      // What every train process would refuse is refused once, by launch, before any
      // starts: its flags, their values and combinations, the schedule, the partition.
      {{"launch", "--processes=3", "--", "train", "--lr=-1"}, "--lr=-1 must be a positive number"},
      {{"launch", "--processes=2", "--", "train", "--mpi"},
       "--mpi is for processes that an MPI launcher starts (`mpirun -n N pipesched train --mpi "
       "...`); `pipesched launch` gives its processes their job itself: drop --mpi"},
      {{"launch", "--processes=2", "--", "train", "--bogus"}, "unknown flag --bogus for 'train'"},
      {{"launch", "--processes=2", "--", "train", "--stages=2", "extra"},
       "unexpected argument 'extra'; train takes only --flags"},
      {{"launch", "--processes=2", "--", "train", "--schedule=nope"}, "unknown schedule \"nope\""},
      {{"launch", "--processes=2", "--", "train", "--schedule=interleaved-1f1b", "--stages=2",
        "--virtual=2", "--layers=1"},
       "1 blocks + head = 2 layers cannot fill 4 chunks"},
      {{"launch", "--processes=2", "--", "train", "--save=" + (tmp_ / "no" / "x").string()},
       "/no does not exist"},
      {{"launch", "--processes=2", "--", "train", "--recompute-stages=auto"},
       "--recompute-stages=auto plans for this machine's memory"},
      // An input that is not there, and an output under /proc (not a process's own
      // descriptor): said once, not by every process.
      {{"launch", "--processes=2", "--", "train", "--data=" + (tmp_ / "none.safetensors").string()},
       "none.safetensors: no such file; give the path of one that every process can read"},
      {{"launch", "--processes=2", "--", "train", "--save=/proc/x"},
       "--save=/proc/x: the directory /proc takes no new file"},
      // bench's likewise: the job's flags and the sweep's.
      {{"launch", "--processes=2", "--", "bench", "--processes=3"},
       "bench's --processes is launch's to set"},
      {{"launch", "--processes=2", "--", "bench", "--mpi"},
       "--mpi is for processes that an MPI launcher starts (`mpirun -n N pipesched bench --mpi "
       "...`)"},
      {{"launch", "--processes=4", "--", "bench", "--pipeline-processes=3"},
       "--pipeline-processes=3 does not divide --processes=4: give a divisor of 4"},
      {{"launch", "--processes=2", "--", "bench", "--recompute-stages=auto"},
       "--recompute-stages=auto plans for this machine's memory, which may differ between "
       "processes: run bench as one process, or train with a --recompute-stages list"},
      {{"launch", "--processes=2", "--", "bench", "--split-stages", "--backend=cuda"},
       "--split-stages runs on the host backend only"},
      {{"launch", "--processes=2", "--", "bench", "--stages=2,x"}, "--stages"},
      {{"launch", "--processes=2", "--", "bench", "--bogus"}, "unknown flag --bogus for 'bench'"},
      {{"launch", "--processes=2", "--", "bench", "extra"},
       "unexpected argument 'extra'; bench takes only --flags"},
  };
  for (const auto& [args, message] : refused) {
    RunResult r = RunCli(args);
    EXPECT_EQ(r.code, 2) << args[1];
    EXPECT_THAT(r.err, HasSubstr(message)) << args[1];
    EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // A bad PIPESCHED_RENDEZVOUS_EVENTS is said once, before any train or bench starts.
  for (const char* command : {"train", "bench"}) {
    setenv("PIPESCHED_RENDEZVOUS_EVENTS", "yes", 1);
    RunResult r = RunCli({"launch", "--processes=2", "--", command, "--stages=2"});
    unsetenv("PIPESCHED_RENDEZVOUS_EVENTS");
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_EQ(
        r.err,
        "pipesched: PIPESCHED_RENDEZVOUS_EVENTS=\"yes\" is not 0 or 1: give 1 (the default: a "
        "receive is woken when its message appears in the rendezvous directory) or 0 (it "
        "only looks)\n")
        << command;
  }
  EXPECT_EQ(Left(), std::vector<std::string>{"existing"});
  // A --help after launch's flags (one given as "--flag VALUE") is launch's.
  EXPECT_THAT(RunCli({"launch", "--rendezvous", "x", "--help"}).out,
              HasSubstr("usage: pipesched launch"));
  // A --help after the command is the command's, not launch's.
  RunResult help = RunCli({"launch", "--processes=2", "--", "sh", "-c", "echo $1", "sh", "--help"});
  EXPECT_EQ(help.code, 0) << help.err;
  EXPECT_EQ(help.out, "--help\n");
  EXPECT_THAT(RunCli({"help", "launch"}).out, HasSubstr("usage: pipesched launch --processes=N"));
}

}  // namespace
}  // namespace pipesched::cli
