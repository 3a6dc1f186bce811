// comm/bootstrap.h, groups of a job's processes: CreateGroupBootstrap keeps a
// bootstrap's contract among its members only (exchanges in call order per channel,
// point to point, agreement naming the job's processes), independently of the job's own
// exchanges and of other groups on the same channel names; SplitJob lays out a job of N
// as N / K pipelines of K processes.
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/comm/bootstrap.h"
#include "testing/status_matchers.h"

namespace pipesched::comm {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Runs body(rank) on `size` threads at once and joins them.
template <typename Body>
void OnThreads(int size, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&body, r] { body(r); });
  for (std::thread& t : threads) t.join();
}

TEST(GroupBootstrapTest, SplitJobLaysOutPipelinesAcrossReplicaGroups) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(6));
  // K = 3: two pipelines of three processes; the replicas of a block are consecutive.
  const std::vector<std::vector<int>> pipeline_of = {{0, 2, 4}, {1, 3, 5}, {0, 2, 4},
                                                     {1, 3, 5}, {0, 2, 4}, {1, 3, 5}};
  const std::vector<std::vector<int>> replicas_of = {{0, 1}, {0, 1}, {2, 3},
                                                     {2, 3}, {4, 5}, {4, 5}};
  for (int q = 0; q < 6; ++q) {
    PS_ASSERT_OK_AND_ASSIGN(JobGrid grid, SplitJob(*job[q], 3));
    ASSERT_EQ(grid.pipeline->size(), 3) << q;
    ASSERT_EQ(grid.replicas->size(), 2) << q;
    EXPECT_EQ(grid.pipeline->rank(), q / 2) << q;
    EXPECT_EQ(grid.replicas->rank(), q % 2) << q;
    EXPECT_EQ(grid.pipeline->kind(), "in-process");
    for (int i = 0; i < 3; ++i) EXPECT_EQ(grid.pipeline->job_rank(i), pipeline_of[q][i]) << q;
    for (int i = 0; i < 2; ++i) EXPECT_EQ(grid.replicas->job_rank(i), replicas_of[q][i]) << q;
  }
  // K = 1 and K = N: one of the two groups is the process alone.
  PS_ASSERT_OK_AND_ASSIGN(JobGrid whole, SplitJob(*job[4], 1));
  EXPECT_EQ(whole.pipeline->size(), 1);
  EXPECT_EQ(whole.replicas->size(), 6);
  EXPECT_EQ(whole.replicas->rank(), 4);
  PS_ASSERT_OK_AND_ASSIGN(JobGrid one, SplitJob(*job[4], 6));
  EXPECT_EQ(one.pipeline->size(), 6);
  EXPECT_EQ(one.pipeline->rank(), 4);
  EXPECT_EQ(one.replicas->size(), 1);
  PS_ASSERT_OK_AND_ASSIGN(auto alone, one.replicas->AllGather("x", "mine"));
  EXPECT_THAT(alone, ElementsAre("mine"));
  for (int k : {0, 4, 7, -2}) {
    EXPECT_THAT(SplitJob(*job[0], k),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("a job of 6 processes cannot be split into "
                                                "pipelines of ",
                                                k, " processes: give a divisor of 6"))));
  }
}

