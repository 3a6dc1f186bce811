// comm/bootstrap.h: ranks (threads here) exchange bytes in call order per channel,
// channels are independent, the file kind meets in a directory it creates and removes,
// and every way of getting it wrong (a missing rank, a second process with one rank, a
// different size, a directory left behind, an abort) is an error naming the problem.
#include "pipesched/comm/bootstrap.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/scoped_environment.h"
#include "testing/status_matchers.h"

namespace pipesched::comm {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A path that does not exist yet, unique to this process and test.
std::string FreshDir(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) /
                                     absl::StrCat("bootstrap_test_", ::getpid(), "_", name);
  std::filesystem::remove_all(path);
  return path.string();
}

// Runs body(rank) on `size` threads at once and joins them.
template <typename Body>
void OnThreads(int size, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&body, r] { body(r); });
  for (std::thread& t : threads) t.join();
}

// Each rank exchanges "<channel><rank>:<k>" three times on each of two channels, one
// thread per channel, the threads of different ranks staggered differently; the k-th
// call on a channel returns every rank's k-th bytes on it, whatever the other channel
// does meanwhile (one stage's all-reduce never waits for another's).
void ExpectOrderedExchanges(std::vector<std::unique_ptr<Bootstrap>>& ranks) {
  const int size = static_cast<int>(ranks.size());
  // [rank][channel][k] -> by rank
  std::vector<std::vector<std::vector<std::vector<std::string>>>> got(
      size, std::vector<std::vector<std::vector<std::string>>>(2));
  OnThreads(size * 2, [&](int t) {
    const int r = t / 2;
    const int c = t % 2;
    const std::string channel = c == 0 ? "a" : "b";
    for (int k = 0; k < 3; ++k) {
      if ((r + k + c) % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      auto all = ranks[r]->AllGather(channel, absl::StrCat(channel, r, ":", k));
      ASSERT_TRUE(all.ok()) << all.status();
      got[r][c].push_back(*all);
    }
  });
  for (int r = 0; r < size; ++r) {
    for (int c = 0; c < 2; ++c) {
      const std::string channel = c == 0 ? "a" : "b";
      ASSERT_EQ(got[r][c].size(), 3u);
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(got[r][c][k].size(), static_cast<std::size_t>(size));
        for (int from = 0; from < size; ++from) {
          EXPECT_EQ(got[r][c][k][from], absl::StrCat(channel, from, ":", k))
              << "rank " << r << " channel " << channel << " call " << k << " from " << from;
        }
      }
    }
  }
}

TEST(InProcessBootstrapTest, ExchangesInCallOrderPerChannel) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(4));
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[2]->rank(), 2);
  EXPECT_EQ(ranks[2]->size(), 4);
  EXPECT_EQ(ranks[0]->kind(), "in-process");
  ExpectOrderedExchanges(ranks);
  OnThreads(4, [&](int r) { EXPECT_TRUE(ranks[r]->Close().ok()); });
  EXPECT_THAT(ranks[0]->AllGather("a", "late"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after Close()")));
}

TEST(InProcessBootstrapTest, BroadcastAndAgreement) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(3));
  std::vector<std::string> got(3);
  std::vector<absl::Status> agreed(3), differ(3);
  OnThreads(3, [&](int r) {
    auto b = Broadcast(*ranks[r], "id", absl::StrCat("from ", r), 1);
    got[r] = b.ok() ? *b : b.status().ToString();
    agreed[r] = CheckAgreement(*ranks[r], "cfg", "configuration", "P=2 M=8");
    differ[r] = CheckAgreement(*ranks[r], "cfg", "configuration", r == 2 ? "P=4 M=8" : "P=2 M=8");
  });
  EXPECT_THAT(got, ElementsAre("from 1", "from 1", "from 1"));
  for (int r = 0; r < 3; ++r) {
    PS_EXPECT_OK(agreed[r]);
    EXPECT_THAT(differ[r], StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("process 2's configuration differs from process 0's "
                                              "(\"P=4 M=8\" against \"P=2 M=8\")")));
  }
  EXPECT_THAT(Broadcast(*ranks[0], "id", "", 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 3 is out of range")));
}

TEST(InProcessBootstrapTest, TimeoutNamesTheMissingRanks) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(4, {.timeout_seconds = 0.2}));
  std::vector<absl::Status> got(4);
  OnThreads(4, [&](int r) {
    if (r == 1 || r == 3) return;  // never arrive
    got[r] = ranks[r]->AllGather("grad-0", "x").status();
  });
  EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                               HasSubstr("channel 'grad-0' (exchange 0) for ranks 1, 3")));
  EXPECT_THAT(got[2], StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("ranks 1, 3")));
}

