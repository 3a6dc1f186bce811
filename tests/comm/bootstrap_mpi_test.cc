// The MPI bootstrap, run as 3 processes by mpiexec (comm_mpi_test in CMakeLists.txt):
// every process runs every test, in the same order, each as its own rank. A test that
// fails on one rank fails the run (mpiexec's exit status).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
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

// Point to point. Byte i of the n-th message from `from` to `to`: differs from message
// to message and along each, so a message cut, shifted or taken for another fails.
std::string Series(int from, int to, int n, std::size_t size) {
  std::string bytes(size, '\0');
  for (std::size_t i = 0; i < size; ++i) {
    bytes[i] = static_cast<char>((from * 31 + to * 7 + n * 13 + i) % 251);
  }
  return bytes;
}

// Every rank sends every other rank one series on one channel, sizes from nothing to
// 3 MB (past any eager limit), all before it receives: each receives each sender's
// series whole and in order.
TEST(MpiBootstrapTest, ReceiveReturnsEachSendersMessagesInOrder) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  const std::vector<std::size_t> sizes = {0, 1, 100, 65537, 3 << 20, 7, 0};
  for (int n = 0; n < static_cast<int>(sizes.size()); ++n) {
    for (int to = 0; to < 3; ++to) {
      if (to != r) {
        ASSERT_TRUE(b->Send(to, "series", Series(r, to, n, sizes[n])).ok());
      }
    }
  }
  for (int from = 0; from < 3; ++from) {
    if (from == r) continue;
    for (int n = 0; n < static_cast<int>(sizes.size()); ++n) {
      absl::StatusOr<std::string> got = b->Receive(from, "series");
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->size(), sizes[n]) << "message " << n << " from rank " << from;
      // Not EXPECT_EQ: it would print megabytes.
      EXPECT_TRUE(*got == Series(from, r, n, sizes[n])) << "message " << n << " from rank " << from;
    }
  }
  EXPECT_TRUE(b->Close().ok());
}

// Messages sent before the receiver asks wait for it; one never received does not hold
// up Close().
TEST(MpiBootstrapTest, AMessageSentBeforeItsReceiveIsKept) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  if (b->rank() == 0) {
    ASSERT_TRUE(b->Send(1, "early", "first").ok());
    ASSERT_TRUE(b->Send(1, "early", "second").ok());
    ASSERT_TRUE(b->Send(1, "early", "never received").ok());
  }
  // Rank 0's messages leave before its barrier part (MPI keeps a pair's order).
  ASSERT_TRUE(Barrier(*b, "sent").ok());
  if (b->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    absl::StatusOr<std::string> first = b->Receive(0, "early");
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(*first, "first");
    absl::StatusOr<std::string> second = b->Receive(0, "early");
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(*second, "second");
  }
  EXPECT_TRUE(b->Close().ok());
}

// Ranks 0 and 1 play ping-pong on two channels at once, one thread per channel, in
// opposite orders: on "ping" rank 0 sends first, on "pong" rank 1 does (and each rank
// starts its threads in its own order). No message lands on the other channel.
TEST(MpiBootstrapTest, APairsChannelsAreIndependentAcrossThreads) {
  std::unique_ptr<Bootstrap> b = Create(/*timeout_seconds=*/30);
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  if (r < 2) {
    const int peer = 1 - r;
    constexpr int kRounds = 50;
    auto play = [&](const std::string& channel, bool sends_first) {
      for (int k = 0; k < kRounds; ++k) {
        for (int step = 0; step < 2; ++step) {
          if ((step == 0) == sends_first) {
            EXPECT_TRUE(b->Send(peer, channel, absl::StrCat(channel, " ", k, " from ", r)).ok());
          } else {
            absl::StatusOr<std::string> got = b->Receive(peer, channel);
            ASSERT_TRUE(got.ok()) << got.status();
            EXPECT_EQ(*got, absl::StrCat(channel, " ", k, " from ", peer));
          }
        }
      }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      const bool ping = (i == 0) == (r == 0);
      threads.emplace_back([&, ping] { play(ping ? "ping" : "pong", ping == (r == 0)); });
    }
    for (std::thread& t : threads) t.join();
  }
  EXPECT_TRUE(b->Close().ok());
}