// AgreeOnVerdict on a job of 6 split into two pipelines of three: every process hears
// the first failure of all (in the pipeline's order, then the replicas'), with its code,
// in its own words where it is its own and naming its process in the others'; marked
// HeardByAll, and the job not failed. Every process passing gives OK everywhere; alone,
// a process's own verdict comes back unmarked.
TEST(GroupBootstrapTest, AVerdictIsHeardByEveryProcessOfBothGroups) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(6, {.timeout_seconds = 20}));
  std::vector<JobGrid> grids(6);
  for (int q = 0; q < 6; ++q) {
    PS_ASSERT_OK_AND_ASSIGN(grids[q], SplitJob(*job[q], 3));
  }
  // Processes 3 and 4 fail, in pipelines {1,3,5} and {0,2,4}.
  std::vector<absl::Status> verdicts(6);
  OnThreads(6, [&](int q) {
    absl::Status own = q == 3   ? absl::ResourceExhaustedError("host:0 is full")
                       : q == 4 ? absl::InvalidArgumentError("bad input")
                                : absl::OkStatus();
    verdicts[q] = AgreeOnVerdict({grids[q].pipeline.get(), grids[q].replicas.get()}, "fits", own);
  });
  // Pipeline {0,2,4} hears process 4's failure, pipeline {1,3,5} process 3's; then the
  // replica groups {0,1}, {2,3}, {4,5} each take their first member's: process 4's.
  for (int q = 0; q < 6; ++q) {
    SCOPED_TRACE(q);
    EXPECT_TRUE(HeardByAll(verdicts[q]));
    EXPECT_THAT(verdicts[q], StatusIs(absl::StatusCode::kInvalidArgument,
                                      q == 4 ? "bad input" : "process 4: bad input"));
    PS_EXPECT_OK(job[q]->Failure());
  }
  // Everyone passes: OK, in both groups, on the same channel again.
  OnThreads(6, [&](int q) {
    verdicts[q] = AgreeOnVerdict({grids[q].pipeline.get(), grids[q].replicas.get()}, "fits",
                                 absl::OkStatus());
  });
  for (int q = 0; q < 6; ++q) PS_EXPECT_OK(verdicts[q]) << q;
  // One group only (the other null): its own words for the one that failed.
  OnThreads(3, [&](int i) {
    const int q = 2 * i;  // pipeline {0,2,4}
    verdicts[q] = AgreeOnVerdict({grids[q].pipeline.get(), nullptr}, "one",
                                 q == 2 ? absl::ResourceExhaustedError("full") : absl::OkStatus());
  });
  EXPECT_THAT(verdicts[2], StatusIs(absl::StatusCode::kResourceExhausted, "full"));
  EXPECT_THAT(verdicts[0], StatusIs(absl::StatusCode::kResourceExhausted, "process 2: full"));
  EXPECT_TRUE(HeardByAll(verdicts[0]));
  // Alone (groups of one, or none): the process's own verdict, not heard by anyone else.
  PS_ASSERT_OK_AND_ASSIGN(JobGrid whole, SplitJob(*job[0], 6));
  const absl::Status alone =
      AgreeOnVerdict({whole.replicas.get(), nullptr}, "alone", absl::AbortedError("mine"));
  EXPECT_THAT(alone, StatusIs(absl::StatusCode::kAborted, "mine"));
  EXPECT_FALSE(HeardByAll(alone));
  EXPECT_FALSE(HeardByAll(absl::OkStatus()));
  EXPECT_FALSE(HeardByAll(absl::ResourceExhaustedError("not agreed")));
}

// On a job of 6, every process exchanges on channel "x" three ways at once, each on its
// own thread: in its pipeline, among its replicas, and in the whole job. Each gets its
// own group's parts, in call order, three calls deep.
TEST(GroupBootstrapTest, GroupsExchangeIndependentlyOfEachOtherAndOfTheJob) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(6, {.timeout_seconds = 20}));
  std::vector<JobGrid> grids(6);
  for (int q = 0; q < 6; ++q) {
    PS_ASSERT_OK_AND_ASSIGN(grids[q], SplitJob(*job[q], 3));
  }
  // [process][way][call] -> parts
  std::vector<std::vector<std::vector<std::vector<std::string>>>> got(
      6, std::vector<std::vector<std::vector<std::string>>>(3));
  OnThreads(18, [&](int t) {
    const int q = t / 3, way = t % 3;
    Bootstrap& b = way == 0 ? *grids[q].pipeline : way == 1 ? *grids[q].replicas : *job[q];
    for (int k = 0; k < 3; ++k) {
      if ((q + k + way) % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      auto all = b.AllGather("x", absl::StrCat(way, ":", q, ":", k));
      ASSERT_TRUE(all.ok()) << all.status();
      got[q][way].push_back(*all);
    }
  });
  for (int q = 0; q < 6; ++q) {
    for (int way = 0; way < 3; ++way) {
      ASSERT_EQ(got[q][way].size(), 3u);
      const Bootstrap& b = way == 0 ? *grids[q].pipeline : way == 1 ? *grids[q].replicas : *job[q];
      for (int k = 0; k < 3; ++k) {
        std::vector<std::string> expected;
        for (int i = 0; i < b.size(); ++i)
          expected.push_back(absl::StrCat(way, ":", b.job_rank(i), ":", k));
        EXPECT_THAT(got[q][way][k], ElementsAreArray(expected)) << q << " " << way << " " << k;
      }
    }
  }
}

// Two groups of the same two processes, named apart, exchange on one channel name at
// once without taking each other's parts.
TEST(GroupBootstrapTest, GroupsOfTheSameProcessesAreKeptApartByName) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(2, {.timeout_seconds = 20}));
  std::vector<std::vector<std::string>> got(4);
  OnThreads(4, [&](int t) {
    const int q = t / 2;
    const std::string name = t % 2 == 0 ? "first" : "second";
    auto group = CreateGroupBootstrap(*job[q], {0, 1}, name);
    ASSERT_TRUE(group.ok()) << group.status();
    for (int k = 0; k < 3; ++k) {
      auto all = (*group)->AllGather("x", absl::StrCat(name, q, ":", k));
      ASSERT_TRUE(all.ok()) << all.status();
      got[t].push_back(absl::StrJoin(*all, ","));
    }
  });
  EXPECT_THAT(got[0], ElementsAre("first0:0,first1:0", "first0:1,first1:1", "first0:2,first1:2"));
  EXPECT_EQ(got[2], got[0]);
  EXPECT_THAT(got[1],
              ElementsAre("second0:0,second1:0", "second0:1,second1:1", "second0:2,second1:2"));
  EXPECT_EQ(got[3], got[1]);
}