// Abort is this rank's (a watchdog's): its wait ends, the others are not told.
TEST(InProcessBootstrapTest, AbortReleasesTheWaitingRankOnly) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(2, {.timeout_seconds = 10}));
  absl::Status waited;
  std::thread waiter([&] { waited = ranks[0]->AllGather("x", "y").status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ranks[0]->Abort();
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted")));
  EXPECT_THAT(ranks[0]->AllGather("x", "y"),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted")));
  PS_EXPECT_OK(ranks[1]->Failure());
  // Rank 1 is not aborted: its exchange waits for rank 0, which never comes.
  PS_ASSERT_OK_AND_ASSIGN(auto pair, CreateInProcessBootstraps(2, {.timeout_seconds = 0.1}));
  pair[0]->Abort();
  EXPECT_THAT(pair[1]->AllGather("x", "y"),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("for rank 0")));
}

TEST(BootstrapTest, BadArgumentsAreRefused) {
  EXPECT_THAT(CreateInProcessBootstraps(0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1 process")));
  EXPECT_THAT(CreateFileBootstrap(FreshDir("range"), 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 2 is out of range for 2 processes: use 0 to 1")));
  EXPECT_THAT(CreateFileBootstrap("", 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give a path")));
  for (double bad : {-1.0, std::nan("")}) {
    EXPECT_THAT(CreateInProcessBootstraps(2, {.timeout_seconds = bad}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("the bootstrap's exchange timeout must be >= 0 seconds")));
    EXPECT_THAT(CreateFileBootstrap(FreshDir("timeout"), 0, 2, {.timeout_seconds = bad}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("the bootstrap's exchange timeout must be >= 0 seconds")));
  }
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(1));
  for (std::string_view channel : {"", "a/b", "~close", "a b"}) {
    EXPECT_THAT(ranks[0]->AllGather(channel, ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("is not 1 to 64 characters of letters, digits")))
        << channel;
  }
  // One rank alone needs nobody.
  PS_ASSERT_OK_AND_ASSIGN(std::vector<std::string> alone, ranks[0]->AllGather("x", "only"));
  EXPECT_THAT(alone, ElementsAre("only"));
}

TEST(FileBootstrapTest, ExchangesInCallOrderAndRemovesItsDirectory) {
  const std::string dir = FreshDir("exchange");
  std::vector<std::unique_ptr<Bootstrap>> ranks(3);
  // Rank 0 starts last: the others wait for its directory.
  OnThreads(3, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto b = CreateFileBootstrap(dir, r, 3, {.timeout_seconds = 30});
    ASSERT_TRUE(b.ok()) << b.status();
    ranks[r] = std::move(b).value();
  });
  ASSERT_TRUE(ranks[0] && ranks[1] && ranks[2]);
  EXPECT_EQ(ranks[1]->kind(), "file");
  ExpectOrderedExchanges(ranks);
  // A large exchange (a host all-reduce sends gradients this way) arrives whole.
  const std::string big(3 << 20, 'g');
  OnThreads(3, [&](int r) {
    auto all = ranks[r]->AllGather("big", r == 1 ? big : "small");
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ((*all)[1].size(), big.size());
    EXPECT_EQ((*all)[2], "small");
  });
  std::vector<absl::Status> closed(3);
  OnThreads(3, [&](int r) { closed[r] = ranks[r]->Close(); });
  for (const absl::Status& s : closed) PS_EXPECT_OK(s);
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " left behind";
}

// Point to point (Send / Receive) on `ranks` (3 or more): a ring of three messages per
// rank, 0 bytes to 3 MB, each received in order from the rank before; two channels of one
// pair sent in one order and received in the other, the second message there before its
// Receive asks; and a channel name that an AllGather uses at the same time, unmixed.
void ExpectPointToPoint(std::vector<std::unique_ptr<Bootstrap>>& ranks) {
  const int size = static_cast<int>(ranks.size());
  const std::vector<std::string> payloads = {"", std::string(3 << 20, 'p'), "third"};
  OnThreads(size, [&](int r) {
    Bootstrap& b = *ranks[r];
    const int next = (r + 1) % size;
    const int previous = (r + size - 1) % size;
    for (int k = 0; k < 3; ++k) {
      ASSERT_TRUE(b.Send(next, "ring", absl::StrCat(r, ">", k, ":", payloads[k])).ok());
    }
    for (int k = 0; k < 3; ++k) {
      auto got = b.Receive(previous, "ring");
      ASSERT_TRUE(got.ok()) << got.status();
      const std::string expected = absl::StrCat(previous, ">", k, ":", payloads[k]);
      EXPECT_TRUE(*got == expected) << "rank " << r << " message " << k << ": " << got->size()
                                    << " bytes, " << got->substr(0, 8) << "...";
    }
  });
  // Rank 1 sends "act" then "grad" to rank 2, which asks for "grad" first.
  OnThreads(size, [&](int r) {
    if (r == 1) {
      ASSERT_TRUE(ranks[1]->Send(2, "act", "activation").ok());
      ASSERT_TRUE(ranks[1]->Send(2, "grad", "gradient").ok());
    } else if (r == 2) {
      auto grad = ranks[2]->Receive(1, "grad");
      auto act = ranks[2]->Receive(1, "act");
      ASSERT_TRUE(grad.ok() && act.ok()) << grad.status() << act.status();
      EXPECT_EQ(*grad, "gradient");
      EXPECT_EQ(*act, "activation");
    }
  });
  // "mixed" carries an AllGather on every rank and, on another thread, a message from
  // rank 0 to rank 1.
  std::vector<std::string> gathered(size), received(size);
  OnThreads(size * 2, [&](int t) {
    const int r = t / 2;
    if (t % 2 == 0) {
      auto all = ranks[r]->AllGather("mixed", absl::StrCat("part ", r));
      ASSERT_TRUE(all.ok()) << all.status();
      gathered[r] = (*all)[size - 1];
    } else if (r == 0) {
      ASSERT_TRUE(ranks[0]->Send(1, "mixed", "message").ok());
    } else if (r == 1) {
      auto got = ranks[1]->Receive(0, "mixed");
      ASSERT_TRUE(got.ok()) << got.status();
      received[1] = *got;
    }
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(gathered[r], absl::StrCat("part ", size - 1));
  EXPECT_EQ(received[1], "message");
}

// The refusals every kind shares: a peer out of range or this rank, a bad channel, a call
// after Close(); an unsent message is a timeout naming its sender, channel and number.
void ExpectPointToPointRefusals(std::vector<std::unique_ptr<Bootstrap>>& ranks) {
  Bootstrap& one = *ranks[1];
  for (int peer : {-1, 3}) {
    EXPECT_THAT(one.Send(peer, "x", ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("peer rank ", peer,
                                                " is out of range for 3 processes: use 0 to 2"))));
    EXPECT_THAT(one.Receive(peer, "x"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr(absl::StrCat("peer rank ", peer))));
  }
  EXPECT_THAT(one.Send(1, "x", ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bootstrap rank 1 cannot send to or receive from itself")));
  EXPECT_THAT(one.Receive(1, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from itself")));
  EXPECT_THAT(one.Send(0, "a.b", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not 1 to 64 characters")));
  EXPECT_THAT(one.Receive(0, "~close"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not 1 to 64 characters")));
  // Rank 2 received one message on "late" from rank 0, which sent no second.
  ASSERT_TRUE(ranks[0]->Send(2, "late", "first").ok());
  PS_ASSERT_OK_AND_ASSIGN(std::string first, ranks[2]->Receive(0, "late"));
  EXPECT_EQ(first, "first");
  EXPECT_THAT(ranks[2]->Receive(0, "late"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("rank 2 waited 0.3 s on channel 'late' (message 1) for a "
                                 "message from rank 0 (not started, not sending it")));
  // A failed Receive keeps its number: the message sent afterwards is that one.
  ASSERT_TRUE(ranks[0]->Send(2, "late", "second").ok());
  PS_ASSERT_OK_AND_ASSIGN(std::string second, ranks[2]->Receive(0, "late"));
  EXPECT_EQ(second, "second");
  // A message sent and never received does not keep the ranks from closing.
  ASSERT_TRUE(ranks[1]->Send(0, "unread", "dropped").ok());
  std::vector<absl::Status> closed(3);
  OnThreads(3, [&](int r) { closed[r] = ranks[r]->Close(); });
  for (const absl::Status& s : closed) PS_EXPECT_OK(s);
  EXPECT_THAT(one.Send(0, "x", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after Close()")));
  EXPECT_THAT(one.Receive(0, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after Close()")));
}

// Abort ends this rank's Receive (Cancelled) and its later calls; another rank's Fail ends
// a Receive waiting on any rank with the failure's reason.
void ExpectPointToPointEndsOnAbortAndFailure(std::vector<std::unique_ptr<Bootstrap>>& ranks) {
  absl::Status waited;
  std::thread waiter([&] { waited = ranks[0]->Receive(1, "act-1").status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ranks[0]->Abort();
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kCancelled,
                               HasSubstr("aborted on channel 'act-1' (message 0 from rank 1)")));
  EXPECT_THAT(ranks[0]->Send(1, "x", ""),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("(sending to rank 1)")));
  std::thread failing([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ranks[2]->Fail("stage 3 ran out of memory");
  });
  EXPECT_THAT(ranks[1]->Receive(0, "grad-0"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 2 failed: stage 3 ran out of memory")));
  failing.join();
  EXPECT_THAT(ranks[1]->Send(0, "x", ""),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("process 2 failed")));
}

// Three file bootstraps in `dir`, made on threads (each waits for the others' join).
std::vector<std::unique_ptr<Bootstrap>> FileRanks(const std::string& dir, int size,
                                                  double timeout_seconds,
                                                  bool watch_directory = true) {
  std::vector<std::unique_ptr<Bootstrap>> ranks(size);
  OnThreads(size, [&](int r) {
    auto b = CreateFileBootstrap(
        dir, r, size, {.timeout_seconds = timeout_seconds, .watch_directory = watch_directory});
    ASSERT_TRUE(b.ok()) << b.status();
    ranks[r] = std::move(b).value();
  });
  return ranks;
}

TEST(InProcessBootstrapTest, SendsAndReceivesInOrderPerPairAndChannel) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(4));
  ExpectPointToPoint(ranks);
  PS_ASSERT_OK_AND_ASSIGN(auto three, CreateInProcessBootstraps(3, {.timeout_seconds = 0.3}));
  ExpectPointToPointRefusals(three);
  PS_ASSERT_OK_AND_ASSIGN(auto ending, CreateInProcessBootstraps(3, {.timeout_seconds = 10}));
  ExpectPointToPointEndsOnAbortAndFailure(ending);
}

TEST(FileBootstrapTest, SendsAndReceivesInOrderPerPairAndChannel) {
  const std::string dir = FreshDir("p2p");
  std::vector<std::unique_ptr<Bootstrap>> ranks = FileRanks(dir, 3, 30);
  ASSERT_TRUE(ranks[0] && ranks[1] && ranks[2]);
  ExpectPointToPoint(ranks);
  // Each message's file is gone once received.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find('-'), std::string::npos)
        << entry.path() << " left behind";
  }
  std::vector<absl::Status> closed(3);
  OnThreads(3, [&](int r) { closed[r] = ranks[r]->Close(); });
  for (const absl::Status& s : closed) PS_EXPECT_OK(s);
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " left behind";

  const std::string refusals_dir = FreshDir("p2p_refusals");
  std::vector<std::unique_ptr<Bootstrap>> three = FileRanks(refusals_dir, 3, 0.3);
  ASSERT_TRUE(three[0] && three[1] && three[2]);
  ExpectPointToPointRefusals(three);
  EXPECT_FALSE(std::filesystem::exists(refusals_dir)) << "the unread message's file stayed";

  const std::string ending_dir = FreshDir("p2p_ending");
  std::vector<std::unique_ptr<Bootstrap>> ending = FileRanks(ending_dir, 3, 10);
  ASSERT_TRUE(ending[0] && ending[1] && ending[2]);
  ExpectPointToPointEndsOnAbortAndFailure(ending);
  ending.clear();
  std::filesystem::remove_all(ending_dir);
}

// The receives' two ways of finding their messages, woken by the directory's events
// (the default) and looking only (BootstrapOptions::watch_directory = false): the same
// exchanges and messages, in order, and the directory gone after Close.
TEST(FileBootstrapTest, WaitsFindTheirFilesWithOrWithoutTheDirectorysEvents) {
  for (const bool watch : {true, false}) {
    SCOPED_TRACE(watch ? "woken by events" : "looking only");
    const std::string dir = FreshDir(watch ? "events" : "looks");
    std::vector<std::unique_ptr<Bootstrap>> ranks = FileRanks(dir, 3, 30, watch);
    ASSERT_TRUE(ranks[0] && ranks[1] && ranks[2]);
    ExpectOrderedExchanges(ranks);
    ExpectPointToPoint(ranks);
    std::vector<absl::Status> closed(3);
    OnThreads(3, [&](int r) { closed[r] = ranks[r]->Close(); });
    for (const absl::Status& s : closed) PS_EXPECT_OK(s);
    EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " left behind";
  }
}

TEST(FileBootstrapTest, ALeftoverDirectoryIsRefused) {
  const std::string dir = FreshDir("leftover");
  std::filesystem::create_directory(dir);
  EXPECT_THAT(
      CreateFileBootstrap(dir, 0, 2),
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          HasSubstr("exists (an earlier run that did not close left it, or another job uses it?): "
                    "remove it, or give every run a new path")));
  std::filesystem::remove_all(dir);
  EXPECT_THAT(CreateFileBootstrap(FreshDir("no_parent") + "/below", 0, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot create rendezvous directory")));
}

TEST(FileBootstrapTest, RanksStartedForDifferentSizesAreRefused) {
  const std::string dir = FreshDir("sizes");
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2));
  EXPECT_THAT(CreateFileBootstrap(dir, 1, 3, {.timeout_seconds = 5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 was started for 3 processes, but rank 0 made")));
  zero.reset();
  std::filesystem::remove_all(dir);
}

TEST(FileBootstrapTest, ASecondProcessWithOneRankIsRefused) {
  const std::string dir = FreshDir("duplicate");
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 0.3}));
  PS_ASSERT_OK_AND_ASSIGN(auto one, CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 0.3}));
  // The second rank 1 is refused when it joins: the first holds rank 1's alive file.
  EXPECT_THAT(CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 0.3}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another live process is rank 1 (it holds")));
  // `one` writes its part of the first exchange and waits for rank 0, which is alive
  // but never comes.
  EXPECT_THAT(one->AllGather("join", "a"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("rank 1 waited 0.3 s on channel 'join' (exchange 0) for rank 0")));
  // Two started at once both pass that look; the second's first exchange is refused.
  std::filesystem::remove(std::filesystem::path(dir) / "alive.1");
  PS_ASSERT_OK_AND_ASSIGN(auto again, CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 0.3}));
  EXPECT_THAT(again->AllGather("join", "b"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("exists: another process is rank 1 too (give each process its "
                                 "own rank), or the directory is an earlier run's")));
  // (Gone before their directory: their heartbeats would write in it while it goes.)
  again.reset();
  one.reset();
  zero.reset();
  std::filesystem::remove_all(dir);
}

TEST(FileBootstrapTest, RankZeroMissingIsATimeoutAndAbortCancels) {
  const std::string dir = FreshDir("missing");
  EXPECT_THAT(CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 0.2}),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank 0 did not create")));
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 10}));
  absl::Status waited;
  std::thread waiter([&] { waited = zero->AllGather("x", "y").status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  zero->Abort();
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted on channel 'x'")));
  zero.reset();  // (its heartbeat stopped before its directory goes)
  std::filesystem::remove_all(dir);
}

// A rank that fails says so: the others stop waiting at once with its reason, not
// after their timeout.
TEST(InProcessBootstrapTest, AFailedRankReleasesTheOthersWithItsReason) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(3, {.timeout_seconds = 10}));
  std::vector<absl::Status> got(3);
  OnThreads(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      ranks[2]->Fail("--microbatches=3 is not a multiple of --stages=2");
      return;
    }
    got[r] = ranks[r]->AllGather("stage-0", "x").status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(got[r], StatusIs(absl::StatusCode::kAborted,
                                 HasSubstr("process 2 failed: --microbatches=3 is not a multiple "
                                           "of --stages=2")));
  }
  EXPECT_THAT(ranks[0]->Failure(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("process 2 failed")));
}

TEST(FileBootstrapTest, AFailedRankReleasesTheOthersAndItsDirectoryIsReplaced) {
  const std::string dir = FreshDir("failed");
  std::vector<std::unique_ptr<Bootstrap>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    PS_ASSERT_OK_AND_ASSIGN(ranks[r], CreateFileBootstrap(dir, r, 2, {.timeout_seconds = 10}));
  }
  absl::Status waited;
  std::thread waiter([&] { waited = ranks[0]->AllGather("stage-0", "x").status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ranks[1]->Fail("out of memory\non two lines");
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kAborted,
                               HasSubstr("process 1 failed: out of memory on two lines")));
  EXPECT_THAT(ranks[0]->Failure(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("process 1 failed: out of memory")));
  ranks.clear();
  // The directory stays (the others may not have read the marker yet); the next run's
  // rank 0 refuses it, and a rank started before rank 0 that joins it is told how old
  // the failure it finds is.
  EXPECT_TRUE(std::filesystem::exists(dir));
  EXPECT_THAT(CreateFileBootstrap(dir, 0, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("exists")));
  const std::filesystem::path marker = std::filesystem::path(dir) / "failed";
  std::filesystem::last_write_time(
      marker, std::filesystem::last_write_time(marker) - std::chrono::hours(1));
  PS_ASSERT_OK_AND_ASSIGN(auto late, CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 10}));
  EXPECT_THAT(late->AllGather("y", "x"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("out of memory on two lines (written 3600 s before this process "
                                 "started")));
  late.reset();
  std::filesystem::remove_all(dir);
}

// A rank that fails sees its job failed at once, every kind alike: Failure() looks at
// the file kind's marker at most once a millisecond, but not after this rank's own Fail()
// (a caller deciding whether the job can go on after its own error, as bench does).
TEST(BootstrapTest, FailureIsSeenAtOnceByTheRankThatFailed) {
  const std::string dir = FreshDir("own_failure");
  std::vector<std::unique_ptr<Bootstrap>> files(2);
  for (int r = 0; r < 2; ++r) {
    PS_ASSERT_OK_AND_ASSIGN(files[r], CreateFileBootstrap(dir, r, 2, {.timeout_seconds = 10}));
  }
  PS_ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<Bootstrap>> threads,
                          CreateInProcessBootstraps(2));
  for (Bootstrap* b : {files[1].get(), threads[1].get()}) {
    SCOPED_TRACE(b->kind());
    PS_EXPECT_OK(b->Failure());  // a look just now
    b->Fail("its own reason");
    EXPECT_THAT(b->Failure(), StatusIs(absl::StatusCode::kAborted,
                                       HasSubstr("process 1 failed: its own reason")));
  }
  files.clear();
  std::filesystem::remove_all(dir);
}

// A rank that joined an earlier run's directory finds its own earlier file at its first
// exchange; a rank started for another size tells rank 0 (and the others) at once.
TEST(FileBootstrapTest, LeftoversAndSizeMismatchesStopTheRanks) {
  const std::string dir = FreshDir("killed");
  {
    PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 0.2}));
    PS_ASSERT_OK_AND_ASSIGN(auto one, CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 0.2}));
    EXPECT_THAT(one->AllGather("trainer", "x"),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("for rank 0")));
  }  // never closed: as if killed
  PS_ASSERT_OK_AND_ASSIGN(auto early, CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 10}));
  EXPECT_THAT(early->AllGather("trainer", "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("or the directory is an earlier run's (remove it)")));
  EXPECT_THAT(CreateFileBootstrap(dir, 0, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("exists (an earlier run that did not close left it, or another "
                                 "job uses it?)")));
  early.reset();
  std::filesystem::remove_all(dir);

  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 10}));
  EXPECT_THAT(CreateFileBootstrap(dir, 1, 3), StatusIs(absl::StatusCode::kInvalidArgument,
                                                       HasSubstr("was started for 3 processes")));
  EXPECT_THAT(zero->AllGather("trainer", "x"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 1 failed: rank 1 was started for 3 processes")));
  zero.reset();
  std::filesystem::remove_all(dir);
}

// Forks a process that joins `dir` as rank 1 of 2 and runs body(bootstrap); it exits
// with body()'s value (3 when it cannot join). The parent has no other thread then.
template <typename Body>
pid_t ForkRankOne(const std::string& dir, Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    auto one = CreateFileBootstrap(dir, 1, 2, {.timeout_seconds = 30});
    std::_Exit(one.ok() ? body(**one) : 3);
  }
  return child;
}

