// The MPI bootstrap, run as 3 processes by mpiexec (comm_mpi_test in CMakeLists.txt):
// every process runs every test, in the same order, each as its own rank. A test that
// fails on one rank fails the run (mpiexec's exit status).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/comm/bootstrap.h"

namespace pipesched::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Bootstrap> Create(double timeout_seconds = 60, double heartbeat_seconds = 10) {
  absl::StatusOr<std::unique_ptr<Bootstrap>> bootstrap = CreateMpiBootstrap(
      {.timeout_seconds = timeout_seconds, .heartbeat_timeout_seconds = heartbeat_seconds});
  EXPECT_TRUE(bootstrap.ok()) << bootstrap.status();
  return bootstrap.ok() ? std::move(*bootstrap) : nullptr;
}

TEST(MpiBootstrapTest, IsBuiltAndSpansTheWorld) {
  ASSERT_TRUE(MpiBootstrapBuilt());
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->kind(), "mpi");
  EXPECT_EQ(b->size(), 3) << "run by mpiexec -n 3";
  EXPECT_GE(b->rank(), 0);
  EXPECT_LT(b->rank(), b->size());
  EXPECT_TRUE(b->Close().ok());
}

// Each rank's part, by rank, round after round; sizes from nothing to 3 MB (past any
// eager limit), and two channels whose rounds interleave differently on each rank.
TEST(MpiBootstrapTest, AllGatherReturnsEachRanksBytesByRank) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  for (int round = 0; round < 5; ++round) {
    absl::StatusOr<std::vector<std::string>> got =
        b->AllGather("round", absl::StrCat("rank ", r, " round ", round));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(*got, ElementsAre(absl::StrCat("rank 0 round ", round),
                                  absl::StrCat("rank 1 round ", round),
                                  absl::StrCat("rank 2 round ", round)));
  }
  absl::StatusOr<std::vector<std::string>> empty = b->AllGather("empty", "");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(*empty, ElementsAre("", "", ""));
  const std::string big(3 << 20, static_cast<char>('a' + r));
  absl::StatusOr<std::vector<std::string>> large = b->AllGather("large", big);
  ASSERT_TRUE(large.ok()) << large.status();
  ASSERT_EQ(large->size(), 3u);
  for (int from = 0; from < 3; ++from) {
    EXPECT_EQ((*large)[from], std::string(3 << 20, static_cast<char>('a' + from))) << from;
  }
  EXPECT_TRUE(b->Close().ok());
}

// Threads on their own channels, started in a different order on each rank, each doing
// its rounds: no part lands on the wrong channel or round.
TEST(MpiBootstrapTest, ChannelsAreIndependentAcrossThreads) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    const int t = (i + r) % kThreads;
    threads.emplace_back([&, t] {
      const std::string channel = absl::StrCat("stage-", t);
      for (int k = 0; k < kRounds; ++k) {
        absl::StatusOr<std::vector<std::string>> got =
            b->AllGather(channel, absl::StrCat(t, "/", k, "/", r));
        if (!got.ok() || got->size() != 3) {
          ++wrong;
          continue;
        }
        for (int from = 0; from < 3; ++from) {
          if ((*got)[from] != absl::StrCat(t, "/", k, "/", from)) ++wrong;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(b->Close().ok());
}

TEST(MpiBootstrapTest, BroadcastBarrierAndAgreementWork) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  absl::StatusOr<std::string> root = Broadcast(*b, "id", absl::StrCat("id of ", r), 2);
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root, "id of 2");
  EXPECT_TRUE(Barrier(*b, "barrier").ok());
  EXPECT_TRUE(CheckAgreement(*b, "same", "configuration", "--stages=2").ok());
  const absl::Status differs =
      CheckAgreement(*b, "differ", "configuration", r == 1 ? "--stages=4" : "--stages=2");
  EXPECT_EQ(differs.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(differs.message()),
              HasSubstr("process 1's configuration differs from process 0's"));
  EXPECT_EQ(b->AllGather("bad channel", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(b->Close().ok());
  const absl::Status after = b->AllGather("late", "").status();
  EXPECT_EQ(after.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(after.message()), HasSubstr("AllGather after Close()"));
}

// Fail() on rank 1 ends the others' exchange, waiting or to come, with its reason.
TEST(MpiBootstrapTest, AFailingRankEndsTheOthersExchanges) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(Barrier(*b, "before").ok());
  const auto start = std::chrono::steady_clock::now();
  if (b->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b->Fail("cannot read --data:\nno such file");
  }
  const absl::Status waited = b->AllGather("after", "x").status();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_EQ(waited.message(), "process 1 failed: cannot read --data: no such file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(b->Failure().message(), "process 1 failed: cannot read --data: no such file");
  // The bootstrap is spent; the next test makes a new one.
}

// An exchange that a rank does not make times out on the others, naming it.
TEST(MpiBootstrapTest, AMissingRankIsNamedAtTheTimeout) {
  std::unique_ptr<Bootstrap> b = Create(/*timeout_seconds=*/1);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(Barrier(*b, "before").ok());
  if (b->rank() != 2) {
    const absl::Status waited = b->AllGather("without-2", "x").status();
    EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
    EXPECT_THAT(std::string(waited.message()),
                HasSubstr("on channel 'without-2' (exchange 0) for rank 2"));
  }
}

// Abort() from another thread ends a wait with Cancelled, and every later call.
TEST(MpiBootstrapTest, AbortEndsAWait) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(Barrier(*b, "before").ok());
  if (b->rank() == 0) {
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      b->Abort();
    });
    const absl::Status waited = b->AllGather("alone", "x").status();
    aborter.join();
    EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
    EXPECT_EQ(b->AllGather("later", "x").status().code(), absl::StatusCode::kCancelled);
  }
}