// A group of job ranks {4, 1, 3} (in that order) of a job of 5: point to point between
// group ranks, long channels kept apart, agreement naming the job's processes, and Close
// leaving the job open.
TEST(GroupBootstrapTest, AGroupKeepsTheContractAndNamesTheJobsProcesses) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(5, {.timeout_seconds = 20}));
  const std::vector<int> members = {4, 1, 3};
  std::vector<std::unique_ptr<Bootstrap>> group(3);
  for (int i = 0; i < 3; ++i) {
    PS_ASSERT_OK_AND_ASSIGN(group[i], CreateGroupBootstrap(*job[members[i]], members, "g7"));
    EXPECT_EQ(group[i]->rank(), i);
    EXPECT_EQ(group[i]->size(), 3);
  }
  const std::string long_a = std::string(63, 'c') + "a", long_b = std::string(63, 'c') + "b";
  std::vector<std::string> from_previous(3), on_a(3), on_b(3);
  std::vector<absl::Status> agreed(3), differ(3);
  OnThreads(3, [&](int i) {
    Bootstrap& g = *group[i];
    ASSERT_TRUE(g.Send((i + 1) % 3, "ring", absl::StrCat("from ", i)).ok());
    auto got = g.Receive((i + 2) % 3, "ring");
    ASSERT_TRUE(got.ok()) << got.status();
    from_previous[i] = *got;
    // Two 64-character channels that differ in their last character stay apart.
    auto a = g.AllGather(long_a, absl::StrCat("a", i));
    auto b = g.AllGather(long_b, absl::StrCat("b", i));
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    on_a[i] = absl::StrJoin(*a, ",");
    on_b[i] = absl::StrJoin(*b, ",");
    agreed[i] = CheckAgreement(g, "cfg", "configuration", "P=2");
    differ[i] = CheckAgreement(g, "cfg", "configuration", i == 2 ? "P=4" : "P=2");
  });
  EXPECT_THAT(from_previous, ElementsAre("from 2", "from 0", "from 1"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(on_a[i], "a0,a1,a2");
    EXPECT_EQ(on_b[i], "b0,b1,b2");
    PS_EXPECT_OK(agreed[i]);
    // Group rank 2 is the job's process 3, group rank 0 the job's process 4.
    EXPECT_THAT(differ[i], StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("process 3's configuration differs from process "
                                              "4's (\"P=4\" against \"P=2\")")));
  }
  // Refusals in the group's own ranks.
  EXPECT_THAT(group[1]->Send(3, "x", ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("peer rank 3 is out of range for 3 processes: use 0 to 2")));
  EXPECT_THAT(group[1]->Receive(1, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from itself")));
  EXPECT_THAT(group[1]->AllGather("a.b", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not 1 to 64 characters")));
  std::vector<absl::Status> closed(3);
  OnThreads(3, [&](int i) { closed[i] = group[i]->Close(); });
  for (const absl::Status& s : closed) PS_EXPECT_OK(s);
  EXPECT_THAT(group[0]->AllGather("x", ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the group 'g7' of the job's processes is closed")));
  // The job itself is open still: all five exchange and close.
  std::vector<absl::Status> job_closed(5);
  OnThreads(5, [&](int q) {
    job_closed[q] = Barrier(*job[q], "after");
    if (job_closed[q].ok()) job_closed[q] = job[q]->Close();
  });
  for (const absl::Status& s : job_closed) PS_EXPECT_OK(s);
}

// A member that never comes: the job's timeout, naming the group and its channel (not only
// the job's channel the group's messages travel on).
TEST(GroupBootstrapTest, ATimeoutNamesTheGroupAndItsChannel) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(3, {.timeout_seconds = 0.2}));
  PS_ASSERT_OK_AND_ASSIGN(auto group, CreateGroupBootstrap(*job[2], {2, 0}, "late"));
  EXPECT_THAT(group->AllGather("stage-1", "x"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("in the group 'late' of processes [2, 0], channel 'stage-1': ")));
  EXPECT_THAT(group->Receive(1, "act"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("in the group 'late' of processes [2, 0], channel 'act': ")));
}

TEST(GroupBootstrapTest, MembersThatDisagreeAreNamed) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(3, {.timeout_seconds = 20}));
  // Process 1 lists the members in another order: the group's ranks would not match.
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateGroupBootstrap(*job[0], {0, 1}, "pair"));
  PS_ASSERT_OK_AND_ASSIGN(auto one, CreateGroupBootstrap(*job[1], {1, 0}, "pair"));
  absl::Status at_zero, at_one;
  OnThreads(2, [&](int i) {
    (i == 0 ? at_zero : at_one) = (i == 0 ? *zero : *one).AllGather("x", "").status();
  });
  EXPECT_THAT(at_zero, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("process 1 is not in the same group 'pair' of processes "
                                          "[0, 1] as this one: every member of a group needs the "
                                          "same name and members")));
  EXPECT_THAT(at_one, StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("process 0 is not in the same group 'pair' of processes "
                                         "[1, 0]")));
}