// What a hand-started job needs of its bootstrap: a process that is killed, or exits
// without leaving the job, releases the others at once with an error naming it (its
// alive file's lock is dropped by the kernel), not after their timeout; one that says
// why first (Fail) is reported with its reason; one that closes is no failure.
TEST(FileBootstrapTest, AProcessThatEndsWithoutClosingReleasesTheOthers) {
  const std::string dir = FreshDir("ended");
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 60}));
  const pid_t killed = ForkRankOne(dir, [](Bootstrap& one) {
    if (!one.AllGather("hello", "1").ok()) return 4;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 waits by now
    ::raise(SIGKILL);
    return 5;
  });
  ASSERT_GT(killed, 0);
  PS_ASSERT_OK_AND_ASSIGN(auto hello, zero->AllGather("hello", "0"));
  EXPECT_THAT(hello, ElementsAre("0", "1"));
  EXPECT_THAT(zero->AllGather("step", "0"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr(absl::StrCat("process 1 (pid ", killed,
                                              ") ended without leaving the job (killed, "
                                              "crashed, or exited early?)"))));
  EXPECT_THAT(zero->Failure(), StatusIs(absl::StatusCode::kAborted, HasSubstr("process 1 (pid")));
  int status = 0;
  ASSERT_EQ(::waitpid(killed, &status, 0), killed);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  zero.reset();
  std::filesystem::remove_all(dir);

  // Fail() then exit: the reason, not "ended".
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 60}));
  const pid_t failing = ForkRankOne(dir, [](Bootstrap& one) {
    one.Fail("--data has 10 samples, a step needs 16");
    return 1;
  });
  ASSERT_GT(failing, 0);
  ASSERT_EQ(::waitpid(failing, &status, 0), failing);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_THAT(zero->AllGather("step", "0"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 1 failed: --data has 10 samples, a step needs 16")));
  zero.reset();
  std::filesystem::remove_all(dir);

  // A rank that left (its gone file written, as Close() writes it before its lock
  // drops) and then exited is not a failure.
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 60}));
  const pid_t left = ForkRankOne(dir, [&dir](Bootstrap&) {
    return std::ofstream(std::filesystem::path(dir) / "gone.1") ? 0 : 6;
  });
  ASSERT_GT(left, 0);
  ASSERT_EQ(::waitpid(left, &status, 0), left);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int look = 0; look < 3; ++look) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past the 50 ms throttle
    PS_EXPECT_OK(zero->Failure());
  }
  zero.reset();
  std::filesystem::remove_all(dir);

  // A rank on another host (another boot id in its alive file): a shared file system may
  // keep locks per machine, so its free lock says nothing, and it is not called ended.
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 60}));
  const pid_t elsewhere = ForkRankOne(dir, [&dir](Bootstrap&) {
    std::ofstream alive(std::filesystem::path(dir) / "alive.1", std::ios::trunc);
    alive << ::getpid() << " 00000000-0000-0000-0000-000000000000\n";
    return alive ? 0 : 6;
  });
  ASSERT_GT(elsewhere, 0);
  ASSERT_EQ(::waitpid(elsewhere, &status, 0), elsewhere);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int look = 0; look < 3; ++look) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    PS_EXPECT_OK(zero->Failure());
  }
  zero.reset();
  std::filesystem::remove_all(dir);

  // Exchange, close and exit: a job that ends well, its directory removed.
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, {.timeout_seconds = 60}));
  const pid_t closing = ForkRankOne(dir, [](Bootstrap& one) {
    if (!one.AllGather("step", "1").ok()) return 4;
    return one.Close().ok() ? 0 : 6;
  });
  ASSERT_GT(closing, 0);
  PS_ASSERT_OK_AND_ASSIGN(auto all, zero->AllGather("step", "0"));
  EXPECT_THAT(all, ElementsAre("0", "1"));
  PS_EXPECT_OK(zero->Close());
  ASSERT_EQ(::waitpid(closing, &status, 0), closing);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A rank whose heartbeat stops -- its host gone, or the process stopped, neither of