// Each rank sends to the next and receives from the one before: round after round, then
// a token that each rank adds its own number to.
TEST(MpiBootstrapTest, MessagesGoRoundARing) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  const int next = (r + 1) % 3;
  const int previous = (r + 2) % 3;
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(b->Send(next, "ring", absl::StrCat("round ", round, " from ", r)).ok());
    absl::StatusOr<std::string> got = b->Receive(previous, "ring");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, absl::StrCat("round ", round, " from ", previous));
  }
  if (r == 0) {
    ASSERT_TRUE(b->Send(next, "token", "0").ok());
  }
  absl::StatusOr<std::string> token = b->Receive(previous, "token");
  ASSERT_TRUE(token.ok()) << token.status();
  if (r != 0) {
    ASSERT_TRUE(b->Send(next, "token", absl::StrCat(*token, r)).ok());
  } else {
    EXPECT_EQ(*token, "012");
  }
  EXPECT_TRUE(b->Close().ok());
}

// One channel name used by AllGather on one thread and by Send/Receive on another at
// the same time, then by both in turn on one thread: neither takes the other's bytes.
TEST(MpiBootstrapTest, AChannelNameServesAllGatherAndPointToPointApart) {
  std::unique_ptr<Bootstrap> b = Create(/*timeout_seconds=*/30);
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  const int next = (r + 1) % 3;
  const int previous = (r + 2) % 3;
  constexpr int kRounds = 20;
  std::thread gatherer([&] {
    for (int k = 0; k < kRounds; ++k) {
      absl::StatusOr<std::vector<std::string>> got =
          b->AllGather("shared", absl::StrCat("part ", k, " of ", r));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_THAT(*got,
                  ElementsAre(absl::StrCat("part ", k, " of 0"), absl::StrCat("part ", k, " of 1"),
                              absl::StrCat("part ", k, " of 2")));
    }
  });
  for (int k = 0; k < kRounds; ++k) {
    EXPECT_TRUE(b->Send(next, "shared", absl::StrCat("message ", k, " of ", r)).ok());
    absl::StatusOr<std::string> got = b->Receive(previous, "shared");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, absl::StrCat("message ", k, " of ", previous));
  }
  gatherer.join();
  ASSERT_TRUE(b->Send(next, "both", "sent").ok());
  absl::StatusOr<std::vector<std::string>> gathered = b->AllGather("both", "gathered");
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_THAT(*gathered, ElementsAre("gathered", "gathered", "gathered"));
  absl::StatusOr<std::string> received = b->Receive(previous, "both");
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(*received, "sent");
  EXPECT_TRUE(b->Close().ok());
}