TEST(GroupBootstrapTest, BadGroupsAreRefused) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(4));
  for (const char* name : {"", "a_b", "pipe-1", "abcdefghijklmnopq"}) {
    EXPECT_THAT(CreateGroupBootstrap(*job[0], {0, 1}, name),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("is not 1 to 16 letters and digits")))
        << name;
  }
  EXPECT_THAT(CreateGroupBootstrap(*job[0], {}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one member")));
  EXPECT_THAT(CreateGroupBootstrap(*job[0], {0, 4}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("group member 4 is not a process of the job: use 0 to 3")));
  EXPECT_THAT(CreateGroupBootstrap(*job[0], {0, 2, 2}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("process 2 is a member of the group twice")));
  EXPECT_THAT(CreateGroupBootstrap(*job[0], {1, 2}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("this process (rank 0 of the job) is not a member of the group "
                                 "[1, 2]")));
}

// A group's Fail is the job's (every process hears it), and its Abort is this process's
// in the job (a group's wait is a wait of the job's).
TEST(GroupBootstrapTest, FailureAndAbortAreTheJobs) {
  PS_ASSERT_OK_AND_ASSIGN(auto job, CreateInProcessBootstraps(4, {.timeout_seconds = 20}));
  PS_ASSERT_OK_AND_ASSIGN(JobGrid grid0, SplitJob(*job[0], 2));
  PS_ASSERT_OK_AND_ASSIGN(JobGrid grid3, SplitJob(*job[3], 2));
  // Process 0 waits for its pipeline partner (process 2), which never sends.
  absl::Status waited;
  std::thread waiter([&] { waited = grid0.pipeline->Receive(1, "act").status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  grid0.pipeline->Abort();
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kCancelled, HasSubstr("abort")));
  EXPECT_THAT(job[0]->AllGather("x", ""),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("abort")));
  // Process 3 fails through its replica group: process 1, in neither of its groups'
  // exchanges with it, hears it in the job.
  grid3.replicas->Fail("stage 1 ran out of memory");
  EXPECT_THAT(job[1]->Failure(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 3 failed: stage 1 ran out of memory")));
  EXPECT_THAT(grid3.pipeline->Failure(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("process 3 failed")));
}

// The same grid on the file kind: messages through the directory.
TEST(GroupBootstrapTest, FileJobsSplitToo) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    absl::StrCat("group_bootstrap_test_", ::getpid());
  std::filesystem::remove_all(dir);
  std::vector<std::string> pipeline(4), replicas(4);
  std::vector<absl::Status> closed(4);
  OnThreads(4, [&](int q) {
    auto job = CreateFileBootstrap(dir.string(), q, 4, {.timeout_seconds = 30});
    ASSERT_TRUE(job.ok()) << job.status();
    auto grid = SplitJob(**job, 2);
    ASSERT_TRUE(grid.ok()) << grid.status();
    auto p = grid->pipeline->AllGather("stage-0", absl::StrCat("p", q));
    auto r = grid->replicas->AllGather("stage-0", absl::StrCat("r", q));
    ASSERT_TRUE(p.ok() && r.ok()) << p.status() << r.status();
    pipeline[q] = absl::StrJoin(*p, ",");
    replicas[q] = absl::StrJoin(*r, ",");
    closed[q] = grid->pipeline->Close();
    if (closed[q].ok()) closed[q] = grid->replicas->Close();
    if (closed[q].ok()) closed[q] = (*job)->Close();
  });
  EXPECT_THAT(pipeline, ElementsAre("p0,p2", "p1,p3", "p0,p2", "p1,p3"));
  EXPECT_THAT(replicas, ElementsAre("r0,r1", "r0,r1", "r2,r3", "r2,r3"));
  for (const absl::Status& s : closed) PS_EXPECT_OK(s);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace pipesched::comm