// which can say so -- releases the others with an error naming it once its beat has
// stood still for the heartbeat timeout (here 2 s, which the look interval makes 2.5 s),
// and not while it beats; a rank that left, or one this rank did not watch meanwhile,
// is not judged on a stale beat.
TEST(FileBootstrapTest, ARankWhoseHeartbeatStopsReleasesTheOthers) {
  using Steady = std::chrono::steady_clock;
  auto seconds_since = [](Steady::time_point t) {
    return std::chrono::duration<double>(Steady::now() - t).count();
  };
  const std::string dir = FreshDir("silent");
  const BootstrapOptions watching = {.timeout_seconds = 60, .heartbeat_timeout_seconds = 2};
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, watching));
  // Rank 1 stands for a process on another host: its beat file only (no alive file, whose
  // lock another host's process would hold), rewritten every 0.2 s for 4 s, then not.
  const std::filesystem::path beat = std::filesystem::path(dir) / "beat.1";
  auto write_beat = [&beat](int count) {
    std::ofstream(beat, std::ios::trunc) << absl::StrFormat("%020d 4242 node7\n", count);
  };
  write_beat(1);
  const Steady::time_point start = Steady::now();
  std::thread one([&] {
    for (int count = 2; seconds_since(start) < 4; ++count) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      write_beat(count);
    }
  });
  EXPECT_THAT(zero->AllGather("step", "0"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 1 (pid 4242 on node7) has shown no sign of life for ")));
  const double took = seconds_since(start);
  one.join();
  EXPECT_GE(took, 4 + 2.5 - 0.3) << "judged while it still beat, or before the timeout";
  EXPECT_LT(took, 30);
  EXPECT_THAT(zero->Failure(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("(its heartbeat, \"" + beat.string() +
                                 "\", stopped: is its host down or cut off from the directory, "
                                 "or the process stopped?)")));
  zero.reset();
  std::filesystem::remove_all(dir);

  // Its beat stale but its gone file there: it left, and is not judged.
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, watching));
  write_beat(1);
  ASSERT_TRUE(std::ofstream(std::filesystem::path(dir) / "gone.1"));
  for (const Steady::time_point t = Steady::now(); seconds_since(t) < 3.5;) {
    PS_ASSERT_OK(zero->Failure());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  zero.reset();
  std::filesystem::remove_all(dir);

  // Not watched for 3 s (this rank did not wait on the others then): a stale beat is
  // watched afresh, and judged only once it has stood still for the timeout again.
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, watching));
  write_beat(1);
  PS_ASSERT_OK(zero->Failure());
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const Steady::time_point again = Steady::now();
  absl::Status judged;
  while (judged.ok() && seconds_since(again) < 10) {
    judged = zero->Failure();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_THAT(judged, StatusIs(absl::StatusCode::kAborted, HasSubstr("no sign of life")));
  EXPECT_GE(seconds_since(again), 2.5 - 0.3);
  zero.reset();
  std::filesystem::remove_all(dir);

  // A real process, stopped (SIGSTOP): its lock stays held, its beat stands still.
  PS_ASSERT_OK_AND_ASSIGN(zero, CreateFileBootstrap(dir, 0, 2, watching));
  const pid_t stopped = ForkRankOne(dir, [](Bootstrap& one) {
    if (!one.AllGather("hello", "1").ok()) return 4;  // its heartbeat starts here
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ::raise(SIGSTOP);
    return 5;
  });
  ASSERT_GT(stopped, 0);
  PS_ASSERT_OK_AND_ASSIGN(auto hello, zero->AllGather("hello", "0"));
  EXPECT_THAT(hello, ElementsAre("0", "1"));
  EXPECT_THAT(zero->AllGather("step", "0"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr(absl::StrCat("process 1 (pid ", stopped, " on "))));
  ::kill(stopped, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(stopped, &status, 0), stopped);
  zero.reset();
  std::filesystem::remove_all(dir);
}