// The heartbeat: a rank that computes for longer than the heartbeat timeout before it
// comes to an exchange is not judged (its thread beats on); one that is stopped
// (SIGSTOP: its thread stops too) is, by the ranks waiting for it, within about the
// timeout plus a look (0.25 s).
TEST(MpiBootstrapTest, AStoppedRankIsFoundByItsHeartbeatAndASlowOneIsNot) {
  std::unique_ptr<Bootstrap> b = Create(/*timeout_seconds=*/60, /*heartbeat_seconds=*/2);
  ASSERT_NE(b, nullptr);
  absl::StatusOr<std::vector<std::string>> pids = b->AllGather("pids", std::to_string(::getpid()));
  ASSERT_TRUE(pids.ok()) << pids.status();
  if (b->rank() == 2) std::this_thread::sleep_for(std::chrono::seconds(3));
  absl::StatusOr<std::vector<std::string>> slow = b->AllGather("slow", "x");
  ASSERT_TRUE(slow.ok()) << slow.status();

  if (b->rank() == 2) {
    // An exchange returns once the others' parts are here; this rank's own go out on
    // its thread, which is given the time to send them before the whole process stops
    // (else the others would judge it silent at "slow", rightly, but not as meant here).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::raise(SIGSTOP);  // rank 0 continues it once it has been judged
    return;
  }
  // Rank 1 waits in an exchange, rank 0 asks Failure() (a watchdog's way) until it says.
  const auto start = std::chrono::steady_clock::now();
  absl::Status verdict;
  if (b->rank() == 1) {
    verdict = b->AllGather("stopped", "x").status();
  } else {
    while (verdict.ok() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      verdict = b->Failure();
    }
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(verdict.code(), absl::StatusCode::kAborted) << verdict;
  EXPECT_THAT(std::string(verdict.message()),
              HasSubstr("process 2 has shown no sign of life for 2."));
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 10);
  if (b->rank() == 0) {
    // Rank 2 goes on once rank 1 has judged it too (as long again as rank 0 took, at
    // least 2 s, is past that); the verdict stays when it beats again.
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ::kill(std::stoi((*pids)[2]), SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  EXPECT_EQ(b->Failure().code(), absl::StatusCode::kAborted);
}

// A part larger than MPI's int count can carry is refused before anything is sent, and
// the channel goes on as if it had not been asked.
TEST(MpiBootstrapTest, APartOverMpisCountIsRefused) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  // Address space that is never read: the size is refused before any byte is.
  const std::size_t size = std::size_t{1} << 31;
  void* reserved = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(reserved, MAP_FAILED);
  const absl::Status refused =
      b->AllGather("big", std::string_view(static_cast<const char*>(reserved), size)).status();
  ::munmap(reserved, size);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("2147483648 bytes on channel 'big' are more than one exchange carries "
                        "(2147483573, MPI's int count): give them in parts"));
  absl::StatusOr<std::vector<std::string>> after = b->AllGather("big", "small");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_THAT(*after, ElementsAre("small", "small", "small"));
  EXPECT_TRUE(b->Close().ok());
}

}  // namespace
}  // namespace pipesched::comm