// A peer that is not another rank, a bad channel and a message over MPI's count are
// refused, and count for nothing: the channel's next message is still message 0.
TEST(MpiBootstrapTest, PointToPointRefusesBadPeersChannelsAndSizes) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  const int r = b->rank();
  const int next = (r + 1) % 3;
  const int previous = (r + 2) % 3;
  for (const int peer : {-1, 3, r}) {
    const std::string rule =
        peer == r
            ? absl::StrCat("bootstrap rank ", r,
                           " cannot send to or receive from itself: give another rank")
            : absl::StrCat("peer rank ", peer, " is out of range for 3 processes: use 0 to 2");
    const absl::Status send = b->Send(peer, "refused", "x");
    EXPECT_EQ(send.code(), absl::StatusCode::kInvalidArgument) << send;
    EXPECT_EQ(send.message(), rule);
    const absl::Status receive = b->Receive(peer, "refused").status();
    EXPECT_EQ(receive.code(), absl::StatusCode::kInvalidArgument) << receive;
    EXPECT_EQ(receive.message(), rule);
  }
  for (const std::string& channel :
       {std::string("bad channel"), std::string(65, 'c'), std::string(""), std::string("~close")}) {
    for (const absl::Status& refused :
         {b->Send(next, channel, "x"), b->Receive(previous, channel).status()}) {
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_THAT(std::string(refused.message()),
                  HasSubstr("is not 1 to 64 characters of letters, digits, '_' and '-'"));
    }
  }
  // Address space that is never read: the size is refused before any byte is.
  const std::size_t size = std::size_t{1} << 31;
  void* reserved = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(reserved, MAP_FAILED);
  const absl::Status big =
      b->Send(next, "refused", std::string_view(static_cast<const char*>(reserved), size));
  ::munmap(reserved, size);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_THAT(std::string(big.message()),
              HasSubstr("2147483648 bytes on channel 'refused' are more than one message carries "
                        "(2147483573, MPI's int count): give them in parts"));
  ASSERT_TRUE(b->Send(next, "refused", "message 0").ok());
  absl::StatusOr<std::string> got = b->Receive(previous, "refused");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "message 0");
  EXPECT_TRUE(b->Close().ok());
  for (const absl::Status& late :
       {b->Send(next, "late", "x"), b->Receive(previous, "late").status()}) {
    EXPECT_EQ(late.code(), absl::StatusCode::kInvalidArgument) << late;
    EXPECT_EQ(late.message(),
              absl::StrCat("bootstrap rank ", r, ": Send or Receive after Close()"));
  }
}

// A Receive whose sender does not send times out, naming the sender, the channel and the
// message number (rank 2 sends message 0 only).
TEST(MpiBootstrapTest, AReceiveFromASilentSenderIsNamedAtTheTimeout) {
  std::unique_ptr<Bootstrap> b = Create(/*timeout_seconds=*/1);
  ASSERT_NE(b, nullptr);
  if (b->rank() == 2) {
    ASSERT_TRUE(b->Send(0, "quiet", "only one").ok());
  }
  if (b->rank() == 0) {
    absl::StatusOr<std::string> got = b->Receive(2, "quiet");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "only one");
    const auto start = std::chrono::steady_clock::now();
    const absl::Status waited = b->Receive(2, "quiet").status();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
    EXPECT_EQ(waited.message(),
              "MPI bootstrap: rank 0 waited 1 s on channel 'quiet' (message 1) for a message "
              "from rank 2 (stopped, or not sending it?)");
    EXPECT_GE(took, 0.9);
    EXPECT_LT(took, 10);
  }
}

// Abort() from another thread ends a waiting Receive with Cancelled, and later Sends.
TEST(MpiBootstrapTest, AbortEndsAWaitingReceive) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(Barrier(*b, "before").ok());
  if (b->rank() == 0) {
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      b->Abort();
    });
    const absl::Status waited = b->Receive(1, "abandoned").status();
    aborter.join();
    EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
    EXPECT_EQ(waited.message(), "bootstrap rank 0: aborted on channel 'abandoned' (message 0)");
    const absl::Status later = b->Send(1, "abandoned", "x");
    EXPECT_EQ(later.code(), absl::StatusCode::kCancelled) << later;
    EXPECT_EQ(later.message(), "bootstrap rank 0: aborted on channel 'abandoned' (message 0)");
  }
}

// Fail() on rank 1 ends the Receives waiting for it on the others with its reason, and
// its own later Sends.
TEST(MpiBootstrapTest, AFailingRankEndsTheOthersReceives) {
  std::unique_ptr<Bootstrap> b = Create();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(Barrier(*b, "before").ok());
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  if (b->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b->Fail("stage 1 ran out of memory");
    status = b->Send(0, "activations", "x");
  } else {
    status = b->Receive(1, "activations").status();
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_EQ(status.message(), "process 1 failed: stage 1 ran out of memory");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace pipesched::comm