// Leaving is not dying: a rank that came to the close exchange stops beating, and its
// gone file may show late (NFS caches a file's absence); the others' Close is not failed
// for it. A beat of an earlier run's directory is called that.
TEST(FileBootstrapTest, ARankThatCameToCloseIsNotJudgedByItsHeartbeat) {
  const std::string dir = FreshDir("closing");
  const BootstrapOptions watching = {.timeout_seconds = 60, .heartbeat_timeout_seconds = 2};
  PS_ASSERT_OK_AND_ASSIGN(auto zero, CreateFileBootstrap(dir, 0, 2, watching));
  const std::filesystem::path root(dir);
  // Rank 1, files only (another host's): its beat, then its close exchange's file.
  ASSERT_TRUE(std::ofstream(root / "beat.1") << "00000000000000000001 4242 node7\n");
  ASSERT_TRUE(std::ofstream(root / "~close.0.1"));
  std::thread late([&root] {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    std::ofstream(root / "gone.1");
  });
  PS_EXPECT_OK(zero->Close());
  late.join();
  EXPECT_FALSE(std::filesystem::exists(dir));
  zero.reset();

  // Rank 1 started before rank 0 joins an earlier run's directory whose rank 0 beat two
  // hours ago (no lock to judge it by: another host's, or no flock).
  std::filesystem::create_directory(root);
  ASSERT_TRUE(std::ofstream(root / "job") << "pipesched-bootstrap 1\nsize 2\n");
  ASSERT_TRUE(std::ofstream(root / "beat.0") << "00000000000000000009 4242 node7\n");
  std::filesystem::last_write_time(
      root / "beat.0", std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  PS_ASSERT_OK_AND_ASSIGN(auto one, CreateFileBootstrap(dir, 1, 2, watching));
  EXPECT_THAT(one->AllGather("step", "1"),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("process 0 (pid 4242 on node7) has shown no sign of life"),
                             HasSubstr("; it last beat 72"),
                             HasSubstr(" s before this process started: is \"" + dir +
                                       "\" an earlier run's? remove it"))));
  one.reset();
  std::filesystem::remove_all(dir);
}

// A heartbeat timeout the looks cannot honour, or no number, is refused.
TEST(FileBootstrapTest, AHeartbeatTimeoutUnder2SecondsIsRefused) {
  const std::string dir = FreshDir("heartbeat_flag");
  for (const double bad : {-1.0, 0.5, 1.9, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()}) {
    EXPECT_THAT(CreateFileBootstrap(dir, 0, 2, {.heartbeat_timeout_seconds = bad}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("the heartbeat timeout must be 0 (not judged) or at least 2 "
                                   "seconds")))
        << bad;
    EXPECT_FALSE(std::filesystem::exists(dir)) << bad;
  }
  PS_ASSERT_OK_AND_ASSIGN(auto off,
                          CreateFileBootstrap(dir, 0, 1, {.heartbeat_timeout_seconds = 0}));
  PS_EXPECT_OK(off->Close());
  // A timeout too large for microseconds in 64 bits is "never", not a wrapped-around 2.5 s.
  PS_ASSERT_OK_AND_ASSIGN(auto never,
                          CreateFileBootstrap(dir, 0, 2, {.heartbeat_timeout_seconds = 1e300}));
  ASSERT_TRUE(std::ofstream(std::filesystem::path(dir) / "beat.1") << "1 4242 node7\n");
  for (const auto start = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - start < std::chrono::milliseconds(3500);) {
    PS_ASSERT_OK(never->Failure());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  never.reset();
  std::filesystem::remove_all(dir);
}

// A launcher marks the job failed for a process that could not say so itself: the
// others stop with that reason; the first marker stays; no job, no marker.
TEST(FileBootstrapTest, ALauncherMarksTheJobFailedForAProcess) {
  const std::string dir = FreshDir("marked");
  PS_EXPECT_OK(MarkFileBootstrapFailed(dir, 1, "killed"));
  EXPECT_FALSE(std::filesystem::exists(dir)) << "a mark made a directory that had no job";
  std::vector<std::unique_ptr<Bootstrap>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    PS_ASSERT_OK_AND_ASSIGN(ranks[r], CreateFileBootstrap(dir, r, 2, {.timeout_seconds = 60}));
  }
  PS_EXPECT_OK(MarkFileBootstrapFailed(dir, 1, "process 1 was killed by signal 9 (Killed)"));
  PS_EXPECT_OK(MarkFileBootstrapFailed(dir, 0, "a later failure"));
  EXPECT_THAT(ranks[0]->AllGather("step", "x"),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 1 failed: process 1 was killed by signal 9 (Killed)")));
  ranks.clear();
  std::filesystem::remove_all(dir);
  // A process that failed after it left the job (its gone file written) fails it no more.
  ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    PS_ASSERT_OK_AND_ASSIGN(ranks[r], CreateFileBootstrap(dir, r, 2, {.timeout_seconds = 60}));
  }
  ASSERT_TRUE(std::ofstream(std::filesystem::path(dir) / "gone.1"));
  PS_EXPECT_OK(MarkFileBootstrapFailed(dir, 1, "exited with code 1 after it closed"));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "failed"));
  PS_EXPECT_OK(ranks[0]->Failure());
  ranks.clear();
  std::filesystem::remove_all(dir);
}

TEST(BootstrapTest, AHugeTimeoutIsNoDeadline) {
  PS_ASSERT_OK_AND_ASSIGN(auto ranks, CreateInProcessBootstraps(2, {.timeout_seconds = 1e10}));
  absl::Status waited;
  std::thread waiter([&] { waited = ranks[0]->AllGather("x", "y").status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ranks[0]->Abort();  // still waiting after 0.1 s: the deadline did not overflow into the past
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted")));
}

// The launch variables as `values` gives them, the others unset, for its lifetime.
class LaunchEnvironment : public pipesched::testing::ScopedEnvironment {
 public:
  explicit LaunchEnvironment(std::map<std::string, std::optional<std::string>> values)
      : ScopedEnvironment(WithTheOthersUnset(std::move(values))) {}

 private:
  static std::map<std::string, std::optional<std::string>> WithTheOthersUnset(
      std::map<std::string, std::optional<std::string>> values) {
    for (const char* name : {kProcessesVariable, kProcessRankVariable, kRendezvousVariable,
                             kRendezvousTimeoutVariable}) {
      values.try_emplace(name, std::nullopt);
    }
    return values;
  }
};

// What `pipesched launch` tells a program it starts: no variables is a process on its
// own (null), the variables make the file bootstrap they describe, and a malformed or
// missing one is named with its value.
TEST(BootstrapTest, TheEnvironmentOfALaunchedProcessMakesItsBootstrap) {
  {
    LaunchEnvironment env({});
    PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Bootstrap> none, CreateBootstrapFromEnvironment());
    EXPECT_EQ(none, nullptr);
  }
  {
    const std::string dir = FreshDir("environment");
    LaunchEnvironment env(
        {{kProcessesVariable, "1"}, {kProcessRankVariable, "0"}, {kRendezvousVariable, dir}});
    PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Bootstrap> one, CreateBootstrapFromEnvironment());
    ASSERT_NE(one, nullptr);
    EXPECT_EQ(one->kind(), "file");
    EXPECT_EQ(one->rank(), 0);
    EXPECT_EQ(one->size(), 1);
    EXPECT_TRUE(std::filesystem::is_directory(dir));
    PS_ASSERT_OK_AND_ASSIGN(auto all, one->AllGather("x", "mine"));
    EXPECT_THAT(all, ElementsAre("mine"));
    PS_EXPECT_OK(one->Close());
    EXPECT_FALSE(std::filesystem::exists(dir));
  }
  {
    // Rank 1 of 2, rank 0 never comes: the variable's timeout is the one waited.
    const std::string dir = FreshDir("environment_timeout");
    LaunchEnvironment env({{kProcessesVariable, "2"},
                           {kProcessRankVariable, "1"},
                           {kRendezvousVariable, dir},
                           {kRendezvousTimeoutVariable, "1"}});
    EXPECT_THAT(CreateBootstrapFromEnvironment({.timeout_seconds = 300}).status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("within 1 s")));
  }
  const std::string dir = FreshDir("environment_bad");
  const std::vector<std::pair<std::map<std::string, std::optional<std::string>>, std::string>> bad =
      {
          {{{kProcessesVariable, "two"}},
           "PIPESCHED_PROCESSES=\"two\" is not a number of processes"},
          {{{kProcessesVariable, "0"}}, "PIPESCHED_PROCESSES=\"0\" is not a number"},
          // As --processes: at most 4096, decimal digits only.
          {{{kProcessesVariable, "2147483647"}},
           "PIPESCHED_PROCESSES=\"2147483647\" is not a number of processes from 1 to 4096, in "
           "decimal digits"},
          {{{kProcessesVariable, " 2"}}, "PIPESCHED_PROCESSES=\" 2\" is not a number"},
          {{{kProcessesVariable, "2"}, {kProcessRankVariable, "+1"}, {kRendezvousVariable, dir}},
           "PIPESCHED_PROCESS_RANK=\"+1\" is not a rank from 0 to 1"},
          {{{kProcessesVariable, "2"},
            {kProcessRankVariable, "1"},
            {kRendezvousVariable, dir},
            {kRendezvousTimeoutVariable, "0x10"}},
           "PIPESCHED_RENDEZVOUS_TIMEOUT=\"0x10\" is not a number of seconds, 1 or more, in "
           "decimal"},
          {{{kProcessesVariable, "2"}, {kRendezvousVariable, dir}},
           "PIPESCHED_PROCESSES is set but PIPESCHED_PROCESS_RANK is not"},
          {{{kProcessesVariable, "2"}, {kProcessRankVariable, "2"}, {kRendezvousVariable, dir}},
           "PIPESCHED_PROCESS_RANK=\"2\" is not a rank from 0 to 1 (PIPESCHED_PROCESSES=2)"},
          {{{kProcessesVariable, "2"}, {kProcessRankVariable, "1"}},
           "PIPESCHED_PROCESSES is set but PIPESCHED_RENDEZVOUS is not"},
          {{{kProcessesVariable, "2"},
            {kProcessRankVariable, "1"},
            {kRendezvousVariable, dir},
            {kRendezvousTimeoutVariable, "-1"}},
           "PIPESCHED_RENDEZVOUS_TIMEOUT=\"-1\" is not a number of seconds, 1 or more"},
          // 0 would wait for ever; the flags refuse under a second too.
          {{{kProcessesVariable, "2"},
            {kProcessRankVariable, "1"},
            {kRendezvousVariable, dir},
            {kRendezvousTimeoutVariable, "0"}},
           "PIPESCHED_RENDEZVOUS_TIMEOUT=\"0\" is not a number of seconds, 1 or more"},
          {{{kProcessesVariable, "2"},
            {kProcessRankVariable, "1"},
            {kRendezvousVariable, dir},
            {kRendezvousTimeoutVariable, "0.5"}},
           "PIPESCHED_RENDEZVOUS_TIMEOUT=\"0.5\" is not a number of seconds, 1 or more"},
      };
  for (const auto& [values, message] : bad) {
    LaunchEnvironment env(values);
    EXPECT_THAT(CreateBootstrapFromEnvironment().status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << message;
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}
}  // namespace
}  // namespace pipesched::comm
